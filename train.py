"""GRPO with rollout-level, advantage-prioritized experience replay: the algorithm, and its
hand-written FSDP2 wrapping.

    python train.py                     # built-in tiny model + arithmetic task, CPU, about a minute
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512 \\
        --prompt-template plain
    torchrun --nproc-per-node 8 train.py --model PATH ...      # one node, 8 GPUs (or CPU processes)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id run1 train.py --model PATH --out-dir /shared/run1 ...   # the same on every node
    python train.py --out-dir runs/x --resume auto   # after a crash: the newest complete checkpoint

Each step of `train()` reads top to bottom:
1. generate  `prompts_per_step` prompts x `group_size` completions from the rollout engine
             (behaviour log-probs kept), each graded by its task's rule (r.correct, verify.grader
             of --train-data: value equality, or builtin_steps' integer-only rule); VIGOR:
             variance-guided group sizes at the same budget (vigor.vigor_generate); DAPO: extra
             rounds for the groups dynamic sampling drops;
2. score     the shaped reward (r.reward: the verdict, with --reward correct+format a format
             term, plus DAPO's overlong penalty), then one
             advantage per rollout from its own group (grpo.py), set once;
3. sample    replayed rollouts from earlier steps (buffer.py: `replay_ratio` x fresh, P(j) ∝
             |A_j|^alpha among those no older than `tau_max` steps; Headroom-Drift: whole groups
             ranked by headroom, gated by drift); every fresh rollout stays in the batch;
4. store     the fresh rollouts, version = this step (after sampling: under a capacity bound, this
             step's rollouts cannot push out the replayable ones; under --overlong-filter the
             truncated ones are not stored);
5. update    `epochs` x `mini_batches` optimizer steps over fresh + replayed (each mini-batch holds
             its share of both; a mu-GRPO stage is one step with a large prompt set and
             mini_batches = mu), micro-batched, each step's loss normaliser fixed before its first
             micro-batch;
6. sync      the engine gets the new weights, so the next step samples from the current policy;
(R²PO, r2po.py: the rollout head samples in 1.; in its head phase, 3.-6. give way to its head step)
then eval every `eval_every` steps, the log line and metrics.jsonl (rank 0), a checkpoint every
`save_every` steps.

Under torchrun: data parallel over prompts (rank r takes every world-th prompt, generates whole
groups, keeps its own replay buffer); FSDP2 shards the model (`shard_model`); the normaliser N is
summed over ranks and each rank's loss multiplied by the world size, so a step equals the 1-rank
step over the same global batch. Under plain `python`: world size 1, no process group, the same code
path. The machinery is named where it is used: parallel.py (collectives, lockstep passes, the step
guard), metrics.py (metrics, log line, files), flags.py (every flag with its help, presets, bounds),
checkpoint.py.

A "step" is one pass of this loop (it may hold several optimizer steps); a rollout's age is step -
version. The ratio of a replayed rollout is pi_theta / pi_behaviour with its logged generation-time
log-probs: the stale policy, which is what makes replay off-policy and what clipping guards. With
`--tis-cap C` the old log-probs are instead recomputed at the start of the step (the proximal
policy) and each token weighted by min(pi_old / pi_behaviour, C).
"""
import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

import buffer
import checkpoint
import data
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import grpo
import metrics as metrics_lib
import parallel
import r2po as r2po_lib
import rollout
import verify
import vigor
import vllm_engine
from flags import Args
from metrics import Metrics
from rollout import Sampling, TorchEngine, forward_logprobs, load_model

# ---- seeds: every random stream of a run comes from --seed here, and nowhere else ----------------


def replay_seed(seed: int, rank: int) -> int:
    return seed + 7_919 * rank                     # each rank's replay buffer draws its own sample


def sampling_seed(seed: int, rank: int, step: int, round_: int) -> int:
    # its own stream per (rank, step, round)
    return seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007


def shuffle_seed(seed: int, step: int, epoch: int) -> int:
    return seed * 1_000_003 + step * 101 + epoch   # the same on every rank


# ---- set-up: process group, model wrapping, the run's parts --------------------------------------

