"""GRPO with rollout-level, advantage-prioritized experience replay: the algorithm, and its
hand-written FSDP2 wrapping.

    python train.py                     # built-in tiny model + arithmetic task, CPU, about a minute
    python train.py --model PATH --train-data gsm8k_train --max-new-tokens 512 \\
        --prompt-template plain
    torchrun --nproc-per-node 8 train.py --model PATH ...      # one node, 8 GPUs (or CPU processes)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id run1 train.py --model PATH --out-dir /shared/run1 ...   # the same on every node
    python train.py --out-dir runs/x --resume auto   # after a crash: the newest complete checkpoint

`setup()` binds the flags once: it loads the model, the prompts and the eval sets, and builds the
run's objects, each from its owner's own flags (flags.py composes them): the allocation
(allocation.py: who gets how many completions, graded how, worth what), the objective
(objective.py: the loss over grpo.py's functions), the replay buffer (buffer.py), R²PO (r2po.py,
or None). Below it nothing reads a flag of another owner, and no step branches on a method.

Each step of `train()` reads top to bottom:
1. generate  `prompts_per_step` prompts' completions from the rollout engine (behaviour log-probs
             kept), each graded by the task's rule: `Allocation.generate_and_score` (fixed groups,
             VIGOR's variance-guided sizes, DAPO's refill rounds);
2. score     the shaped reward, then one advantage per rollout from its own group (grpo.py), set
             once (the same call);
3. sample    replayed rollouts from earlier steps (buffer.py: `replay_ratio` x fresh, P(j) ∝
             |A_j|^alpha among those no older than `tau_max` steps; Headroom-Drift: whole groups
             ranked by headroom, gated by drift); every fresh rollout stays in the batch;
4. store     the fresh rollouts the objective trains on, version = this step (after sampling:
             under a capacity bound, this step's rollouts cannot push out the replayable ones);
5. update    `epochs` x `mini_batches` optimizer steps over fresh + replayed (each mini-batch holds
             its share of both; a mu-GRPO stage is one step with a large prompt set and
             mini_batches = mu), micro-batched, each step's loss normaliser fixed before its first
             micro-batch;
6. sync      the engine gets the new weights, so the next step samples from the current policy;
(R²PO: the rollout head samples in 1.; in its head phase, 3.-6. give way to its head step)
then eval every `eval_every` steps, the log line and metrics.jsonl (rank 0), a checkpoint every
`save_every` steps.

Under torchrun: data parallel over prompts (rank r takes every world-th prompt, generates whole
groups, keeps its own replay buffer); FSDP2 shards the model (`shard_model`); the normaliser N is
summed over ranks and each rank's loss multiplied by the world size, so a step equals the 1-rank
step over the same global batch. Under plain `python`: world size 1, no process group, the same code
path. The machinery is named where it is used: parallel.py (collectives, lockstep passes, the step
guard), metrics.py (metrics, log line, files), flags.py (every flag, presets, bounds, sizes),
checkpoint.py.

A "step" is one pass of this loop (it may hold several optimizer steps); a rollout's age is step -
version. The ratio of a replayed rollout is pi_theta / pi_behaviour with its logged generation-time
log-probs: the stale policy, which is what makes replay off-policy and what clipping guards. With
`--tis-cap C` the old log-probs are instead recomputed at the start of the step (the proximal
policy) and each token weighted by min(pi_old / pi_behaviour, C).
"""
import dataclasses
import os
import random
import sys
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

import allocation as allocation_lib
import buffer
import checkpoint
import cli
import data
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import metrics as metrics_lib
import objective as objective_lib
import parallel
import r2po as r2po_lib
import reward_fn
import rollout
import verify
import vigor
import vllm_engine
from flags import Args
from metrics import Metrics
from rollout import Sampling, TorchEngine

# ---- seeds: every random stream of a run comes from --seed here, and nowhere else ----------------


def torch_seed(seed: int) -> int:
    return seed                                    # the global torch RNG (R²PO's head), every rank


def order_seed(seed: int) -> int:
    return seed                                    # the order of the training prompts


def replay_seed(seed: int, rank: int) -> int:
    return seed + 7_919 * rank     # each rank's replay buffer draws its own sample (and vLLM's)


