"""The door: what binds the flags and builds a run before train.py's loop starts.

    run = run_setup.setup(args, rank=rank, world=world, device=device,
                          shard=train.shard_model, steps=train.STEPS)

`setup()` binds the flags once: it resolves and checks them, loads the model, the prompts and the
eval sets, prints the first screen, then `build` hands each owner its own flags: the engine, the
optimizer, the replay buffer, the update's batching, and the slots the method files fill
(methods/__init__.py). It returns the record it builds, `Run`, which the loop carries. The loop
sits a floor above this module (imports point one way), so train.py hands in its FSDP2 wrapping
(`shard`, train.shard_model) and the step functions a method file may call (`steps`,
methods.Steps). No function below `setup` takes the flags whole.

Also here: the seeds the door uses (the loop's own streams, sampling and shuffling, are
rollout.py's, from the same --seed), the process group (`setup_distributed`) and how the trainer's
forward computes (`precision`).
"""
import dataclasses
import os
import random
import sys
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

import buffer
import checkpoint
import cli
import data
import engine as engine_lib
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import logged
import memory
import methods
import metrics as metrics_lib
import parallel
import reward_fn
import rollout
import verify
import vllm_engine
from engine import TorchEngine
from flags import Args

# ---- seeds: the door's random streams, from --seed (the loop's own are rollout.py's) -----------

def replay_seed(seed: int, rank: int) -> int:
    return seed + 7_919 * rank     # each rank's replay buffer draws its own sample (and vLLM's)


# ---- the out dir, the process group and the precision --------------------------------------------

def start(out_dir: str, resume: str, overwrite: bool) -> tuple[int, int, str] | None:
    """(rank, world_size, device) once out_dir is claimed for --resume / --overwrite
    (checkpoint.claim_out_dir, before the process group: every rank reads out_dir before any rank
    can write to it) and the process group is up (setup_distributed); None after one "error:"
    line (rank 0's alone for out_dir, which every rank refuses alike), also written where
    torchrun's summary reads it (parallel.record_error)."""
    try:
        checkpoint.claim_out_dir(out_dir, resume=resume, overwrite=overwrite)
    except ValueError as e:
        line = cli.relative_paths(f"error: {e}")
        if os.environ.get("RANK", "0") == "0":
            print(line, file=sys.stderr)
        parallel.record_error(line)               # torchrun's summary shows the one line
        return None
    try:
        return setup_distributed()
    except ValueError as e:
        parallel.fail(f"error: {e}", 2, every_rank=True)
        return None


def setup_distributed() -> tuple[int, int, str]:
    """(rank, world_size, device). Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment):
    a process group, nccl with one GPU per process (cuda:LOCAL_RANK) when CUDA is there, gloo on CPU
    otherwise. Under plain `python`: (0, 1, cuda or cpu) and no process group; nothing in the loop
    needs one at world size 1."""
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


def precision(device: str, distributed: bool, choice: str = "auto") -> str:
    """How the trainer's forward computes: "fsdp-bf16" under torchrun on CUDA (train.shard_model's
    policy), "autocast-bf16" in one process on CUDA (bf16 matmuls, fp32 weights and AdamW: the same
    precision without a process group), "fp32" on CPU; --precision bf16 on the CPU:
    "autocast-bf16" there too (and TorchEngine's copy under the same autocast: build)."""
    if torch.device(device).type != "cuda":
        return "autocast-bf16" if choice == "bf16" else "fp32"
    return "fsdp-bf16" if distributed else "autocast-bf16"


def frozen_dtype(device: str) -> torch.dtype:
    """The dtype a frozen copy (the KL reference, a method's initial model) is loaded in on
    `device`: bf16 on CUDA, where the policy's forward computes in bf16 too (in fp32 its no-grad
    forward cost about 4x the policy's bf16 forward and backward, and twice the memory); fp32 on
    the CPU, whatever --precision (as before: CPU runs unchanged)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def autocast_bf16(model, device_type: str = "cuda"):
    """The model's forward under bf16 autocast (in place; returns the model)."""
    model.forward = torch.autocast(device_type, dtype=torch.bfloat16)(model.forward)
    return model


# ---- the run's parts -----------------------------------------------------------------------------

