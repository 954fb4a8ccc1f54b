"""GRPO with rollout-level, advantage-prioritized experience replay (arXiv 2606.04560): the
algorithm, and its hand-written FSDP2 wrapping.

    python train.py                     # built-in tiny model + arithmetic task, CPU, about a minute
    torchrun --nproc-per-node 8 train.py --model PATH ...      # data parallel + FSDP2
    python train.py --out-dir runs/x --resume auto   # after a crash: the newest complete checkpoint

The run (`Run`) is built once at the door (run_setup.py: the flags bound, the model, prompts,
engine, optimizer and replay buffer made, the method files' slots filled). Each step of `train()`:
1. generate  `group_size` completions of each of this rank's `prompts_per_step` prompts, with the
             behaviour log-probs (engine.py's engine or vllm_engine.py's);
2. score     each graded (verify.py), its reward shaped, its advantage from its own group
             (grpo.py), set once;
3. sample    replayed rollouts of earlier steps (buffer.py: replay_ratio x fresh, P ∝ |A|^alpha,
             age <= tau_max) and logged ones (logged.py); every fresh rollout stays in the batch;
4. store     this step's rollouts, version = step (after sampling: never replayed in their step);
5. update    the engine asleep: epochs x mini_batches optimizer steps over fresh + replayed
             (rollout.optimizer_steps: micro-batched, the normaliser fixed first), each micro-batch
             loss the clipped surrogate of `micro_batch_loss`;
6. sync      the engine gets the new weights (and wakes);
then eval every `eval_every` steps, the log line and metrics.jsonl, a checkpoint every `save_every`;
the step functions' numbers (metrics.Metrics) are reduced over ranks once a step. A replayed
rollout's ratio is against the policy that generated it (what the clip guards). Under torchrun each
rank takes every world-th prompt and keeps its own buffer; the normaliser is summed over ranks and
each loss multiplied by the world size: a step equals the 1-rank step over the same global batch.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import buffer
import checkpoint
import engine as engine_lib
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import grpo
import logged
import methods
import metrics as metrics_lib
import parallel
import reward_fn
import rollout
import run_setup
import verify
from metrics import Metrics
from rollout import Sampling, StepOut
from run_setup import Run


# ---- 1. generate and 2. score -----------------------------------------------------------------

def generate_and_score(run: Run, pos: int, step: int) -> tuple[list, list, int, Metrics]:
    """1. and 2.: `group_size` completions of each of this rank's next `per_rank` prompts
    (mine[pos:], wrapping around), graded and scored, or the allocate slot's. Returns (fresh,
    every generated rollout, new pos, their numbers and the seconds)."""
    t0 = time.perf_counter()
    if run.per_rank == 0:                          # --prompts-per-step 0: logged rollouts alone
        return [], [], pos, Metrics()
    if "allocate" in run.slots:
        fresh, generated, pos, m = run.slots["allocate"].allocate(run.prompts, run.mine, pos,
                                                                  step=step)
    else:
        prompts = [run.prompts[run.mine[(pos + i) % len(run.mine)]] for i in range(run.per_rank)]
        fresh = generate(run, prompts, run.settings.run.group_size, step, 0)
        score(run, fresh)
        generated, pos, m = list(fresh), pos + run.per_rank, Metrics()
    m.merge(metrics_lib.rollout_metrics(fresh, generated))  # what was generated: its numbers
    m.add(metrics_lib.COMBINE, {"time/generate": time.perf_counter() - t0})
    return fresh, generated, pos, m


def generate(run: Run, prompts: list, n: int, step: int, round_: int) -> list:
    """n completions of each prompt, each graded once (r.correct, r.formatted)."""
    new = run.engine.generate(prompts, n, sampling(run, step, round_), version=step)
    grade(run, new)
    return new


def grade(run: Run, rollouts: list) -> None:
    """The verdict of each rollout, r.correct (1.0 = right), by the task's grader, and whether it
    is in the task's answer form, r.formatted; set once, here."""
    for r in rollouts:
        r.correct = 1.0 if run.grader(r.text, r.answer) else 0.0
        r.formatted = run.form(r.text)


def credit(rollouts: list, f: flags.RewardFlags) -> torch.Tensor:
    """c_i in [0, 1], the verdict's term of the reward [B]:

        --reward correct, correct+format:   c = v,                v = r.correct (1 / 0)
        --reward partial, partial+format:   c = (v + share) / 2,  share = verify.step_share

    share: the share of the response's "=" steps whose value is the gold's, so c is 1 exactly
    when the verdict is right and every step keeps the value; a wrong answer gets c <= 1/2."""
    c = torch.tensor([r.correct for r in rollouts])                                  # [B] v
    if f.reward.startswith("partial"):
        share = torch.tensor([verify.step_share(r.text, r.answer) for r in rollouts])  # [B]
        c = (c + share) / 2
    return c