def setup_distributed() -> tuple[int, int, str]:
    """(rank, world_size, device). Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment):
    a process group, nccl with one GPU per process (cuda:LOCAL_RANK) when CUDA is there, gloo on CPU
    otherwise. Under plain `python`: (0, 1, cuda or cpu) and no process group; nothing else in this
    file needs one at world size 1."""
    if "RANK" not in os.environ:
        return 0, 1, "cuda" if torch.cuda.is_available() else "cpu"
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local}, but this machine shows "
                             f"{torch.cuda.device_count()} GPU(s): start at most that many "
                             f"processes per node (--nproc-per-node), or check "
                             f"CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return rank, world, f"cuda:{local}"
    dist.init_process_group("gloo")
    return rank, world, "cpu"


def shard_model(model, device: str):
    """FSDP2 (torch.distributed.fsdp.fully_shard), by hand: each decoder layer is one group (its
    parameters are all-gathered just before its forward and its gradients reduce-scattered right
    after its backward), then the root takes what is left (embeddings, final norm, the tied head).
    On CUDA the gathered parameters are bf16 and gradients are reduced in fp32; the sharded master
    copy, and so AdamW, stays fp32. On CPU everything is fp32.

    Contract with the loss: FSDP *averages* gradients over ranks, while the objective sums over the
    whole step's tokens divided by N = the global normaliser (all ranks); so update() all-reduces N
    and multiplies each rank's loss by the world size. Without a process group (plain `python`) the
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


def precision(device: str, distributed: bool) -> str:
    """How the trainer's forward computes: "fsdp-bf16" under torchrun on CUDA (shard_model's
    policy), "autocast-bf16" in one process on CUDA (bf16 matmuls, fp32 weights and AdamW: the same
    precision without a process group), "fp32" on CPU."""
    if torch.device(device).type != "cuda":
        return "fp32"
    return "fsdp-bf16" if distributed else "autocast-bf16"


def autocast_bf16(model, device_type: str = "cuda"):
    """The model's forward under bf16 autocast (in place; returns the model)."""
    model.forward = torch.autocast(device_type, dtype=torch.bfloat16)(model.forward)
    return model


class Setup(NamedTuple):
    engine: object                        # TorchEngine or vllm_engine.VLLMEngine
    model: torch.nn.Module                # the policy, sharded under torchrun
    ref_model: torch.nn.Module | None     # the KL reference (--kl-coef > 0)
    opt: torch.optim.Optimizer
    replay: object | None                 # buffer.RolloutReplay, buffer.GroupReplay or None
    r2po: r2po_lib.R2PO | None            # R²PO's head and its optimizer (--r2po-head residual)
    precision: str                        # the trainer's forward: fp32 | autocast-bf16 | fsdp-bf16


def setup(args: Args, model, tok, *, rank: int, world: int, device: str, max_len: int) -> Setup:
    """The run's parts. TorchEngine copies the model before sharding; vLLM starts after it (in one
    process it initialises torch.distributed itself) and takes the gathered weights.
    Headroom-Drift's buffer gets the policy's no-grad forward for its drift gate. R²PO's head is
    made last (from the torch seed, the same on every rank) and handed to the engine."""
    ref_model = None
    if args.kl_coef > 0:
        ref_model = load_model(args.model, device)[0].eval().requires_grad_(False)
    engine = TorchEngine(model, tok) if args.engine == "torch" else None    # main() resolved "auto"
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, device).train()
    forward = precision(device, dist.is_initialized())     # before vLLM starts a process group
    if forward == "autocast-bf16":
        model = autocast_bf16(model)               # one GPU: bf16, as torchrun's policy gives
    if engine is None:
        engine = vllm_engine.make_engine("vllm", model, tok, args.model, device,
                                         seed=replay_seed(args.seed, rank), max_model_len=max_len,
                                         distributed=world > 1,
                                         gpu_memory_utilization=args.gpu_memory_utilization)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def policy_logprobs(rollouts):                 # Headroom-Drift's drift forward, in lockstep
        return parallel.lockstep_logprobs(model, rollouts, args.micro_batch_size, args.temperature,
                                          tok.pad_token_id, world, args.micro_batch_tokens)

    replay = buffer.make_replay(args.replay, tau_max=args.tau_max, ratio=args.replay_ratio,
                                alpha=args.priority_alpha, capacity=args.replay_capacity or None,
                                seed=replay_seed(args.seed, rank), headroom=args.hd_headroom,
                                groups=args.hd_groups, candidates=args.hd_candidates,
                                drift_max=buffer.drift_limit(args.hd_drift_frac, args.eps_low,
                                                             args.eps_high),
                                logprobs=policy_logprobs)
    r2po = r2po_lib.make(args, model, device)
    if r2po is not None:
        engine.logits_head = r2po.head               # the engine samples through the trainer's head
    return Setup(engine, model, ref_model, opt, replay, r2po, forward)