def sampling_seed(seed: int, rank: int, step: int, round_: int) -> int:
    # its own stream per (rank, step, round)
    return seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007


BASE_SAMPLING_ROUND = 999          # R²PO's probe of the base policy at eval: its own round


def shuffle_seed(seed: int, step: int, epoch: int) -> int:
    return seed * 1_000_003 + step * 101 + epoch   # the same on every rank


def eval_seed(seed: int) -> int:
    return seed                                    # the eval's sampling (greedy by default)


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


def precision(device: str, distributed: bool, choice: str = "auto") -> str:
    """How the trainer's forward computes: "fsdp-bf16" under torchrun on CUDA (shard_model's
    policy), "autocast-bf16" in one process on CUDA (bf16 matmuls, fp32 weights and AdamW: the same
    precision without a process group), "fp32" on CPU; --precision bf16 on the CPU:
    "autocast-bf16" there too (and TorchEngine's copy under the same autocast: build)."""
    if torch.device(device).type != "cuda":
        return "autocast-bf16" if choice == "bf16" else "fp32"
    return "fsdp-bf16" if distributed else "autocast-bf16"


def autocast_bf16(model, device_type: str = "cuda"):
    """The model's forward under bf16 autocast (in place; returns the model)."""
    model.forward = torch.autocast(device_type, dtype=torch.bfloat16)(model.forward)
    return model


class Settings(NamedTuple):
    """The flags the loop itself reads, each owner's own part (no `Args` below setup)."""
    run: flags.RunFlags
    optim: flags.OptimFlags
    engine: vllm_engine.Flags
    eval: eval_lib.TrainFlags
    log: metrics_lib.LogFlags


class Run(NamedTuple):
    """Everything `train()` runs on, made once by `setup()`."""
    settings: Settings
    engine: object                        # TorchEngine or vllm_engine.VLLMEngine
    model: torch.nn.Module                # the policy, sharded under torchrun
    opt: torch.optim.Optimizer
    allocation: allocation_lib.Allocation
    objective: objective_lib.Objective
    replay: object | None                 # buffer.RolloutReplay, buffer.GroupReplay or None
    r2po: r2po_lib.R2PO | None            # R²PO's head and its optimizer (--r2po-head residual)
    precision: str                        # the trainer's forward: fp32 | autocast-bf16 | fsdp-bf16
    tok: object
    prompts: list                         # the training prompts
    mine: list[int]                       # this rank's share of them, in the seed's order
    eval_sets: dict                       # eval.train_eval_sets
    resume: str | None                    # the checkpoint to continue from
    flags: dict                           # every flag, as args.json has them
    rank: int
    world: int
    device: str


def load_inputs(run: flags.RunFlags, data_dir: str, *, needs: tuple, world: int, device: str):
    """What a run trains from: (resume checkpoint or None, model, tokenizer, training prompts).
    `needs`: files a checkpoint to resume must hold (R²PO's head). ValueError / OSError for bad
    input."""
    resume = checkpoint.resolve(run.resume, run.out_dir, world, needs)
    model, tok = checkpoint.load_model(resume or run.model, device)   # resuming: its weights
    name = data.train_split(run.train_data)  # the built-in tasks: their train splits
    examples = data.load_benchmark(name, data_dir, run.question_key or None, run.answer_key or None)
    prompts = data.make_prompts(examples, train_template(run, tok), tok)
    return resume, model, tok, prompts


def train_template(run: flags.RunFlags, tok) -> str:
    """The template the training prompts are written in (--prompt-template; auto: data.template_for
    of the train split with this tokenizer), which the task's grader and answer form follow."""
    return data.template_for(data.train_split(run.train_data), run.prompt_template, tok)


def load_evals(run: flags.RunFlags, evals: eval_lib.TrainFlags, tok, prompts: list):
    """(the eval sets, vLLM's max_model_len: the longest prompt, training or eval, plus
    --max-new-tokens)."""
    eval_sets = eval_lib.train_eval_sets(evals.eval_size, evals.eval_benchmarks, evals.eval_k,
                                         evals.eval_temperature, run.prompt_template,
                                         evals.data_dir, run.train_data, evals.dev_size, tok,
                                         keys=(run.question_key, run.answer_key))
    eval_prompts = [q for examples, template, *_ in eval_sets.values()
                    for q in data.make_prompts(examples, template, tok)]
    max_len = run.max_new_tokens + max(len(p.ids) for p in prompts + eval_prompts)
    return eval_sets, max_len