def score(run: Run, rollouts: list) -> torch.Tensor:
    """2. The reward r.reward and the advantage r.advantage of each rollout, set once:

        r = wrong + (right - wrong) c       c = credit(...): v, or (v + share) / 2
            (--reward-fn: its value in place of this term)
            + (format_ok if formatted else format_bad)      with --reward ...+format
            + a method's terms (the reward slot)
        A = (r - mean_g) / (std_g + 1e-6)   in its own group (grpo.grpo_advantages; or the
                                            advantage slot's)
    Returns the verdicts [B] (not the shaped reward)."""
    f = run.settings.reward
    if run.own_reward is not None:                 # --reward-fn: its values for the verdict's term
        rewards = torch.tensor(run.own_reward(rollouts), dtype=torch.float32)         # [B]
    else:
        rewards = credit(rollouts, f) * (f.reward_right - f.reward_wrong) + f.reward_wrong
    if f.reward.endswith("+format"):
        formatted = torch.tensor([r.formatted for r in rollouts])                    # [B]
        rewards = rewards + torch.where(formatted, f.format_ok, f.format_bad)
    for term in run.slots["reward"]:
        rewards = rewards + term(rollouts)
    advantages = run.slots.get("advantage", grpo.grpo_advantages)
    adv = advantages(rewards, grpo.group_ids(rollouts))                              # [B]
    for r, reward, a in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward = reward
        r.advantage = a
    return torch.tensor([r.correct for r in rollouts])


def sampling(run: Run, step: int, round_: int) -> Sampling:
    """The training rollouts' sampling at (step, round_): its own seed; through the engine's
    logits head when a method gave it one."""
    r = run.settings.run
    return Sampling(r.temperature, r.top_p, r.max_new_tokens,
                    seed=rollout.sampling_seed(r.seed, run.rank, step, round_),
                    use_head=getattr(run.engine, "logits_head", None) is not None)


def canary(run: Run, generated: list, step: int) -> Metrics:
    """Does the engine hold our weights? Every --check-every steps, while the engine sleeps:
    rollout/logprob_diff (engine.canary), and under bf16 autocast the floor precision alone
    gives it."""
    m = Metrics()
    if run.settings.engine.check_every and step % run.settings.engine.check_every == 0:
        found = engine_lib.canary(run.model, generated, run.settings.run.temperature,
                                  run.tok.pad_token_id, run.precision,
                                  max_tokens=run.batching.tokens, world=run.world)
        m.add(engine_lib.COMBINE, found)
    return m


# ---- 5. the update -------------------------------------------------------------------------------

# how the update's numbers combine (metrics.Metrics.add; policy_loss's own: grpo.COMBINE): means
# over the completion tokens (a method's loss keys too: its COMBINE); the loss (each rank's times
# the world size: their mean over ranks is the step's, KL term included) and the gradient norm (the
# same on every rank) as means over the optimizer steps; the updates; the steps skipped so far
COMBINE = {"entropy": "mean tokens", "loss/tis_weight": "mean tokens", "kl": "mean tokens",
           "loss/policy": "mean", "loss/grad_norm": "mean", "stage/updates": "max",
           "train/skipped_steps": "max", **methods.combine()}