# ---- 1. generate and 2. score --------------------------------------------------------------------

def grade(rollouts, grader=verify.grade, form=verify.integer_form) -> None:
    """The verdict of each rollout, r.correct (1.0 = right), by `grader`, and whether it is in the
    answer form, r.formatted, by `form`: generate passes those of the prompt set trained on
    (verify.grader: builtin_steps scores only a plain integer answer, the rest verify.grade;
    verify.format_rule); set once, here."""
    for r in rollouts:
        r.correct = 1.0 if grader(r.text, r.answer) else 0.0
        r.formatted = form(r.text)


def shaped_reward(rollouts, args: Args) -> torch.Tensor:
    """r_i, the reward the advantage is computed from [B]:

        --reward correct:          r = right if correct else wrong
        --reward correct+format:   r = (right if correct else wrong) + (ok if formatted else bad)
        then, with --overlong-buffer, + DAPO's soft overlong penalty

    right, wrong, ok, bad = --reward-right, --reward-wrong, --format-ok, --format-bad (defaults 1,
    0, 1.25, -1: the verdict alone is 1 / 0; R²PO's official reward is right 1, wrong -1 with its
    format term, four outcome classes)."""
    correct = torch.tensor([r.correct for r in rollouts])                            # [B]
    rewards = correct * (args.reward_right - args.reward_wrong) + args.reward_wrong
    if args.reward == "correct+format":
        formatted = torch.tensor([r.formatted for r in rollouts])                    # [B]
        rewards = rewards + torch.where(formatted, args.format_ok, args.format_bad)
    if args.overlong_buffer:
        lengths = torch.tensor([len(r.completion_ids) for r in rollouts])
        penalty = grpo.overlong_penalty(lengths, args.max_new_tokens, args.overlong_buffer)
        rewards = rewards + penalty
    return rewards


def score(rollouts, args: Args) -> torch.Tensor:
    """2. The shaped reward r.reward (shaped_reward), then r.advantage within each group (VIGOR's
    --vigor-weight prompt: times vigor.prompt_weights). Returns the verdicts [B]: DAPO's dynamic
    sampling filters on them, not on the shaped reward."""
    rewards = shaped_reward(rollouts, args)
    adv = grpo.ADVANTAGES[args.adv](rewards, groups(rollouts))                       # [B]
    if args.allocation == "vigor" and args.vigor_weight == "prompt":   # each prompt weighs as one
        adv = adv * torch.tensor(vigor.prompt_weights(rollouts), dtype=adv.dtype)
    for r, reward, a in zip(rollouts, rewards.tolist(), adv.tolist()):
        r.reward = reward
        r.advantage = a
    return torch.tensor([r.correct for r in rollouts])


def groups(rollouts) -> torch.Tensor:
    return torch.tensor([r.prompt_id for r in rollouts])     # [B] the GRPO group of each rollout


def sampling(args: Args, rank: int, step: int, round_: int) -> Sampling:
    """The engine's settings for one generation round; R²PO: through the rollout head."""
    return Sampling(args.temperature, args.top_p, args.max_new_tokens,
                    seed=sampling_seed(args.seed, rank, step, round_),
                    use_head=args.r2po_head == "residual")


def generate(engine, prompts, args: Args, *, step: int, rank: int, round_: int, world: int,
             metrics: Metrics) -> list:
    """1. `group_size` completions per prompt, or VIGOR's variance-guided group sizes at the same
    budget (its rounds seeded round_ + 1, ...; its numbers go to `metrics`), each graded once, by
    the task's rule (verify.grader)."""
    grader, form = verify.grader(args.train_data), verify.format_rule(args.train_data)
    if args.allocation == "fixed":
        s = sampling(args, rank, step, round_)
        new = engine.generate(prompts, args.group_size, s, version=step)
        grade(new, grader, form)
        return new
    budget = (args.vigor_budget or args.prompts_per_step * args.group_size) // world   # this rank's

    def sampling_for(k: int) -> Sampling:
        return sampling(args, rank, step, round_ + k)

    new, _ = vigor.vigor_generate(engine, prompts, sampling_for, step,
                                  lambda rollouts: grade(rollouts, grader, form),
                                  n_init=args.vigor_n_init, n_step=args.vigor_n_step,
                                  top=args.vigor_top, budget=budget, rank=args.vigor_rank,
                                  prior=args.vigor_prior, metrics=metrics)
    return new