def setup(args: Args, *, rank: int, world: int, device: str) -> Run:
    """Binds the flags once: resolves and checks them, loads what the run reads, prints the first
    screen (the flags that differ from the defaults or the preset, the sizes they derive), then
    hands each owner its own flags (`build`). ValueError / OSError for bad input."""
    changed = flags.changed(args)                  # as given, before anything is resolved
    args = dataclasses.replace(args, engine=vllm_engine.engine_kind(args.engine))  # auto resolved
    flags.check_args(args, world)
    if args.threads:
        torch.set_num_threads(args.threads)
    needs = (r2po_lib.HEAD_FILE,) if args.r2po_head != "none" else ()
    run_flags, eval_flags = cli.part(args, flags.RunFlags), cli.part(args, eval_lib.TrainFlags)
    resume, model, tok, prompts = load_inputs(run_flags, args.data_dir, needs=needs, world=world,
                                              device=device)
    forward = precision(device, dist.is_initialized(), args.precision)  # before vLLM's group
    value_bytes = 4 if forward == "fp32" else 2             # what the activations are kept in
    budget = flags.activation_budget(device)
    sizes = flags.sizes(args, model, world, value_bytes, budget)
    args = dataclasses.replace(args, micro_batch_tokens=sizes.micro_batch_tokens)   # 0 resolved
    flags.check_sizes(args, model, prompts, sizes)
    need, warning = flags.fits_machine(args, model, prompts, world=world, device=device,
                                       value_bytes=value_bytes, budget=budget)
    if warning:
        parallel.print0(f"warning: {warning}")
    eval_sets, max_len = load_evals(run_flags, eval_flags, tok, prompts)
    parallel.print0(metrics_lib.wrap(["flags:", *flags.shown(changed),
                                      "(every flag: args.json in each checkpoint)"],
                                     sep=" ", go_on=" " * len("flags: ")))
    parallel.print0(metrics_lib.wrap([*sizes.fields(), f"device {device}", forward,
                                      f"memory about {need.total / flags.GiB:.1f} GiB a rank"]))
    torch.manual_seed(torch_seed(args.seed))
    order = list(range(len(prompts)))
    random.Random(order_seed(args.seed)).shuffle(order)
    parts = {owner: cli.part(args, owner) for owner in flags.OWNERS}
    objects = build(parts, model, tok, sizes, forward=forward, max_len=max_len, rank=rank,
                    world=world, device=device)
    settings = Settings(run_flags, parts[flags.OptimFlags], parts[vllm_engine.Flags], eval_flags,
                        parts[metrics_lib.LogFlags])
    return Run(settings, *objects, forward, tok, prompts, order[rank::world], eval_sets, resume,
               dataclasses.asdict(args), rank, world, device)