def micro_batch_loss(run: Run, mb: dict, normaliser: float) -> tuple[torch.Tensor, Metrics]:
    """The loss of one micro-batch (grpo.py has each function's equation), and its numbers:

        rho_t = pi_theta(y_t) / pi_old(y_t)                      (the token ratio)
        L = (1/N) sum_t max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
            + kl_coef * KL(pi_theta || pi_ref)                   (--kl-coef > 0)
    aggregated by --agg over N, the whole optimizer step's normaliser; pi_old is the behaviour
    policy's (logged at generation), or the trainer's own (update: the pi_old rule), each token
    then weighted with --tis-cap by min(pi_old / pi_behaviour, C) (logged: loss/tis_weight). A
    method may narrow the loss mask, change the clip range or the ratio (the loss slot)."""
    f, hooks, temperature = run.settings.loss, run.hooks, run.settings.run.temperature
    logits, logp = rollout.forward_logprobs(run.model, mb, temperature)  # [b, T, V], [b, T]
    mask, old, adv = mb["completion_mask"], mb["old_logprobs"], mb["advantages"]
    loss_mask, eps, extra = mask, (f.eps_low, f.eps_high), {}
    for restrict in hooks.restrict:
        loss_mask, eps, means = restrict(logp, mb, loss_mask, eps)
        extra.update(means)
    log_w = (hooks.ratio or grpo.token_log_ratio)(logp, old, mask)                   # [b, T]
    w_tis = grpo.tis_weight(old, mb["behaviour_logprobs"], f.tis_cap) if f.tis_cap else None
    loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=eps[0], eps_high=eps[1],
                               dual_clip=f.dual_clip or None, agg=f.agg,
                               normaliser=normaliser, token_weight=w_tis)
    n = m.pop("loss/tokens")                       # a tensor: read at the step's end (Metrics)
    with torch.no_grad():
        entropy = grpo.masked_mean(grpo.entropy_from_logits(logits, temperature), mask)
        extra = {"entropy": entropy, **extra}
        for diagnostics in hooks.diagnostics:
            extra.update(diagnostics(logp, mb, log_w, eps))
        if w_tis is not None:
            extra["loss/tis_weight"] = grpo.masked_mean(w_tis, mask)
    if f.kl_coef > 0:                              # the reference's log-probs: once a step (update)
        kl = grpo.kl_penalty(logp, mb["ref_logprobs"], f.kl_estimator)                  # [b, T]
        loss = loss + f.kl_coef * grpo.aggregate(kl, loss_mask, f.agg, normaliser)
        extra["kl"] = grpo.masked_mean(kl.detach(), mask)
    numbers = Metrics()
    numbers.add(grpo.COMBINE, m, tokens=n)         # policy_loss's means: over the loss tokens
    numbers.add(COMBINE, extra, tokens=mask.sum())  # the rest: over every completion token
    numbers.add(grpo.COMBINE, {"loss/tokens": n})
    return loss, numbers


def optimizer_step(run: Run, mbs, normaliser: float, *, guard: parallel.StepGuard,
                   step: int) -> Metrics:
    """One optimizer step: forward/backward over the micro-batches, clip, step; its numbers."""
    numbers, losses = Metrics(), []                # losses: no host sync before a backward
    for mb in mbs:
        loss, mb_numbers = micro_batch_loss(run, mb, normaliser)
        # FSDP averages over ranks and N is global: so the sum is the step's gradient
        (loss * run.world).backward()
        losses.append(loss.detach())
        numbers.merge(mb_numbers)
    loss = metrics_lib.host_sum(losses)
    grad_norm = parallel.clip_gradients(run.model, run.settings.optim.max_grad_norm)
    if guard.allow(loss, grad_norm, run.world, step):
        run.opt.step()
    run.opt.zero_grad(set_to_none=True)
    numbers.add(COMBINE, {"loss/policy": loss * run.world,   # the whole step's loss: every rank's
                          "loss/grad_norm": grad_norm})      # the global norm: the same on all
    return numbers


def update(run: Run, fresh: list, replayed: list, *, step: int,
           guard: parallel.StepGuard) -> tuple[Metrics, list[Metrics]]:
    """5. `epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts
    (rollout.optimizer_steps: each with the global normaliser N fixed first). pi_old is the
    behaviour log-probs the engine recorded, or the trainer's own forward before the update where
    those cannot serve: with --tis-cap (each token then weighted by min(pi_old / pi_behaviour,
    C)), and for a method's own ratio (a sequence ratio clips at a few 1e-4) unless the engine
    computes as the trainer does (engine.serves_as_old: both fp32). The KL reference's log-probs
    (--kl-coef) are computed once, before the first optimizer step. Returns this rank's numbers
    and each optimizer step's own (updates.jsonl)."""
    f = run.settings.loss
    old = trainer_logprobs(run, run.model, fresh, replayed) if recomputes_old(run) else None
    ref = trainer_logprobs(run, run.initial, fresh, replayed) if f.kl_coef > 0 else None
    batches = rollout.optimizer_steps(run.batching, fresh, replayed, step=step, model=run.model,
                                      old=old, ref=ref, adjust=run.hooks.batch,
                                      prepare=run.hooks.prepare)
    updates = [optimizer_step(run, mbs, n, guard=guard, step=step) for mbs, n in batches]
    numbers = Metrics()
    for u in updates:
        numbers.merge(u)
    numbers.add(COMBINE, {"stage/updates": len(updates),          # in this loop step
                          "train/skipped_steps": guard.skipped})
    return numbers, updates


def recomputes_old(run: Run) -> bool:
    """The pi_old rule (update): the trainer's own forward with --tis-cap, or for a method's own
    ratio where the engine's log-probs cannot serve (engine.serves_as_old)."""
    return run.settings.loss.tis_cap > 0 or (run.hooks.ratio is not None
                                             and not run.engine.serves_as_old(run.precision))