def generate_and_score(engine, prompts, mine: list[int], pos: int, args: Args, *, step: int,
                       rank: int, world: int, metrics: Metrics):
    """1. generate and 2. score this rank's `prompts_per_step / world` prompts (`mine[pos:]`,
    wrapping around), with DAPO's extra rounds when dynamic sampling drops groups. Returns (fresh,
    every generated rollout, new pos)."""
    fresh, generated = [], []
    per_rank = args.prompts_per_step // world
    rounds = 1 + (args.dynamic_sampling_rounds if args.dynamic_sampling else 0)
    for round_ in range(rounds):
        need = per_rank - len({r.prompt_id for r in fresh})
        batch_prompts = [prompts[mine[(pos + i) % len(mine)]] for i in range(need)]
        pos += need
        new = generate(engine, batch_prompts, args, step=step, rank=rank, round_=round_,
                       world=world, metrics=metrics)
        correct = score(new, args)
        generated += new
        if args.dynamic_sampling:
            # DAPO: drop all-correct and all-wrong groups, by the verdicts (not the shaped rewards)
            keep = grpo.dynamic_sampling_keep(correct, groups(new)).tolist()
            new = [r for r, k in zip(new, keep) if k]
        fresh += new
        if len({r.prompt_id for r in fresh}) >= per_rank:
            break
    return fresh, generated, pos


# ---- 5. the update -------------------------------------------------------------------------------

def micro_batch_loss(model, ref_model, mb: dict, args: Args, normaliser: float,
                     metrics: Metrics) -> torch.Tensor:
    """The objective of one micro-batch (the recipe at the top of grpo.py); its metrics go to
    `metrics`."""
    logits, logp = forward_logprobs(model, mb, args.temperature)  # [b, T, V], [b, T]
    mask = mb["completion_mask"]                                                   # [b, T]
    old = mb["old_logprobs"]                                                       # [b, T]
    adv = mb["advantages"]                                                         # [b]
    behaviour = mb["behaviour_logprobs"]  # the policy that generated it (= old, unless --tis-cap)
    loss_mask = mask
    if args.veto_scope != "none":            # mu-GRPO's veto, against the behaviour policy
        loss_mask = grpo.veto_mask(logp, behaviour, adv, mask, args.veto_threshold, args.veto_scope)
    veto_frac = 1 - loss_mask.sum() / mask.sum().clamp(min=1)
    eps_low, eps_high = args.eps_low, args.eps_high
    if args.m2po_tau:              # M2PO: the step's mask (optimizer_step), and no eps-clip
        loss_mask, eps_low, eps_high = loss_mask.bool() & mb["m2po_keep"], 1.0, math.inf
    log_w = grpo.log_ratio(args.ratio, logp, old, mask, pnpo_grad=args.pnpo_grad)  # [b, T]
    w_tis = grpo.tis_weight(old, behaviour, args.tis_cap) if args.tis_cap else None
    loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=eps_low, eps_high=eps_high,
                               dual_clip=args.dual_clip or None, agg=args.agg,
                               normaliser=normaliser, token_weight=w_tis)
    n = float(m.pop("loss/tokens"))
    with torch.no_grad():
        entropy = grpo.masked_mean(grpo.entropy_from_logits(logits, args.temperature), mask)
        extra = {"entropy": entropy, "loss/veto_frac": veto_frac}
        if args.m2po_tau:
            masked = (mask.bool() & ~mb["m2po_keep"]).sum().double()
            extra["loss/m2po_masked_frac"] = masked / mask.sum().clamp(min=1)
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = forward_logprobs(ref_model, mb, args.temperature)[1]       # [b, T]
        kl = grpo.kl_penalty(logp, ref_logp, args.kl_estimator)                    # [b, T]
        loss = loss + args.kl_coef * grpo.aggregate(kl, loss_mask, args.agg, normaliser)
        extra["kl"] = grpo.masked_mean(kl.detach(), mask)
    metrics.token_means(m, n, grpo.COMBINE)       # policy_loss's means: over the loss tokens
    metrics.token_means(extra, float(mask.sum()))  # the rest: over every completion token
    metrics.total("loss/tokens", n)
    return loss


