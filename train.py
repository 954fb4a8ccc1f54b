"""GRPO with rollout-level, advantage-prioritized experience replay: the algorithm, and its hand-written FSDP2 wrapping.

    python train.py                                    # built-in tiny model + arithmetic task, CPU, about a minute
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512 --prompt-template plain
    torchrun --nproc-per-node 8 train.py --model PATH ...                  # one node, 8 GPUs (or CPU processes)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id run1 train.py
        --model PATH --out-dir /shared/run1 ...        # the same on every node; HOST = any one of them
    python train.py --out-dir runs/x --resume auto     # after a crash: continue from the newest complete checkpoint

Each step of `train()` reads top to bottom:
1. generate  `prompts_per_step` prompts x `group_size` completions from the rollout engine (behaviour log-probs kept);
2. score     each with verify.reward, then one advantage per rollout from its own group (grpo.py), set once;
3. sample    `replay_ratio` x (number of fresh) rollouts from earlier steps, P(j) ∝ |A_j|^alpha among those no older
             than `tau_max` steps (buffer.py, arXiv 2606.04560); every fresh rollout stays in the batch (Headroom-Drift:
             whole earlier groups ranked by headroom, gated by drift, buffer.GroupReplay);
4. store     the fresh rollouts, version = this step (after sampling: under a capacity bound, this step's rollouts
             cannot push out the replayable ones; under --overlong-filter not the truncated ones: they have no loss);
5. update    `epochs` x `mini_batches` optimizer steps over fresh + replayed (each mini-batch holds its share of both;
             a mu-GRPO stage is one step with a large prompt set and mini_batches = mu),
             micro-batched, each step's loss normaliser fixed before its first micro-batch (grpo.loss_normaliser);
6. sync      the engine gets the new weights, so the next step samples from the current policy;
(R²PO, --rollout-head residual: the rollout head samples in 1.; in its phase's steps, 3.-6. give way to head_phase)
then eval every `eval_every` steps, the log line and metrics.jsonl (rank 0), a checkpoint every `save_every` steps.

Under torchrun: data parallel over prompts (rank r takes every world-th prompt, generates whole groups, keeps its own
replay buffer); FSDP2 shards the model (`shard_model`); the normaliser N is summed over ranks and each rank's loss
multiplied by the world size, so a step equals the 1-rank step over the same global batch. Under plain `python`:
world size 1, no process group, the same code path. The machinery (lockstep micro-batches, the non-finite step
guard, metrics, log files) is in parallel.py; the flags (`Args`: every one with its help text), presets and bounds
in flags.py; checkpoints in checkpoint.py.

A "step" is one pass of this loop (it may hold several optimizer steps); a rollout's age is step - version. The ratio
of a replayed rollout is pi_theta / pi_behaviour with its logged generation-time log-probs: the stale policy, which
is what makes replay off-policy and what clipping guards. With `--tis-cap C` the old log-probs are instead recomputed
at the start of the step (the proximal policy) and each token weighted by min(pi_old / pi_behaviour, C).
"""
import dataclasses
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

import buffer
import checkpoint
import data
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import grpo
import parallel
import rollout
import verify
from flags import Args
from rollout import Prompt, Sampling, TorchEngine, forward_logprobs, load_model

# ---- seeds: every random stream of a run comes from --seed here, and nowhere else -----------------------------------

def replay_seed(seed: int, rank: int) -> int:
    return seed + 7_919 * rank                                    # each rank's replay buffer draws its own sample


def sampling_seed(seed: int, rank: int, step: int, round_: int) -> int:
    return seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007   # own stream per (rank, step, round)


def shuffle_seed(seed: int, step: int, epoch: int) -> int:
    return seed * 1_000_003 + step * 101 + epoch                  # the same on every rank


# ---- set-up: process group, model wrapping, data ---------------------------------------------------------------

def setup_distributed() -> tuple[int, int, str]:
    """(rank, world_size, device). Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment): a process group,
    nccl with one GPU per process (cuda:LOCAL_RANK) when CUDA is there, gloo on CPU otherwise. Under plain `python`:
    (0, 1, cuda or cpu) and no process group; nothing else in this file needs one at world size 1."""
    if "RANK" not in os.environ:
        return 0, 1, "cuda" if torch.cuda.is_available() else "cpu"
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return rank, world, f"cuda:{local}"
    dist.init_process_group("gloo")
    return rank, world, "cpu"