def trainer_logprobs(run: Run, model, fresh: list, replayed: list) -> list:
    """Each rollout's log-probs under `model` (the policy: pi_old; the frozen reference: the KL's),
    without gradient (every rank), in the micro-batches the update's first epoch forms (the same
    shapes: in bf16 another batching rounds otherwise, and the first ratio would not be exactly
    1), in batch order."""
    b, batch = run.batching, fresh + replayed
    old = [None] * len(batch)
    for idx in rollout.mini_batches(len(fresh), len(replayed), b.mini_batches):
        part = rollout.lockstep_logprobs(model, [batch[i] for i in idx], b.rows,
                                         run.settings.run.temperature, b.pad_id, b.world, b.tokens)
        for i, logprobs in zip(idx, part):
            old[i] = logprobs
    return old


# ---- the loop ------------------------------------------------------------------------------------

def train_step(run: Run, pos: int, *, step: int, guard: parallel.StepGuard) -> StepOut:
    """One pass of the loop, 1. to 6. of the module docstring."""
    metrics_lib.status(f"step {step + 1}: generating and scoring", run.rank)  # a terminal only
    fresh, generated, pos, m = generate_and_score(run, pos, step)                # 1. and 2.
    if run.saver is not None:                      # --save-rollouts: this step's fresh rollouts
        run.saver.write(fresh, step)
    if run.own_reward is not None:     # a --reward-fn that raised on a rank: every rank stops
        parallel.stop_together(run.own_reward.error, run.world)
    t1 = time.perf_counter()
    run.engine.sleep(push_follows=True)            # vLLM frees its memory until load_weights
    replay = run.replay
    replayed = replay.sample(step, len(fresh)) if replay is not None else []      # 3. sample
    if run.logged is not None:                     # --rollouts-from: their own pool's draw
        replayed = replayed + run.logged.sample(step, len(fresh) + len(replayed))
    if replay is not None:                                                         # 4. store
        keeps = run.hooks.keeps                    # a method's: which fresh rollouts are stored
        replay.add([r for r in fresh if all(k(r) for k in keeps)] if keeps else fresh, step)
    m.merge(canary(run, generated, step))
    metrics_lib.status(f"step {step + 1}: updating on {len(fresh) + len(replayed)} rollouts",
                       run.rank)
    numbers, updates = update(run, fresh, replayed, step=step, guard=guard)       # 5. update
    m.merge(numbers)
    run.engine.load_weights(parallel.full_parameters(run.model))                  # 6. sync
    m.add(metrics_lib.COMBINE, {"time/update": time.perf_counter() - t1})
    return StepOut(generated, pos, m, updates)


def log_step(run: Run, logs, out: StepOut, *, step: int, verified: dict) -> dict:
    """The buffer's numbers and the verifier's error counts since `verified` into `m`, every rank's
    metrics reduced in one collective, the log files written, the canary checked; returns the
    step's reduced metrics."""
    s, m = run.settings, out.metrics
    buffer.report(run.replay, m)                       # the buffer's state after this step
    if run.logged is not None:                         # --rollouts-from: the pool's numbers
        run.logged.report(m)
    # errors would zero rewards: count them
    m.add(verify.COMBINE, {f"verify/{key}": n - verified[key] for key, n in verify.stats().items()})
    row, *per_update_rows = metrics_lib.reduce_all([m, *out.updates], run.world)
    row = {"step": step + 1, **row}
    metrics_lib.write_logs(logs, row, metrics_lib.log_line(row, LOG_LINE),
                           out.generated[:s.log.log_samples], run.tok, per_update_rows)
    engine_lib.check_canary(row.get("rollout/logprob_diff", 0.0), s.engine.max_logprob_diff,
                            step + 1)
    return row


# the step's log line: each component's fields, in this order (metrics.fields)
LOSS_LOG = ("loss {loss/policy:+.4f}", "clip {loss/clip_frac:.3f}")    # absent without an update
LOG_LINE = (*metrics_lib.LOG, *LOSS_LOG, *buffer.LOG, *logged.LOG, *methods.log_fields(),
            "{time/step:.2f}s", eval_lib.log_fields, verify.log_fields)