@torch.no_grad()
def m2po_keep_masks(model, mbs: list, args: Args, *, pad_id: int, world: int) -> list:
    """M2PO's mask of each micro-batch ([b, T] bool), with one threshold for the whole optimizer
    step: a no-grad forward over the step's micro-batches (in lockstep with the other ranks) at
    the weights the step's gradient is taken at, every rank's (log r_t)^2 gathered, then
    grpo.m2po_threshold of them all. So the mask is the one of the merged step, whatever the
    micro-batching or the world size; the grad pass reuses it rather than recomputing log r."""
    log_w = []
    for mb in parallel.lockstep(mbs, model, pad_id, world, backward=False):
        logp = forward_logprobs(model, mb, args.temperature)[1]                   # [b, T]
        log_w.append(grpo.token_log_ratio(logp, mb["old_logprobs"], mb["completion_mask"]))
    parallel.reshard(model)
    sq = [grpo.m2po_sq(w, mb["completion_mask"]) for w, mb in zip(log_w, mbs)]
    sq = torch.cat(sq) if sq else torch.zeros(0, dtype=torch.float64)
    c = grpo.m2po_threshold(parallel.all_gather_cat(sq, world), args.m2po_tau)
    return [grpo.m2po_keep(w, mb["completion_mask"], args.m2po_tau, c)
            for w, mb in zip(log_w, mbs)]


def optimizer_step(model, ref_model, opt, mbs: list, args: Args, *, normaliser: float, pad_id: int,
                   world: int, guard: parallel.StepGuard, step: int, metrics: Metrics) -> None:
    """One optimizer step: forward/backward over the micro-batches (in lockstep with the other
    ranks), clip, step. M2PO first fixes its mask over all of them (m2po_keep_masks)."""
    if args.m2po_tau:
        keep = m2po_keep_masks(model, mbs, args, pad_id=pad_id, world=world)
        for mb, k in zip(mbs, keep):
            mb["m2po_keep"] = k
    loss = 0.0
    for mb in parallel.lockstep(mbs, model, pad_id, world, backward=True):
        mb_loss = micro_batch_loss(model, ref_model, mb, args, normaliser, metrics)
        # FSDP averages over ranks and N is global: so the sum is the step's gradient
        (mb_loss * world).backward()
        loss += mb_loss.item()
    grad_norm = parallel.clip_gradients(model, args.max_grad_norm)
    if guard.allow(loss, grad_norm, world, step):
        opt.step()
    opt.zero_grad(set_to_none=True)
    metrics.mean("loss/policy", loss * world, 1)       # the whole step's loss: summed over ranks
    metrics.mean("loss/grad_norm", grad_norm, 1)       # the global norm: the same on every rank


def update(model, ref_model, opt, fresh, replayed, args: Args, *, step: int, pad_id: int,
           world: int = 1, guard: parallel.StepGuard | None = None,
           per_update: list | None = None) -> Metrics:
    """5. `epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts
    (mu-GRPO's stage: many), each with the global normaliser fixed first. Returns this rank's
    metrics; each optimizer step's own metrics are also appended to `per_update` when given (train()
    writes them to updates.jsonl)."""
    guard = guard or parallel.StepGuard(args.max_bad_steps)
    metrics, updates = Metrics(), []
    batch = fresh + replayed
    device = next(model.parameters()).device
    size = args.micro_batch_size
    old = None
    if args.tis_cap:  # TIS: the proximal policy's log-probs, recomputed
        old = parallel.lockstep_logprobs(model, batch, size, args.temperature, pad_id, world,
                                         args.micro_batch_tokens)
    for epoch in range(args.epochs):
        seed = shuffle_seed(args.seed, step, epoch) if epoch else None
        for idx in rollout.mini_batches(len(fresh), len(replayed), args.mini_batches, seed):
            mbs = rollout.micro_batches([batch[i] for i in idx], size, pad_id, device,
                                        old_logprobs=old and [old[i] for i in idx],
                                        mask_truncated=args.overlong_filter,
                                        max_tokens=args.micro_batch_tokens)
            normaliser = parallel.global_normaliser(mbs, args.agg, args.max_new_tokens, world)
            if normaliser is None:                     # no rank has a rollout in it: no step
                continue
            updates.append(Metrics())
            optimizer_step(model, ref_model, opt, mbs, args, normaliser=normaliser, pad_id=pad_id,
                           world=world, guard=guard, step=step, metrics=updates[-1])
            metrics.merge(updates[-1])
    metrics.max("stage/updates", len(updates))         # optimizer steps in this loop step
    metrics.max("train/skipped_steps", guard.skipped)
    if per_update is not None:
        per_update += updates
    return metrics