def shard_model(model, device: str):
    """FSDP2 (torch.distributed.fsdp.fully_shard), by hand: each decoder layer is one group (its parameters are
    all-gathered just before its forward and its gradients reduce-scattered right after its backward), then the root
    takes what is left (embeddings, final norm, the tied head). On CUDA the gathered parameters are bf16 and gradients
    are reduced in fp32; the sharded master copy, and so AdamW, stays fp32. On CPU everything is fp32.

    Contract with the loss: FSDP *averages* gradients over ranks, while the objective sums over the whole step's
    tokens divided by N = the global normaliser (all ranks); so update() all-reduces N and multiplies each rank's
    loss by the world size. Without a process group (plain `python`) the model is returned as it is."""
    if not dist.is_initialized():
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kind = torch.device(device).type
    mesh = init_device_mesh(kind, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if kind == "cuda" else \
        MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


# ---- 1. generate and 2. score ------------------------------------------------------------------------------------

def score(rollouts, args: Args) -> torch.Tensor:
    """The verifier's verdicts (r.reward, set by generate) plus DAPO's overlong penalty, then advantages within each
    group. Returns the verdicts [B] (1.0 = correct): DAPO's dynamic sampling filters on them, not the shaped reward."""
    correct = torch.tensor([r.reward for r in rollouts])                                        # [B] the verdicts
    rewards = correct
    if args.overlong_buffer:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        rewards = rewards + grpo.overlong_penalty(lengths, args.max_new_tokens, args.overlong_buffer)
    adv = grpo.ADVANTAGES[args.adv](rewards, groups(rollouts))                                  # [B]
    for r, rew, A in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward, r.advantage = rew, A
    return correct


def groups(rollouts) -> torch.Tensor:
    return torch.tensor([r.prompt_id for r in rollouts])                  # [B] the GRPO group of each rollout


def generate(engine, prompts, args: Args, step: int, rank: int, round_: int, world: int, metrics) -> list:
    """1. `group_size` completions per prompt, or VIGOR's variance-guided group sizes at the same budget
    (rollout.vigor_generate, its rounds seeded round_ + 1, ...; its numbers go to `metrics`), each rollout's r.reward
    set to the verifier's verdict (once: VIGOR needs them between its rounds, score() reads them)."""
    sampling = lambda k: Sampling(args.temperature, args.top_p, args.max_new_tokens,     # noqa: E731
                                  seed=sampling_seed(args.seed, rank, step, round_ + k),
                                  rollout_head=args.rollout_head == "residual")          # R²PO: the head samples
    if args.allocation == "fixed":
        new = engine.generate(prompts, args.group_size, sampling(0), version=step)
        set_rewards(new)
        return new
    budget = (args.rollout_budget or args.prompts_per_step * args.group_size) // world   # this rank's share
    new, stats = rollout.vigor_generate(engine, prompts, sampling, step, set_rewards, n_init=args.n_init,
                                        n_step=args.n_step, top=args.vigor_top, budget=budget)
    if metrics is not None:
        metrics.min("vigor/group_size_min", stats.pop("vigor/group_size_min"))
        metrics.max("vigor/group_size_max", stats.pop("vigor/group_size_max"))
        for key, value in stats.items():                       # rounds, mean group size, zero-std share before
            metrics.mean(key, value, len(prompts))
    return new


def set_rewards(rollouts) -> None:
    for r in rollouts:
        r.reward = verify.reward(r.text, r.answer)


def generate_and_score(engine, prompts, mine: list[int], pos: int, args: Args, step: int, rank: int, world: int,
                       metrics: parallel.Metrics | None = None):
    """1. generate and 2. score this rank's `prompts_per_step / world` prompts (`mine[pos:]`, wrapping around), with
    DAPO's extra rounds when dynamic sampling drops groups, or VIGOR's allocation of the same budget (its numbers go
    to `metrics`). Returns (fresh, every generated rollout, new pos)."""
    fresh, generated, per_rank = [], [], args.prompts_per_step // world
    for round_ in range(1 + (args.dynamic_sampling_rounds if args.dynamic_sampling else 0)):
        need = per_rank - len({r.prompt_id for r in fresh})
        batch_prompts = [prompts[mine[(pos + i) % len(mine)]] for i in range(need)]
        pos += need
        new = generate(engine, batch_prompts, args, step, rank, round_, world, metrics)
        correct = score(new, args)
        generated += new
        if args.dynamic_sampling:  # DAPO: drop all-correct / all-wrong groups, by the verdicts (not shaped rewards)
            new = [r for r, k in zip(new, grpo.dynamic_sampling_keep(correct, groups(new)).tolist()) if k]
        fresh += new
        if len({r.prompt_id for r in fresh}) >= per_rank:
            break
    return fresh, generated, pos


def group_drift(model, groups: list, args: Args, pad_id: int, world: int) -> list[float]:
    """3. Headroom-Drift's D(g) = mean over g's rollouts of |mean_t log(pi_theta / pi_behaviour)| per candidate group:
    one no-grad forward over their rollouts, micro-batches in lockstep (equal passes on every rank, also for none)."""
    flat = [r for g in groups for r in g]
    logps = parallel.lockstep_logprobs(model, flat, args.micro_batch_size, args.temperature, pad_id, world)
    per_rollout = iter([abs(sum(a - b for a, b in zip(lp, r.logprobs))) / max(len(lp), 1)
                        for lp, r in zip(logps, flat)])
    return [sum(next(per_rollout) for _ in g) / len(g) for g in groups]


# ---- 5. the update -----------------------------------------------------------------------------------------------

def micro_batch_loss(model, ref_model, mb: dict, args: Args, normaliser: float,
                     metrics: parallel.Metrics) -> torch.Tensor:
    """The objective of one micro-batch (the recipe at the top of grpo.py); its metrics are added to `metrics`."""
    logits, logp = forward_logprobs(model, mb, args.temperature)                                # [b,T,V] [b,T]
    mask, old, adv = mb["completion_mask"], mb["old_logprobs"], mb["advantages"]                     # [b, T] [b]
    behaviour = mb["behaviour_logprobs"]     # the policy that generated the rollout (= old, unless --tis-cap)
    loss_mask = mask if args.veto_scope == "none" else \
        grpo.veto_mask(logp, behaviour, adv, mask, args.veto_threshold, args.veto_scope)   # against the behaviour
    log_w = grpo.log_ratio(args.ratio, logp, old, mask, pnpo_grad=args.pnpo_grad)                   # [b, T]
    w_tis = grpo.tis_weight(old, behaviour, args.tis_cap) if args.tis_cap else None
    loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=args.eps_low, eps_high=args.eps_high,
                               dual_clip=args.dual_clip or None, agg=args.agg, normaliser=normaliser,
                               token_weight=w_tis)
    n = float(m.pop("loss/tokens"))
    with torch.no_grad():
        extra = {"entropy": grpo.masked_mean(grpo.entropy_from_logits(logits, args.temperature), mask),
                 "loss/veto_frac": 1 - loss_mask.sum() / mask.sum().clamp(min=1)}
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = forward_logprobs(ref_model, mb, args.temperature)[1]                         # [b, T]
        kl = grpo.kl_penalty(logp, ref_logp, args.kl_estimator)                                        # [b, T]
        loss = loss + args.kl_coef * grpo.aggregate(kl, loss_mask, args.agg, normaliser)
        extra["kl"] = grpo.masked_mean(kl.detach(), mask)
    metrics.token_means(m, n, grpo.EXTREMES)                     # policy_loss's means: over the loss tokens
    metrics.token_means(extra, float(mask.sum()))                # the rest: over every completion token
    metrics.total("loss/tokens", n)
    return loss