def build(parts: dict, model, tok, sizes: flags.Sizes, *, forward: str, max_len: int, rank: int,
          world: int, device: str) -> tuple:
    """The run's objects, each from its owner's flags (`parts`: {owner class: its flags}):
    (engine, model, optimizer, allocation, objective, replay, R²PO). TorchEngine copies the model
    before sharding; vLLM starts after it (in one process it initialises torch.distributed itself)
    and takes the gathered weights. The model as loaded from --model is loaded once more, frozen,
    when the KL term or R²PO's anchor needs it. R²PO's head is made last (from the torch seed, the
    same on every rank) and handed to the engine."""
    run, optim, obj = parts[flags.RunFlags], parts[flags.OptimFlags], parts[objective_lib.Flags]
    engine_flags, r2po_flags = parts[vllm_engine.Flags], parts[r2po_lib.Flags]
    rewards = reward_fn.make(parts[allocation_lib.Flags].reward_fn, tok)  # checked before all else
    initial = None                        # the model as loaded: the KL reference, R²PO's anchor
    if obj.kl_coef > 0 or r2po_flags.needs_initial:
        initial = checkpoint.load_model(run.model, device)[0].eval().requires_grad_(False)
    engine = TorchEngine(model, tok) if engine_flags.engine == "torch" else None
    if optim.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, device).train()
    if forward == "autocast-bf16":                 # one GPU: bf16, as torchrun's policy gives
        model = autocast_bf16(model, torch.device(device).type)
        if torch.device(device).type == "cpu" and engine is not None:
            autocast_bf16(engine.model, "cpu")     # --precision bf16: sample as the trainer scores
    if engine is None:
        engine = vllm_engine.start_vllm(model, tok, run.model, device,
                                        seed=replay_seed(run.seed, rank), max_model_len=max_len,
                                        distributed=world > 1,
                                        gpu_memory_utilization=engine_flags.gpu_memory_utilization)
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    batching = objective_lib.Batching(optim.micro_batch_size, sizes.micro_batch_tokens,
                                      tok.pad_token_id, device)
    objective = objective_lib.Objective(obj, temperature=run.temperature,
                                        max_len=run.max_new_tokens, batching=batching,
                                        ref_model=initial if obj.kl_coef > 0 else None,
                                        world=world)

    def policy_logprobs(rollouts):                 # Headroom-Drift's drift forward, in lockstep
        return rollout.lockstep_logprobs(model, rollouts, batching.size, run.temperature,
                                         tok.pad_token_id, world, batching.max_tokens)

    replay = buffer.make(parts[buffer.Flags], eps_low=obj.eps_low, eps_high=obj.eps_high,
                         seed=replay_seed(run.seed, rank), logprobs=policy_logprobs)
    shared = r2po_lib.Shared(obj.eps_low, obj.eps_high, obj.agg, run.temperature,
                             run.max_new_tokens, optim.micro_batch_size, sizes.micro_batch_tokens,
                             optim.max_grad_norm, run.group_size)
    r2po = r2po_lib.make(r2po_flags, shared, model, device, initial)
    if r2po is not None:
        engine.logits_head = r2po.head               # the engine samples through the trainer's head
    vigor_flags, template = parts[vigor.Flags], train_template(run, tok)
    vig = None
    if vigor_flags.allocation == "vigor":
        vig = vigor.Vigor(vigor_flags, sizes.vigor_budget)
    alloc = allocation_lib.Allocation(
        parts[allocation_lib.Flags], engine=engine, group_size=run.group_size,
        per_rank=sizes.prompts, vigor=vig,
        sampling=Sampling(run.temperature, run.top_p, run.max_new_tokens,
                          use_head=r2po is not None),
        seed_of=lambda step, round_: sampling_seed(run.seed, rank, step, round_),
        grader=verify.grader(run.train_data, template),
        form=verify.format_rule(run.train_data, template), reward_fn=rewards)
    return engine, model, opt, alloc, objective, replay, r2po


# ---- 5. the update -------------------------------------------------------------------------------

def optimizer_step(model, objective, opt, mbs: list, *, normaliser: float, max_grad_norm: float,
                   pad_id: int, world: int, guard: parallel.StepGuard, step: int,
                   metrics: Metrics) -> None:
    """One optimizer step: the objective's step-wide preparation (M2PO's mask), forward/backward
    over the micro-batches (in lockstep with the other ranks), clip, step."""
    objective.prepare(model, mbs)
    loss = 0.0
    for mb in parallel.lockstep(mbs, model, pad_id, world, backward=True):
        mb_loss = objective.loss(model, mb, normaliser, metrics)
        # FSDP averages over ranks and N is global: so the sum is the step's gradient
        (mb_loss * world).backward()
        loss += mb_loss.item()
    grad_norm = parallel.clip_gradients(model, max_grad_norm)
    if guard.allow(loss, grad_norm, world, step):
        opt.step()
    opt.zero_grad(set_to_none=True)
    metrics.mean("loss/policy", loss * world, 1)       # the whole step's loss: summed over ranks
    metrics.mean("loss/grad_norm", grad_norm, 1)       # the global norm: the same on every rank