# ---- the loop ------------------------------------------------------------------------------------

def train_step(run: Setup, args: Args, prompts: list, mine: list[int], pos: int, *, step: int,
               rank: int, world: int, pad_id: int, guard: parallel.StepGuard):
    """One pass of the loop, 1. to 6. of the module docstring. Returns (this rank's metrics, the
    fresh rollouts, every generated rollout, the new prompt position, each optimizer step's
    metrics)."""
    engine, model, ref_model, opt, replay, r2po, _ = run
    t0 = time.perf_counter()
    m, per_update = Metrics(), []
    # 1. generate (VIGOR's numbers into m), 2. score
    fresh, generated, pos = generate_and_score(engine, prompts, mine, pos, args, step=step,
                                               rank=rank, world=world, metrics=m)
    if args.check_every and step % args.check_every == 0:     # does the engine hold our weights?
        canary = rollout.logprob_diff(model, generated[:16], args.temperature, pad_id)
        m.mean("rollout/logprob_diff", canary, 1)
        if run.precision == "autocast-bf16":       # what bf16 alone moves: the canary's floor
            floor = rollout.logprob_floor(model, generated[:16], args.temperature, pad_id)
            m.mean("rollout/logprob_floor", floor, 1)
        parallel.reshard(model)                    # the no-grad forward's gathered parameters
    t1 = time.perf_counter()
    engine.sleep()                                 # vLLM on CUDA frees its memory for the update
    if r2po is not None and r2po.phase(step) == "head":   # R²PO: the head learns, the policy waits
        m.merge(r2po.head_step(model, fresh, pad_id, world))
    else:
        replayed = replay.sample(step, len(fresh)) if replay is not None else []      # 3. sample
        if replay is not None:                                                         # 4. store
            replay.add([r for r in fresh if not (args.overlong_filter and r.truncated)], step)
        m.merge(update(model, ref_model, opt, fresh, replayed, args, step=step,       # 5. update
                       pad_id=pad_id, world=world, guard=guard, per_update=per_update))
        engine.load_weights(parallel.full_parameters(model))                          # 6. sync
    t2 = time.perf_counter()
    for key, seconds in (("generate", t1 - t0), ("update", t2 - t1), ("step", t2 - t0)):
        m.max(f"time/{key}", seconds)
    return m, fresh, generated, pos, per_update