def optimizer_step(model, ref_model, opt, mbs: list, args: Args, normaliser: float, pad_id: int, world: int,
                   guard: parallel.StepGuard, step: int, metrics: parallel.Metrics) -> None:
    """One optimizer step: forward/backward over the micro-batches (in lockstep with the other ranks), clip, step."""
    loss = 0.0
    for mb in parallel.lockstep(mbs, model, pad_id, world, backward=True):
        mb_loss = micro_batch_loss(model, ref_model, mb, args, normaliser, metrics)
        (mb_loss * world).backward()      # FSDP averages over ranks; N is global: the sum is the step's gradient
        loss += mb_loss.item()
    grad_norm = parallel.clip_gradients(model, args.max_grad_norm)
    if guard.allow(loss, grad_norm, world, step):
        opt.step()
    opt.zero_grad(set_to_none=True)
    metrics.mean("loss/policy", loss * world, 1)              # the whole step's loss: summed over ranks
    metrics.mean("loss/grad_norm", grad_norm, 1)              # the global norm: the same on every rank


def update(model, ref_model, opt, fresh, replayed, args: Args, step: int, pad_id: int, world: int = 1,
           guard: parallel.StepGuard | None = None, per_update: list | None = None) -> parallel.Metrics:
    """`epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts (mu-GRPO's stage: many),
    each with the global normaliser fixed first. Returns this rank's metrics; each optimizer step's own metrics are
    also appended to `per_update` when given (train() writes them to updates.jsonl)."""
    guard, metrics, batch = guard or parallel.StepGuard(args.max_bad_steps), parallel.Metrics(), fresh + replayed
    device, size, updates = next(model.parameters()).device, args.micro_batch_size, []
    old = parallel.lockstep_logprobs(model, batch, size, args.temperature, pad_id, world) if args.tis_cap else None
    for epoch in range(args.epochs):
        for idx in buffer.mini_batches(len(fresh), len(replayed), args.mini_batches,  # fresh-anchored
                                       shuffle_seed(args.seed, step, epoch) if epoch else None):
            mbs = rollout.micro_batches([batch[i] for i in idx], size, pad_id, device, old and [old[i] for i in idx],
                                        mask_truncated=args.overlong_filter)   # collated once; TIS: proximal old
            normaliser = parallel.global_normaliser(mbs, args.agg, args.max_new_tokens, world)
            if normaliser is not None:                                 # None: no rank has a rollout in it
                updates.append(parallel.Metrics())
                optimizer_step(model, ref_model, opt, mbs, args, normaliser, pad_id, world, guard, step, updates[-1])
                metrics.merge(updates[-1])
    metrics.max("stage/updates", len(updates))                         # optimizer steps in this loop step
    metrics.max("train/skipped_steps", guard.skipped)
    if per_update is not None:
        per_update += updates
    return metrics