def train(run: Run) -> dict:
    """The loop of the module docstring, from step 0 or from the checkpoint run.resume; returns the
    last step's metrics."""
    s, rank, world = run.settings, run.rank, run.world
    guard = parallel.StepGuard(s.optim.max_bad_steps)
    start, pos = checkpoint.restore(run.resume, run.model, run.opt, state=run.state, guard=guard,
                                    rank=rank, flags=run.flags)
    logs = metrics_lib.open_logs(s.run.out_dir, rank, start, s.log.tensorboard)
    # the step slot: a method's wrapper around the step (its schedule, its report), or none
    step_of_run = run.slots["step"].wrap(train_step) if "step" in run.slots else train_step

    def evaluate(m: Metrics) -> None:
        eval_lib.evaluate_shard(run.engine, run.tok, run.eval_sets, m, top_p=s.run.top_p,
                                seed=s.run.seed,
                                max_new_tokens=s.run.max_new_tokens, rank=rank, world=world)

    if start == 0:                                     # step 0: the model before training
        m = Metrics()
        evaluate(m)
        about = eval_lib.eval_sets_about(run.eval_sets, s.run.train_data, s.eval.eval_data)
        row = {"step": 0, **m.reduce(world), "eval_on": about}   # what each accuracy reads
        metrics_lib.write_logs(logs, row, metrics_lib.log_line(row, (eval_lib.log_fields,)))
    row, ckpt = {}, run.resume
    for step in range(start, s.run.steps):
        verified = verify.stats()
        t0 = time.perf_counter()
        out = step_of_run(run, pos, step=step, guard=guard)
        pos = out.pos
        out.metrics.add(metrics_lib.COMBINE, {"time/step": time.perf_counter() - t0})
        if s.eval.due(step, s.run.steps):
            evaluate(out.metrics)
        row = log_step(run, logs, out, step=step, verified=verified)
        if (s.run.save_every and (step + 1) % s.run.save_every == 0) or step + 1 == s.run.steps:
            ckpt = checkpoint.save(os.path.join(s.run.out_dir, "checkpoints"), step + 1,
                                   run.model, run.opt, run.tok, run.flags, guard=guard,
                                   state=run.state, pos=pos, rank=rank, world=world)
            parallel.print0(f"saved {ckpt}", flush=True)
    final = ckpt and rank == 0 and checkpoint.point_final(s.run.out_dir, ckpt)
    last = final and metrics_lib.wrap([f"final -> {final}", *eval_lib.log_fields(row)], go_on="  ")
    metrics_lib.close_logs(logs, last)
    return row


# ---- the hand-written FSDP2 wrapping -------------------------------------------------------------

def shard_model(model, device: str):
    """FSDP2 (torch.distributed.fsdp.fully_shard), by hand: each decoder layer is one group (its
    parameters are all-gathered just before its forward and its gradients reduce-scattered right
    after its backward), then the root takes what is left (embeddings, final norm, the tied head).
    On CUDA the gathered parameters are bf16 and gradients are reduced in fp32; the sharded master
    copy, and so AdamW, stays fp32. On CPU everything is fp32.

    Contract with the loss: FSDP *averages* gradients over ranks, while the objective sums over the
    whole step's tokens divided by N = the global normaliser (all ranks); so N is summed over
    ranks (rollout.optimizer_steps: parallel.global_normaliser) and optimizer_step multiplies each
    rank's loss by the world size. Without a process group (plain `python`) the
    model is returned as it is."""
    if not dist.is_initialized():
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kind = torch.device(device).type
    mesh = init_device_mesh(kind, (dist.get_world_size(),))
    if kind == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


# the loop's steps a method file may call (methods.Steps), handed to the door with Run
STEPS = methods.Steps(sampling=sampling, generate=generate, grade=grade, score=score,
                      credit=credit, generate_and_score=generate_and_score, canary=canary)


def main(argv=None) -> int:
    args = flags.parse(argv, __doc__)
    started = run_setup.start(args.out_dir, args.resume, args.overwrite)   # out dir, process group
    if started is None:
        return 2
    rank, world, device = started
    try:
        # bad input ends in one line and exit status 2; a bug past this point shows its traceback
        try:
            run = run_setup.setup(args, rank=rank, world=world, device=device, shard=shard_model,
                                  steps=STEPS)
        except (ValueError, OSError) as e:
            return parallel.fail(f"error: {e}", 2)
        try:
            train(run)
            if dist.is_initialized():
                # gloo torn down while another rank still has work in flight can abort
                dist.barrier()
        except (parallel.NonFiniteError, engine_lib.EngineMismatchError) as e:
            return parallel.fail(f"error: {e}", 1)
        except parallel.RanksStopped as e:           # bad input found mid-run, every rank stops
            return parallel.fail(f"error: {e}", 2)
        except reward_fn.RewardFnError as e:         # bad input found mid-run, on this rank
            return parallel.fail(f"error: {e}", 2, every_rank=True)
        finally:
            run.engine.close()     # vLLM: after the trainer's last collective, on every exit
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