def update(model, objective, opt, fresh, replayed, optim: flags.OptimFlags, *, step: int,
           seed: int, pad_id: int, world: int = 1, guard: parallel.StepGuard | None = None,
           per_update: list | None = None) -> Metrics:
    """5. `epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts
    (mu-GRPO's stage: many), each with the global normaliser fixed first. Returns this rank's
    metrics; each optimizer step's own metrics are also appended to `per_update` when given (train()
    writes them to updates.jsonl)."""
    guard = guard or parallel.StepGuard(optim.max_bad_steps)
    metrics, updates = Metrics(), []
    batch = fresh + replayed
    old = objective.proximal_logprobs(model, batch)     # TIS: recomputed; otherwise None
    for epoch in range(optim.epochs):
        order = shuffle_seed(seed, step, epoch) if epoch else None
        for idx in rollout.mini_batches(len(fresh), len(replayed), optim.mini_batches, order):
            mbs = objective.micro_batches([batch[i] for i in idx], old and [old[i] for i in idx])
            normaliser = objective.normaliser(mbs)
            if normaliser is None:                     # no rank has a rollout in it: no step
                continue
            updates.append(Metrics())
            optimizer_step(model, objective, opt, mbs, normaliser=normaliser,
                           max_grad_norm=optim.max_grad_norm, pad_id=pad_id, world=world,
                           guard=guard, step=step, metrics=updates[-1])
            metrics.merge(updates[-1])
    metrics.max("stage/updates", len(updates))         # optimizer steps in this loop step
    metrics.max("train/skipped_steps", guard.skipped)
    if per_update is not None:
        per_update += updates
    return metrics


# ---- the loop ------------------------------------------------------------------------------------

def check_engine(run: Run, generated: list, step: int, m: Metrics) -> None:
    """Every --check-every steps: does the engine hold our weights? rollout/logprob_diff (the
    canary), and under bf16 autocast the floor precision alone gives it."""
    every, temperature = run.settings.engine.check_every, run.settings.run.temperature
    if not every or step % every:
        return
    pad_id = run.tok.pad_token_id
    m.mean("rollout/logprob_diff", rollout.logprob_diff(run.model, generated[:16], temperature,
                                                        pad_id), 1)
    if run.precision == "autocast-bf16":
        floor = rollout.logprob_floor(run.model, generated[:16], temperature, pad_id)
        m.mean("rollout/logprob_floor", floor, 1)
    parallel.reshard(run.model)                    # the no-grad forward's gathered parameters


def train_step(run: Run, pos: int, *, step: int, guard: parallel.StepGuard):
    """One pass of the loop, 1. to 6. of the module docstring. Returns (this rank's metrics, the
    fresh rollouts, every generated rollout, the new prompt position, each optimizer step's
    metrics)."""
    engine, model, replay, r2po = run.engine, run.model, run.replay, run.r2po
    t0 = time.perf_counter()
    m, per_update = Metrics(), []
    # 1. generate and 2. score (VIGOR's numbers into m)
    fresh, generated, pos = run.allocation.generate_and_score(run.prompts, run.mine, pos,
                                                              step=step, metrics=m)
    check_engine(run, generated, step, m)
    t1 = time.perf_counter()
    engine.sleep()                                 # vLLM on CUDA frees its memory for the update
    if r2po is not None and r2po.phase(step) == "head":   # R²PO: the head learns, the policy waits
        m.merge(r2po.head_step(model, fresh, run.tok.pad_token_id, run.world))
    else:
        replayed = replay.sample(step, len(fresh)) if replay is not None else []      # 3. sample
        if replay is not None:                                                         # 4. store
            replay.add([r for r in fresh if run.objective.trains_on(r)], step)
        m.merge(update(model, run.objective, run.opt, fresh, replayed,                 # 5. update
                       run.settings.optim, step=step, seed=run.settings.run.seed,
                       pad_id=run.tok.pad_token_id, world=run.world, guard=guard,
                       per_update=per_update))
        engine.load_weights(parallel.full_parameters(model))                          # 6. sync
    t2 = time.perf_counter()
    for key, seconds in (("generate", t1 - t0), ("update", t2 - t1), ("step", t2 - t0)):
        m.max(f"time/{key}", seconds)
    return m, fresh, generated, pos, per_update


# the step's log line: each component's fields, in this order (metrics.fields)
LOG_LINE = (*metrics_lib.LOG, *objective_lib.LOG, *buffer.LOG, *r2po_lib.LOG, "{time/step:.2f}s",
            eval_lib.log_fields, verify.log_fields)