# ---- R²PO: the rollout head's phase ----------------------------------------------------------------------------

def r2po_phase(args: Args, step: int) -> str | None:
    """R²PO's schedule --r2po-schedule 'H,P': H loop steps train the rollout head, then P the policy, and again;
    None without a head. The phase is a function of the step, so a resumed run continues in the same phase."""
    if args.rollout_head == "none":
        return None
    h, p = (int(x) for x in args.r2po_schedule.split(","))
    return "head" if step % (h + p) < h else "policy"


def head_phase(head, head_opt, model, rollouts, args: Args, pad_id: int, world: int) -> parallel.Metrics:
    """R²PO's head phase, one optimizer step of the rollout head with the base frozen (arXiv 2601.11960):

        L = clipped surrogate of pi_rollout / pi_rollout,gen with rarity advantages (grpo.rarity_advantages)
            + r2po_kl_coef * k3 KL(pi_rollout || pi_base)       (the reference is the current base policy)

    on this step's head-sampled rollouts; groups whose rarities are all equal are skipped. The base gets no
    gradient (its forward runs without one), so FSDP joins only the forward passes; the head is replicated, its
    gradients summed over ranks here."""
    metrics, adv = parallel.Metrics(), grpo.rarity_advantages(torch.tensor([r.reward for r in rollouts]),
                                                              groups(rollouts))
    live = {r.prompt_id for r, a in zip(rollouts, adv.tolist()) if a != 0}
    batch = [dataclasses.replace(r, advantage=a) for r, a in zip(rollouts, adv.tolist()) if r.prompt_id in live]
    metrics.mean("r2po/head_groups_used", len(live) / max(len({r.prompt_id for r in rollouts}), 1), 1)
    mbs = rollout.micro_batches(batch, args.micro_batch_size, pad_id, next(head.parameters()).device,
                                [r.head_logprobs for r in batch])           # the ratio's old: the head's at generation
    normaliser = parallel.global_normaliser(mbs, args.agg, args.max_new_tokens, world)
    if normaliser is None:
        return metrics
    head_loss = 0.0
    for mb in parallel.lockstep(mbs, model, pad_id, world, backward=False):
        base_logp, logp = rollout.head_forward(model, head, mb, args.temperature)                  # [b, T] each
        mask = mb["completion_mask"]
        loss, _ = grpo.policy_loss(grpo.token_log_ratio(logp, mb["old_logprobs"], mask), mb["advantages"], mask,
                                   eps_low=args.eps_low, eps_high=args.eps_high, agg=args.agg, normaliser=normaliser)
        kl = grpo.kl_penalty(logp, base_logp, "k3")
        (loss + args.r2po_kl_coef * grpo.aggregate(kl, mask, args.agg, normaliser)).backward()
        head_loss += loss.item()
        metrics.token_means({"r2po/head_kl": grpo.masked_mean(kl.detach(), mask)}, float(mask.sum()))
    metrics.total("r2po/head_loss", head_loss)                       # the step's surrogate, summed over ranks
    parallel.sum_gradients(head, world)
    torch.nn.utils.clip_grad_norm_(head.parameters(), args.max_grad_norm or float("inf"))
    head_opt.step()
    head_opt.zero_grad(set_to_none=True)
    return metrics