class Settings(NamedTuple):
    """The flags the loop and the method files read, each owner's own part (no `Args` past the
    door)."""
    run: flags.RunFlags
    optim: flags.OptimFlags
    reward: flags.RewardFlags
    loss: flags.LossFlags
    replay: buffer.Flags
    engine: vllm_engine.Flags
    eval: eval_lib.TrainFlags
    log: metrics_lib.LogFlags


@dataclass
class Run:
    """Everything the loop runs on, made once here (`build`, then `fill_slots` from the slots the
    method files return): every step function of train.py takes it, and the method files' make()
    reads it through a read-only view (methods.ReadOnly), so none changes it."""
    settings: Settings                    # each owner's flags: run, optim, reward, loss, ...
    engine: object                        # engine.TorchEngine or vllm_engine.VLLMEngine
    model: torch.nn.Module                # the policy, sharded under torchrun
    opt: torch.optim.Optimizer
    replay: object | None                 # buffer.RolloutReplay, a method's, or None
    initial: torch.nn.Module | None       # the model as loaded, frozen (KL reference, a method's)
    precision: str                        # the trainer's forward: fp32 | autocast-bf16 | fsdp-bf16
    tok: object
    prompts: list                         # the training prompts
    mine: list[int]                       # this rank's share of them, in the seed's order
    per_rank: int                         # prompts this rank generates groups for each step
    completions: int                      # its completions a step when a method allocates them
    micro_batch: tuple[int, int]          # (rows, padded tokens) per forward at most
    batching: rollout.Batching            # how the update's rollouts become optimizer steps
    grader: object                        # verify.grader of the training set: (text, gold) -> bool
    form: object                          # verify.format_rule: (text) -> in the answer form?
    own_reward: object | None             # --reward-fn's (reward_fn.make): rollouts -> [float]
    eval_sets: dict                       # eval.train_eval_sets
    resume: str | None                    # the checkpoint to continue from
    flags: dict                           # every flag, as args.json has them
    rank: int
    world: int
    device: str
    slots: dict = field(default_factory=dict)   # what the method files fill (methods.build)
    hooks: methods.LossHooks = methods.NO_LOSS_HOOKS   # the loss slot's methods
    state: dict = field(default_factory=dict)   # {name: object with state}: checkpoints keep it
    logged: object | None = None          # --rollouts-from: logged.LoggedPool, else None
    saver: object | None = None           # --save-rollouts: logged.Saver, else None


def load_inputs(run: flags.RunFlags, evals: eval_lib.TrainFlags, *, world: int, device: str):
    """What a run trains from: (resume checkpoint or None, model, tokenizer, training prompts);
    a file's rows that the eval holds out are not trained on (eval.training_examples).
    ValueError / OSError for bad input."""
    resume = checkpoint.resolve(run.resume, run.out_dir, world)
    model, tok = checkpoint.load_model(resume or run.model, device)   # resuming: its weights
    name = data.train_split(run.train_data)  # the built-in tasks: their train splits
    examples = data.load_benchmark(name, evals.data_dir, run.question_key or None,
                                   run.answer_key or None)
    examples = eval_lib.training_examples(examples, run.train_data, evals.eval_data,
                                          evals.eval_size, evals.dev_size)
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
                                         keys=(run.question_key, run.answer_key),
                                         eval_data=evals.eval_data)
    eval_prompts = [q for examples, template, *_ in eval_sets.values()
                    for q in data.make_prompts(examples, template, tok)]
    max_len = run.max_new_tokens + max(len(p.ids) for p in prompts + eval_prompts)
    return eval_sets, max_len