def train(args: Args, model, tok, prompts: list, eval_sets: dict, max_len: int, rank: int = 0,
          world: int = 1, device: str = "cpu", resume: str | None = None) -> dict:
    """The loop of the module docstring, from step 0 or from the checkpoint `resume`; returns the
    last step's metrics."""
    torch.manual_seed(args.seed)
    run = setup(args, model, tok, rank=rank, world=world, device=device, max_len=max_len)
    pad_id = tok.pad_token_id
    order = list(range(len(prompts)))
    random.Random(args.seed).shuffle(order)
    mine = order[rank::world]                          # this rank's share of the prompts
    guard = parallel.StepGuard(args.max_bad_steps)
    start, pos = checkpoint.restore(resume, run.model, run.opt, replay=run.replay, guard=guard,
                                    rank=rank, args=args, extra=run.r2po)
    logs = metrics_lib.open_logs(args.out_dir, rank, start, args.tensorboard)
    parallel.print0(f"{json.dumps(dataclasses.asdict(args))}\nworld size {world} | "
                    f"{args.prompts_per_step // world} prompts x {args.group_size} completions "
                    f"per rank per step | device {device} | {run.precision}")

    def evaluate(m: Metrics) -> None:
        eval_lib.evaluate_shard(run.engine, tok, eval_sets, m, top_p=args.top_p, seed=args.seed,
                                max_new_tokens=args.max_new_tokens, rank=rank, world=world)

    if start == 0:                                     # step 0: the model before training
        m = Metrics()
        evaluate(m)
        metrics_lib.write_logs(logs, {"step": 0, **m.reduce(world)})
    row, ckpt = {}, resume
    for step in range(start, args.steps):
        verified = verify.stats()
        m, fresh, generated, pos, per_update = train_step(run, args, prompts, mine, pos, step=step,
                                                          rank=rank, world=world, pad_id=pad_id,
                                                          guard=guard)
        metrics_lib.rollout_metrics(m, fresh, generated)
        buffer.report(run.replay, m)                   # the buffer's state after this step
        if run.r2po is not None:
            run.r2po.report(m, step)
        if (args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.steps:
            evaluate(m)
            if run.r2po is not None:
                base = Sampling(args.temperature, args.top_p, args.max_new_tokens,
                                seed=sampling_seed(args.seed, rank, step, 999))
                run.r2po.base_diversity(run.engine, generated, base, m)
        for key, count in verify.stats().items():     # errors would zero rewards: count them
            m.total(f"verify/{key}", count - verified[key])
        row = {"step": step + 1, **m.reduce(world)}
        per_update_rows = metrics_lib.reduce_all(per_update, world)
        metrics_lib.write_logs(logs, row, generated[:args.log_samples], tok, per_update_rows)
        rollout.check_canary(row.get("rollout/logprob_diff", 0.0), args.max_logprob_diff, step + 1)
        if (args.save_every and (step + 1) % args.save_every == 0) or step + 1 == args.steps:
            ckpt = checkpoint.save(os.path.join(args.out_dir, "checkpoints"), step + 1, run.model,
                                   run.opt, tok, args, guard=guard, replay=run.replay, pos=pos,
                                   rank=rank, world=world, extra=run.r2po)
            parallel.print0(f"saved {ckpt}", flush=True)
    run.engine.close()                                 # vLLM: after the trainer's last collective
    final = ckpt and rank == 0 and checkpoint.point_final(args.out_dir, ckpt)
    metrics_lib.close_logs(logs, row, final)
    return row


def load_run(args: Args, rank: int, world: int, device: str):
    """Everything a run reads before its first step: (resume checkpoint or None, model, tokenizer,
    training prompts, eval sets, vLLM's max_model_len). ValueError / OSError for bad input."""
    args.engine = vllm_engine.engine_kind(args.engine)        # auto -> torch | vllm
    flags.check_args(args, world)
    if args.threads:
        torch.set_num_threads(args.threads)
    needs = (r2po_lib.HEAD_FILE,) if args.r2po_head != "none" else ()
    resume = checkpoint.resolve(args.resume, args.out_dir, world, needs)
    model, tok = load_model(resume or args.model, device)     # resuming: the checkpoint's weights
    name = data.train_split(args.train_data)  # the built-in tasks: their train splits
    template = data.template_for(name, args.prompt_template)
    prompts = data.make_prompts(data.load_benchmark(name, args.data_dir), template, tok)
    args.micro_batch_tokens = flags.micro_batch_tokens(args, model)           # 0: auto
    cuda = torch.device(device).type == "cuda"
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    for warning in flags.check_sizes(args, model, prompts, world, memory):
        parallel.print0(f"warning: {warning}")
    eval_sets = eval_lib.train_eval_sets(args.eval_size, args.eval_benchmarks, args.eval_k,
                                         args.eval_temperature, args.prompt_template, args.data_dir,
                                         args.train_data, args.dev_size)
    eval_prompts = [q for examples, template, *_ in eval_sets.values()
                    for q in data.make_prompts(examples, template, tok)]
    max_len = args.max_new_tokens + max(len(p.ids) for p in prompts + eval_prompts)
    return resume, model, tok, prompts, eval_sets, max_len


def main(argv=None) -> int:
    args = flags.parse(Args, argv, __doc__, presets=flags.PRESETS)
    try:
        rank, world, device = setup_distributed()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        # bad input ends in one line and exit status 2; a bug past this point shows its traceback
        try:
            resume, model, tok, prompts, eval_sets, max_len = load_run(args, rank, world, device)
        except (ValueError, OSError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 2
        if args.resume and not resume:
            where = os.path.join(args.out_dir, "checkpoints")
            parallel.print0(f"--resume auto: no complete checkpoint in {where}; starting at step 0")
        try:
            train(args, model, tok, prompts, eval_sets, max_len, rank, world, device, resume)
            if dist.is_initialized():
                # gloo torn down while another rank still has work in flight can abort
                dist.barrier()
        except (parallel.NonFiniteError, rollout.EngineMismatchError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