def base_diversity(engine, generated, args: Args, step: int, rank: int, metrics: parallel.Metrics) -> None:
    """R²PO at eval: the distinct-answer share of `group_size` completions of this step's prompts sampled from the
    base policy (no head), next to rollout/distinct_answers of the head-sampled ones."""
    prompts = list({r.prompt_id: Prompt(r.prompt_id, r.prompt_ids, r.answer) for r in generated}.values())
    base = engine.generate(prompts, args.group_size, Sampling(args.temperature, args.top_p, args.max_new_tokens,
                                                               seed=sampling_seed(args.seed, rank, step, 999)))
    metrics.mean("r2po/base_distinct_answers", rollout.distinct_answers(base), len(prompts))


# ---- the loop --------------------------------------------------------------------------------------------------

def setup(args: Args, model, tok, rank: int, world: int, device: str, max_len: int):
    """(engine, sharded policy, reference model or None, optimizer, replay buffer or None, R²PO's rollout head and
    its optimizer or None, None). TorchEngine copies the model before sharding; vLLM starts after it (in one process
    it initialises torch.distributed itself) and takes the gathered weights. The head is the same on every rank
    (the same seed) and stays whole; the engine samples with the trainer's own copy."""
    ref_model = load_model(args.model, device)[0].eval().requires_grad_(False) if args.kl_coef > 0 else None
    engine = TorchEngine(model, tok) if args.engine == "torch" else None    # main() resolved "auto"
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, device).train()
    engine = engine or rollout.make_engine("vllm", model, tok, args.model, device, seed=replay_seed(args.seed, rank),
                                           max_model_len=max_len, distributed=world > 1,
                                           gpu_memory_utilization=args.gpu_memory_utilization)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    replay = buffer.make_replay(args.replay, args.tau_max, args.priority_alpha, args.replay_capacity or None,
                                replay_seed(args.seed, rank), headroom=args.headroom, replay_groups=args.replay_groups,
                                drift_candidates=args.drift_candidates, drift_max=args.drift_max)
    head = rollout.ResidualHead(model.config.hidden_size, model.config.vocab_size, args.rollout_head_rank).to(
        device) if args.rollout_head == "residual" else None
    engine.head = head
    head_opt = torch.optim.AdamW(head.parameters(), lr=args.r2po_head_lr) if head is not None else None
    return engine, model, ref_model, opt, replay, head, head_opt