def setup(args: Args, *, rank: int, world: int, device: str, shard, steps: methods.Steps) -> Run:
    """Binds the flags once: resolves and checks them, loads what the run reads, prints the first
    screen (the flags that differ from the defaults or the preset, the sizes they derive), then
    hands each owner its own flags (`build`); with --overwrite, the inputs being good, deletes the
    earlier run in out_dir (checkpoint.start_over). Returns the run it builds (`Run`).
    ValueError / OSError for bad input."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()        # no bars for loading and saving weights in a run's log
    changed = flags.changed(args)                  # as given, before anything is resolved
    flags.check_args(args, world)                  # a method's rules first: no engine started yet
    slow = flags.bf16_cpu_warning(args.precision, device)
    if slow and not args.allow_slow_bf16:
        raise ValueError(f"{slow}: add --allow-slow-bf16")            # else fp32, the default
    if slow:
        parallel.print0(f"warning: {slow}")
    engine = vllm_engine.choose_engine(args.engine, cuda=torch.device(device).type == "cuda",
                                       needs_torch=flags.torch_engine_needed(args))
    if engine.warning:
        parallel.print0(f"warning: {engine.warning}")
    args = dataclasses.replace(args, engine=engine.kind)                          # auto resolved
    if args.threads:
        torch.set_num_threads(args.threads)
    run_flags, eval_flags = cli.part(args, flags.RunFlags), cli.part(args, eval_lib.TrainFlags)
    resume, model, tok, prompts = load_inputs(run_flags, eval_flags, world=world, device=device)
    forward = precision(device, dist.is_initialized(), args.precision)  # before vLLM's group
    value_bytes = 4 if forward == "fp32" else 2             # what the activations are kept in
    initial = flags.needs_initial(args)            # a frozen copy of the model as loaded
    resolved, sizes, need, warning = resolve_memory(
        {owner: cli.part(args, owner) for owner in flags.OWNERS}, model, prompts, initial=initial,
        world=world, device=device, value_bytes=value_bytes)
    args = dataclasses.replace(args, **resolved)                     # 0 (auto) resolved
    if warning:
        parallel.print0(f"warning: {warning}")
    eval_sets, max_len = load_evals(run_flags, eval_flags, tok, prompts)
    parallel.print0(metrics_lib.wrap(["flags:", *flags.shown(changed),
                                      "(every flag: args.json in each checkpoint)"],
                                     sep=" ", go_on=" " * len("flags: ")))
    parallel.print0(metrics_lib.wrap([*sizes.fields(), f"device {device}", forward,
                                      f"engine {engine.kind} ({engine.why})",
                                      f"memory about {need.total / memory.GiB:.1f} GiB a rank"]))
    for key, what in eval_lib.eval_sets_about(eval_sets, run_flags.train_data,
                                              eval_flags.eval_data).items():
        parallel.print0(f"eval/{key}: {what}")
    torch.manual_seed(args.seed)                   # the global torch RNG (a method's own weights)
    order = list(range(len(prompts)))
    random.Random(args.seed).shuffle(order)        # the order of the training prompts
    parts = {owner: cli.part(args, owner) for owner in flags.OWNERS}
    template = train_template(run_flags, tok)
    given = dict(prompts=prompts, mine=order[rank::world], eval_sets=eval_sets, resume=resume,
                 grader=verify.grader(run_flags.train_data, template),
                 form=verify.format_rule(run_flags.train_data, template),
                 flags=dataclasses.asdict(args))
    run = build(parts, model, tok, sizes, forward=forward, max_len=max_len, rank=rank,
                world=world, device=device, initial=initial, shard=shard, steps=steps, **given)
    if args.overwrite:                             # the inputs are good: only now delete
        checkpoint.start_over(args.out_dir, rank)
    if args.resume and not resume:
        where = os.path.join(args.out_dir, "checkpoints")
        parallel.print0(f"--resume auto: no complete checkpoint in {where}; starting at step 0")
    return run


def memory_asked(parts: dict, initial: bool) -> memory.Asked:
    """What the flags ask of the memory (memory.Asked), from the owners' flags (`parts`: {owner
    class: its flags}): the four owners' memory.py reads, a method's completions a step (VIGOR's
    budget: its `completions`), whether a frozen copy of the model is kept (--kl-coef > 0, or a
    method's anchor: `initial`, flags.needs_initial)."""
    run = parts[flags.RunFlags]
    completions = max((parts[o].completions(run.prompts_per_step, run.group_size)
                       for o in methods.owners() if hasattr(parts[o], "completions")), default=0)
    return memory.Asked(run, parts[flags.OptimFlags], parts[vllm_engine.Flags],
                        parts[eval_lib.TrainFlags], completions=completions,
                        frozen=parts[flags.LossFlags].kl_coef > 0 or initial)


def resolve_memory(parts: dict, model, prompts: list, *, initial: bool, world: int, device: str,
                   value_bytes: int) -> tuple[dict, memory.Sizes, memory.Memory, str | None]:
    """({flag: value}: --micro-batch-tokens and --gpu-memory-utilization, 0 (auto) resolved, the
    sizes, the memory estimate, a warning or None): memory.resolve_sizes on what the flags ask of
    it (memory_asked), a frozen copy in frozen_dtype's bytes."""
    asked, sizes, need, warning = memory.resolve_sizes(
        memory_asked(parts, initial), model, prompts, world=world, device=device,
        value_bytes=value_bytes, frozen_bytes=frozen_dtype(device).itemsize)
    resolved = {"micro_batch_tokens": asked.optim.micro_batch_tokens,
                "gpu_memory_utilization": asked.engine.gpu_memory_utilization}
    return resolved, sizes, need, warning


def build(parts: dict, model, tok, sizes: memory.Sizes, *, forward: str, max_len: int, rank: int,
          world: int, device: str, initial: bool, shard, steps: methods.Steps, **given) -> Run:
    """The run's objects, each from its owner's flags (`parts`: {owner class: its flags}), then
    the slots the method files fill (methods.build, handed the run and `steps`). TorchEngine copies
    the model before `shard` wraps it; vLLM starts after (in one process it initialises
    torch.distributed itself) and takes the gathered weights. The model as loaded from --model is
    loaded once more, frozen, when the KL term or a method needs it (`initial`): in bf16 on CUDA
    (frozen_dtype) and sharded as the policy is (its forwards join the lockstep passes).
    Resuming, the checkpoint must keep the state of every object that has one
    (checkpoint.check_state)."""
    s = Settings(*(parts[o] for o in (flags.RunFlags, flags.OptimFlags, flags.RewardFlags,
                                      flags.LossFlags, buffer.Flags, vllm_engine.Flags,
                                      eval_lib.TrainFlags, metrics_lib.LogFlags)))
    # --reward-fn, checked before all else; a call that raises is held, so the ranks stop together
    own_reward = reward_fn.make(s.reward.reward_fn, tok, hold=True)
    frozen = None                         # the model as loaded: the KL reference, a method's
    if s.loss.kl_coef > 0 or initial:
        frozen = checkpoint.load_model(s.run.model, device, frozen_dtype(device))[0]
        frozen = shard(frozen.eval().requires_grad_(False), device)  # as the policy, under torchrun
    engine = TorchEngine(model, tok) if s.engine.engine == "torch" else None
    if s.optim.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard(model, device).train()
    if forward == "autocast-bf16":                 # one GPU: bf16, as torchrun's policy gives
        model = autocast_bf16(model, torch.device(device).type)
        if torch.device(device).type == "cpu" and engine is not None:
            autocast_bf16(engine.model, "cpu")     # --precision bf16: sample as the trainer scores
            engine.autocast = True
    if engine is None:
        # the completions of one generate call: vLLM sizes its buffers for no more
        sequences = sizes.completions or sizes.prompts * sizes.group_size
        engine = vllm_engine.start_vllm(model, tok, s.run.model, device,
                                        seed=replay_seed(s.run.seed, rank), max_model_len=max_len,
                                        distributed=world > 1,
                                        gpu_memory_utilization=s.engine.gpu_memory_utilization,
                                        sequences=sequences)
    opt = torch.optim.AdamW(model.parameters(), lr=s.optim.lr, weight_decay=s.optim.weight_decay)
    replay = buffer.make(s.replay, seed=replay_seed(s.run.seed, rank))
    batching = rollout.Batching(s.optim.epochs, s.optim.mini_batches, s.optim.micro_batch_size,
                                sizes.micro_batch_tokens, tok.pad_token_id, device, s.loss.agg,
                                s.run.max_new_tokens, world, s.run.seed)
    run = Run(settings=s, engine=engine, model=model, opt=opt, replay=replay, initial=frozen,
              precision=forward, tok=tok, per_rank=sizes.prompts, completions=sizes.completions,
              micro_batch=(s.optim.micro_batch_size, sizes.micro_batch_tokens), batching=batching,
              own_reward=own_reward, rank=rank, world=world, device=device, **given)
    if parts[logged.Flags].save_rollouts:
        run.saver = logged.Saver(logged.save_path(s.run.out_dir, rank, world), {
            "temperature": s.run.temperature, "top_p": s.run.top_p,
            "max_new_tokens": s.run.max_new_tokens, "model": s.run.model,
            "tokenizer": logged.fingerprint(tok)})
    try:
        fill_slots(run, parts, steps)
    except ValueError:
        engine.close()                   # vLLM has started: its teardown before the error line
        raise
    return run


def fill_slots(run: Run, parts: dict, steps: methods.Steps) -> None:
    """The slots the method files fill (methods.build), a method's head handed to the engine, the
    loss slot's hooks, the logged rollouts' pool (`logged_pool`) and the state the checkpoints
    keep; ValueError for a combination that cannot run as asked (a method's own ratio with replay
    where pi_old is recomputed, without the decoupled correction; a checkpoint that lacks an
    object's state)."""
    run.slots = methods.build(parts, run, steps)
    run.replay = run.slots.get("replay", run.replay)
    if "head" in run.slots:             # a method's head (R²PO's): the engine samples through it
        run.engine.logits_head = run.slots["head"]
    run.hooks = methods.loss_hooks(run.slots["loss"])
    run.logged = logged_pool(run, parts[logged.Flags], steps)    # scored as the slots score
    # a head's weights are kept by its method's own state (R²PO's step slot), not a second time
    objects = {**run.slots, "replay": run.replay, "logged": run.logged}
    objects.pop("head", None)
    run.state = {name: obj for name, obj in objects.items() if hasattr(obj, "state_dict")}
    if (run.hooks.ratio is not None and run.replay is not None
            and not run.settings.loss.tis_cap and not run.engine.serves_as_old(run.precision)):
        # pi_old would be the trainer's own forward, which hides the replayed rollouts' age from
        # the ratio: the decoupled form (--tis-cap) weighs each token by min(pi_old / pi_behaviour,
        # C) and logs it (loss/tis_weight); docs/methods.md
        raise ValueError(f"a method's ratio with replay at {run.precision} needs --tis-cap C "
                         "(or --replay none, or fp32)")
    if run.resume:
        checkpoint.check_state(run.resume, run.state)


def logged_pool(run: Run, f: logged.Flags, steps: methods.Steps) -> logged.LoggedPool | None:
    """--rollouts-from: every file read and checked before the first step (logged.read: one bad
    row refuses the run, whatever the good files hold), each rollout's advantage from its own
    group (the file's rewards, or this run's grader and reward: steps.grade and steps.score), the
    load canary on LOAD_CANARY rows of each file (engine.logprob_diff, refused beyond
    --max-logprob-diff; a resumed run, whose weights have moved, was checked at its start),
    then this rank's share of the groups in a pool (logged.LoggedPool); None without the flag."""
    if not f.rollouts_from:
        return None
    r, b = run.settings.run, run.batching
    check = dict(vocab=len(run.tok), tokenizer=logged.fingerprint(run.tok),
                 temperature=r.temperature)
    files = [logged.read(path, **check) for path in f.rollouts_from]

    def score(rows: list) -> None:                # the run's verifier and reward, as a step's
        steps.grade(run, rows)
        steps.score(run, rows)

    for file in files:
        logged.advantages(file, score)
    limit = run.settings.engine.max_logprob_diff
    for file in files:
        sample = logged.canary_rows(file, r.seed)
        diff = engine_lib.logprob_diff(run.model, sample, r.temperature, run.tok.pad_token_id)
        parallel.reshard(run.model)
        source = "the file's rewards" if file.rewarded else "this run's verifier and reward"
        parallel.print0(metrics_lib.wrap([
            f"logged: {file.name}: {len(file.rollouts)} rows in {len(logged.groups(file))} groups",
            f"advantages from {source}",
            f"logprob_diff {diff:.3g} on {len(sample)} rows of version {sample[0].version}"],
            go_on="  "))
        if diff > limit and not run.resume:        # resumed: the weights have moved since
            raise ValueError(f"{file.name}: logprob_diff {diff:.3g} > --max-logprob-diff "
                             f"{limit:g}: this model does not give the logged log-probs (another "
                             "model or weights; raise --max-logprob-diff to train on them anyway)")
    mine = logged.split([x for file in files for x in file.rollouts], run.rank, run.world)

    def logprobs(rows: list) -> list:              # the gap's forward, every rank in step
        return rollout.lockstep_logprobs(run.model, rows, b.rows, r.temperature, b.pad_id,
                                         b.world, b.tokens)

    parallel.print0(f"logged: {f.logged_per_step} rows a step ({f.logged_draw}), each used at "
                    f"most {f.logged_uses}x, gap bound {f.logged_max_gap:g} (0 = none)")
    return logged.LoggedPool(mine, k=f.logged_per_step // run.world, uses=f.logged_uses,
                             max_gap=f.logged_max_gap,
                             prioritized=f.logged_draw == "prioritized",
                             seed=replay_seed(r.seed, run.rank) + 1, logprobs=logprobs)