def train(run: Run) -> dict:
    """The loop of the module docstring, from step 0 or from the checkpoint run.resume; returns the
    last step's metrics."""
    s, rank, world = run.settings, run.rank, run.world
    guard = parallel.StepGuard(s.optim.max_bad_steps)
    start, pos = checkpoint.restore(run.resume, run.model, run.opt, replay=run.replay,
                                    guard=guard, rank=rank, flags=run.flags, extra=run.r2po)
    logs = metrics_lib.open_logs(s.run.out_dir, rank, start, s.log.tensorboard)

    def evaluate(m: Metrics) -> None:
        eval_lib.evaluate_shard(run.engine, run.tok, run.eval_sets, m, top_p=s.run.top_p,
                                seed=eval_seed(s.run.seed), max_new_tokens=s.run.max_new_tokens,
                                rank=rank, world=world)

    if start == 0:                                     # step 0: the model before training
        m = Metrics()
        evaluate(m)
        row = {"step": 0, **m.reduce(world)}
        metrics_lib.write_logs(logs, row, metrics_lib.log_line(row, (eval_lib.log_fields,)))
    row, ckpt = {}, run.resume
    for step in range(start, s.run.steps):
        verified = verify.stats()
        m, fresh, generated, pos, per_update = train_step(run, pos, step=step, guard=guard)
        metrics_lib.rollout_metrics(m, fresh, generated)
        buffer.report(run.replay, m)                   # the buffer's state after this step
        if run.r2po is not None:
            run.r2po.report(m, step)
        if (s.eval.eval_every and (step + 1) % s.eval.eval_every == 0) or step + 1 == s.run.steps:
            evaluate(m)
            if run.r2po is not None:
                base = Sampling(s.run.temperature, s.run.top_p, s.run.max_new_tokens,
                                seed=sampling_seed(s.run.seed, rank, step, BASE_SAMPLING_ROUND))
                run.r2po.base_diversity(run.engine, generated, base, m)
        for key, count in verify.stats().items():     # errors would zero rewards: count them
            m.total(f"verify/{key}", count - verified[key])
        row = {"step": step + 1, **m.reduce(world)}
        per_update_rows = metrics_lib.reduce_all(per_update, world)
        metrics_lib.write_logs(logs, row, metrics_lib.log_line(row, LOG_LINE),
                               generated[:s.log.log_samples], run.tok, per_update_rows)
        rollout.check_canary(row.get("rollout/logprob_diff", 0.0), s.engine.max_logprob_diff,
                             step + 1)
        if (s.run.save_every and (step + 1) % s.run.save_every == 0) or step + 1 == s.run.steps:
            ckpt = checkpoint.save(os.path.join(s.run.out_dir, "checkpoints"), step + 1,
                                   run.model, run.opt, run.tok, run.flags, guard=guard,
                                   replay=run.replay, pos=pos, rank=rank, world=world,
                                   extra=run.r2po)
            parallel.print0(f"saved {ckpt}", flush=True)
    run.engine.close()                                 # vLLM: after the trainer's last collective
    final = ckpt and rank == 0 and checkpoint.point_final(s.run.out_dir, ckpt)
    last = final and metrics_lib.wrap([f"final -> {final}", *eval_lib.log_fields(row)], go_on="  ")
    metrics_lib.close_logs(logs, last)
    return row


def main(argv=None) -> int:
    args = flags.parse(argv, __doc__)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()        # no bars for loading and saving weights in a run's log
    try:     # before the process group: every rank reads out_dir before any rank can write to it
        checkpoint.claim_out_dir(args.out_dir, resume=args.resume, overwrite=args.overwrite)
    except ValueError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        rank, world, device = setup_distributed()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        # bad input ends in one line and exit status 2; a bug past this point shows its traceback
        try:
            run = setup(args, rank=rank, world=world, device=device)
            if args.overwrite:                         # the inputs are good: only now delete
                checkpoint.start_over(args.out_dir, rank)
        except (ValueError, OSError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 2
        if args.resume and not run.resume:
            where = os.path.join(args.out_dir, "checkpoints")
            parallel.print0(f"--resume auto: no complete checkpoint in {where}; starting at step 0")
        try:
            train(run)
            if dist.is_initialized():
                # gloo torn down while another rank still has work in flight can abort
                dist.barrier()
        except (parallel.NonFiniteError, rollout.EngineMismatchError) as e:
            parallel.print0(f"error: {e}", file=sys.stderr)
            return 1
        except reward_fn.RewardFnError as e:         # bad input found mid-run, on this rank
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