def train(args: Args, model, tok, prompts: list[Prompt], eval_sets: dict, max_len: int, rank: int = 0,
          world: int = 1, device: str = "cpu", resume: str | None = None) -> dict:
    """The loop of the module docstring, from step 0 or from the checkpoint `resume`; returns the last step's
    metrics."""
    torch.manual_seed(args.seed)
    engine, model, ref_model, opt, replay, head, head_opt = setup(args, model, tok, rank, world, device, max_len)
    order = list(range(len(prompts)))
    random.Random(args.seed).shuffle(order)
    mine, guard = order[rank::world], parallel.StepGuard(args.max_bad_steps)     # this rank's share of the prompts
    start, pos = checkpoint.restore(resume, model, opt, replay, guard, rank, args, head, head_opt)
    logs = parallel.open_logs(args.out_dir, rank, start, args.tensorboard)
    parallel.print0(f"{json.dumps(dataclasses.asdict(args))}\nworld size {world} | {args.prompts_per_step // world} "
                    f"prompts x {args.group_size} completions per rank per step | device {device}")
    if start == 0:                                       # step 0: the model before training
        eval_lib.evaluate_shard(engine, tok, eval_sets, m := parallel.Metrics(), top_p=args.top_p, seed=args.seed,
                                max_new_tokens=args.max_new_tokens, rank=rank, world=world)
        parallel.write_logs(logs, {"step": 0, **m.reduce(world)})

    row, ckpt = {}, resume
    for step in range(start, args.steps):
        t0, verified = time.perf_counter(), verify.stats()
        fresh, generated, pos = generate_and_score(engine, prompts, mine, pos, args, step, rank, world,   # 1., 2.
                                                   gen := parallel.Metrics())               # (VIGOR's numbers)
        canary = rollout.logprob_diff(model, generated[:16], args.temperature, tok.pad_token_id) \
            if args.check_every and step % args.check_every == 0 else None   # does the engine hold our weights?
        t1 = time.perf_counter()
        engine.sleep()                                   # vLLM on CUDA frees its memory while the trainer updates
        replayed, per_update, phase = [], [], r2po_phase(args, step)
        if phase == "head":                                      # R²PO: the rollout head learns, the policy waits
            m = head_phase(head, head_opt, model, fresh, args, tok.pad_token_id, world)
        else:
            if replay is not None:                                                                     # 3. sample
                replayed = replay.sample(step, lambda g: group_drift(model, g, args, tok.pad_token_id, world)) \
                    if args.replay == "headroom-drift" else replay.sample(round(args.replay_ratio * len(fresh)), step)
                replay.add([r for r in fresh if not (args.overlong_filter and r.truncated)], step)     # 4. store
            m = update(model, ref_model, opt, fresh, replayed, args, step, tok.pad_token_id, world, guard,  # 5.
                       per_update)                               # mu-GRPO: a stage = one step, many optimizer steps
            engine.load_weights(parallel.full_parameters(model))                                       # 6. sync
        t2 = time.perf_counter()
        parallel.step_metrics(m, fresh, generated, replay, gen, canary, {"generate": t1 - t0, "update": t2 - t1,
                                                                         "step": t2 - t0})
        if phase is not None:
            m.max("r2po/phase", float(phase == "policy"))                  # 0 = the head's phase, 1 = the policy's
        if (args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.steps:
            eval_lib.evaluate_shard(engine, tok, eval_sets, m, top_p=args.top_p, seed=args.seed,      # eval
                                    max_new_tokens=args.max_new_tokens, rank=rank, world=world)
            if head is not None:
                base_diversity(engine, generated, args, step, rank, m)
        for key, count in verify.stats().items():      # this step's scoring and eval: errors would zero rewards
            m.total(f"verify/{key}", count - verified[key])
        row = {"step": step + 1, **m.reduce(world)}
        parallel.write_logs(logs, row, generated[:args.log_samples], tok, parallel.reduce_all(per_update, world))
        rollout.check_canary(row.get("rollout/logprob_diff", 0.0), args.max_logprob_diff, step + 1)
        if (args.save_every and (step + 1) % args.save_every == 0) or step + 1 == args.steps:
            ckpt = checkpoint.save(os.path.join(args.out_dir, "checkpoints"), step + 1, model, opt, tok, args, guard,
                                   replay, pos, rank, world, head, head_opt)
            parallel.print0(f"saved {ckpt}", flush=True)
    engine.close()                                       # vLLM: after the trainer's last collective
    parallel.close_logs(logs, row, ckpt and rank == 0 and checkpoint.point_final(args.out_dir, ckpt))
    return row


def main(argv=None) -> int:
    args = flags.parse(Args, argv, __doc__, presets=flags.PRESETS)
    rank, world, device = setup_distributed()
    try:
        try:  # bad input ends in one line and exit status 2; a bug past this point still shows its traceback
            args.engine = rollout.engine_kind(args.engine)      # auto -> torch | vllm
            flags.check_args(args, world)
            if args.threads:
                torch.set_num_threads(args.threads)
            resume = checkpoint.resolve(args.resume, args.out_dir, world, args.rollout_head != "none")
            model, tok = load_model(resume or args.model, device)   # resuming: the checkpoint's weights
            name = data.train_split(args.train_data)           # the built-in tasks: their train splits
            prompts = data.make_prompts(data.load_benchmark(name, args.data_dir),
                                        data.template_for(name, args.prompt_template), tok)
            flags.check_sizes(args, model, prompts, world)
            eval_sets = eval_lib.train_eval_sets(args.eval_size, args.eval_benchmarks, args.eval_k,
                                                 args.eval_temperature, args.prompt_template, args.data_dir,
                                                 args.train_data)
            max_len = args.max_new_tokens + max(len(p.ids) for p in prompts + [  # vLLM's max_model_len
                q for examples, template, _, _ in eval_sets.values()
                for q in data.make_prompts(examples, template, tok)])
        except (ValueError, OSError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 2
        if args.resume and not resume:
            parallel.print0(f"--resume auto: no complete checkpoint in {os.path.join(args.out_dir, 'checkpoints')}; "
                   f"starting from step 0")
        try:
            train(args, model, tok, prompts, eval_sets, max_len, rank, world, device, resume)
            if dist.is_initialized():
                dist.barrier()       # gloo torn down while another rank still has work in flight can abort
        except (parallel.NonFiniteError, rollout.EngineMismatchError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
