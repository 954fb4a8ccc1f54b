"""GRPO with rollout-level, advantage-prioritized experience replay (arXiv 2606.04560): the
algorithm, and its hand-written FSDP2 wrapping.

    python train.py                     # built-in tiny model + arithmetic task, CPU, about a minute
    torchrun --nproc-per-node 8 train.py --model PATH ...      # data parallel + FSDP2
    python train.py --out-dir runs/x --resume auto   # after a crash: the newest complete checkpoint

`setup()` binds the flags once: it loads the model, the prompts and the eval sets, builds the
engine, the optimizer and the replay buffer, and asks the method files (methods/) which slots
they fill; with no method flag set, none. Each step of `train()` then reads top to bottom:
1. generate  `group_size` completions of each of this rank's `prompts_per_step` prompts, with the
             behaviour log-probs (rollout.py's engine or vllm_engine.py's);
2. score     each graded (verify.py), its reward shaped, its advantage from its own group
             (grpo.py), set once;
3. sample    replayed rollouts of earlier steps (buffer.py: replay_ratio x fresh, P ∝ |A|^alpha
             among those no older than tau_max steps); every fresh rollout stays in the batch;
4. store     this step's rollouts, version = step (after sampling: never replayed in their step);
5. update    epochs x mini_batches optimizer steps over fresh + replayed, micro-batched, each
             loss the clipped surrogate of `micro_batch_loss` with the normaliser fixed first;
6. sync      the engine gets the new weights;
then eval every `eval_every` steps, the log line and metrics.jsonl, a checkpoint every
`save_every`. A replayed rollout's ratio is against the policy that generated it, up to tau_max
steps old: what makes replay off-policy and what the clip guards. Under torchrun each rank takes
every world-th prompt and keeps its own buffer; the normaliser is summed over ranks and each
loss multiplied by the world size, so a step equals the 1-rank step over the same global batch.
"""
import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

import buffer
import checkpoint
import cli
import data
import eval as eval_lib  # the module eval.py, not the builtin
import flags
import grpo
import methods
import metrics as metrics_lib
import parallel
import reward_fn
import rollout
import verify
import vllm_engine
from flags import Args
from metrics import Metrics
from rollout import Sampling, TorchEngine

# ---- seeds: every random stream of a run comes from --seed here, and nowhere else ----------------


def torch_seed(seed: int) -> int:
    return seed                                    # the global torch RNG (a method's own weights)


def order_seed(seed: int) -> int:
    return seed                                    # the order of the training prompts


def replay_seed(seed: int, rank: int) -> int:
    return seed + 7_919 * rank     # each rank's replay buffer draws its own sample (and vLLM's)


def sampling_seed(seed: int, rank: int, step: int, round_: int) -> int:
    # its own stream per (rank, step, round)
    return seed * 1_000_003 + step * 1_009 + round_ + rank * 1_000_000_007


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
    reward: flags.RewardFlags
    loss: flags.LossFlags
    engine: vllm_engine.Flags
    eval: eval_lib.TrainFlags
    log: metrics_lib.LogFlags


class LossHooks(NamedTuple):
    """The loss slot's methods, gathered once from the methods that fill it (methods/__init__.py);
    all empty by default."""
    batch: list               # batch(mbs): the micro-batches before the normaliser
    keeps: list               # keeps(rollout) -> whether it is stored for replay
    prepare: list             # prepare(model, mbs): before the optimizer step's first micro-batch
    restrict: list            # restrict(logp, mb, loss_mask, eps) -> (loss_mask, eps)
    ratio: object | None      # ratio(logp, old, mask) -> log w, in place of the token ratio
    diagnostics: list         # diagnostics(logp, mb, log_w, eps) -> {key: 0-dim}, logged


def loss_hooks(wings: list) -> LossHooks:
    def of(name):
        return [getattr(w, name) for w in wings if hasattr(w, name)]
    ratios = of("log_ratio")
    return LossHooks(of("batch"), of("keeps"), of("prepare"), of("restrict"),
                     ratios[0] if ratios else None, of("diagnostics"))


@dataclass
class Run:
    """Everything `train()` runs on, made once by `setup()` (`build`)."""
    settings: Settings
    engine: object                        # TorchEngine or vllm_engine.VLLMEngine
    model: torch.nn.Module                # the policy, sharded under torchrun
    opt: torch.optim.Optimizer
    replay: object | None                 # buffer.RolloutReplay, a method's, or None
    ref_model: torch.nn.Module | None     # the frozen KL reference (--kl-coef > 0)
    precision: str                        # the trainer's forward: fp32 | autocast-bf16 | fsdp-bf16
    tok: object
    prompts: list                         # the training prompts
    mine: list[int]                       # this rank's share of them, in the seed's order
    per_rank: int                         # prompts this rank generates groups for each step
    micro_batch: tuple[int, int]          # (rows, padded tokens) per forward at most
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
    hooks: LossHooks = LossHooks([], [], [], [], None, [])


def load_inputs(run: flags.RunFlags, data_dir: str, *, needs: tuple, world: int, device: str):
    """What a run trains from: (resume checkpoint or None, model, tokenizer, training prompts).
    `needs`: files a checkpoint to resume must hold (a method's). ValueError / OSError for bad
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
    needs = tuple(f for part in flags.method_parts(args)
                  for f in getattr(part, "checkpoint_files", ()))
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
    template = train_template(run_flags, tok)
    run = build(parts, model, tok, sizes, forward=forward, max_len=max_len, rank=rank,
                world=world, device=device, initial=flags.needs_initial(args),
                prompts=prompts, mine=order[rank::world], eval_sets=eval_sets, resume=resume,
                grader=verify.grader(run_flags.train_data, template),
                form=verify.format_rule(run_flags.train_data, template),
                all_flags=dataclasses.asdict(args))
    return run


def build(parts: dict, model, tok, sizes: flags.Sizes, *, forward: str, max_len: int, rank: int,
          world: int, device: str, initial: bool, **given) -> Run:
    """The run's objects, each from its owner's flags (`parts`: {owner class: its flags}), then
    the slots the method files fill (methods.build). TorchEngine copies the model before sharding;
    vLLM starts after it (in one process it initialises torch.distributed itself) and takes the
    gathered weights. The model as loaded from --model is loaded once more, frozen, when the KL
    term or a method needs it (`initial`)."""
    s = Settings(*(parts[o] for o in (flags.RunFlags, flags.OptimFlags, flags.RewardFlags,
                                      flags.LossFlags, vllm_engine.Flags, eval_lib.TrainFlags,
                                      metrics_lib.LogFlags)))
    own_reward = reward_fn.make(s.reward.reward_fn, tok)  # --reward-fn, checked before all else
    frozen = None                         # the model as loaded: the KL reference, a method's
    if s.loss.kl_coef > 0 or initial:
        frozen = checkpoint.load_model(s.run.model, device)[0].eval().requires_grad_(False)
    engine = TorchEngine(model, tok) if s.engine.engine == "torch" else None
    if s.optim.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, device).train()
    if forward == "autocast-bf16":                 # one GPU: bf16, as torchrun's policy gives
        model = autocast_bf16(model, torch.device(device).type)
        if torch.device(device).type == "cpu" and engine is not None:
            autocast_bf16(engine.model, "cpu")     # --precision bf16: sample as the trainer scores
    if engine is None:
        engine = vllm_engine.start_vllm(model, tok, s.run.model, device,
                                        seed=replay_seed(s.run.seed, rank), max_model_len=max_len,
                                        distributed=world > 1,
                                        gpu_memory_utilization=s.engine.gpu_memory_utilization)
    opt = torch.optim.AdamW(model.parameters(), lr=s.optim.lr, weight_decay=s.optim.weight_decay)
    replay = buffer.make(parts[buffer.Flags], seed=replay_seed(s.run.seed, rank))
    run = Run(settings=s, engine=engine, model=model, opt=opt, replay=replay,
              ref_model=frozen if s.loss.kl_coef > 0 else None, precision=forward, tok=tok,
              per_rank=sizes.prompts, micro_batch=(s.optim.micro_batch_size,
                                                   sizes.micro_batch_tokens),
              own_reward=own_reward, flags=given.pop("all_flags"), rank=rank, world=world,
              device=device, **given)
    run.slots = methods.build(parts, context(run, frozen, sizes.completions, parts[buffer.Flags]))
    run.replay = run.slots.get("replay", run.replay)
    run.hooks = loss_hooks(run.slots["loss"])
    return run


def context(run: Run, initial, completions: int, replay: buffer.Flags) -> methods.Context:
    """What the method files get at set-up: the run's objects and the spine's own steps."""
    s = run.settings

    def logprobs(rollouts):                        # the policy's no-grad forward, in lockstep
        return rollout.lockstep_logprobs(run.model, rollouts, run.micro_batch[0],
                                         s.run.temperature, run.tok.pad_token_id, run.world,
                                         run.micro_batch[1])

    return methods.Context(
        model=run.model, tok=run.tok, engine=run.engine, device=run.device, world=run.world,
        initial=initial, eps=(s.loss.eps_low, s.loss.eps_high), agg=s.loss.agg,
        dual_clip=s.loss.dual_clip, tis_cap=s.loss.tis_cap, ratio=s.loss.ratio,
        replay=replay.replay, tau_max=replay.tau_max, temperature=s.run.temperature,
        max_len=s.run.max_new_tokens, group_size=s.run.group_size, per_rank=run.per_rank,
        completions=completions, micro_batch=run.micro_batch, max_grad_norm=s.optim.max_grad_norm,
        logprobs=logprobs, sampling=lambda step, round_: sampling(run, step, round_),
        grade=lambda rollouts: grade(run, rollouts),
        generate=lambda prompts, n, step, round_: generate(run, prompts, n, step, round_),
        score=lambda rollouts: score(run, rollouts),
        credit=lambda rollouts: credit(rollouts, s.reward))


# ---- 1. generate and 2. score -----------------------------------------------------------------

def sampling(run: Run, step: int, round_: int) -> Sampling:
    """The training rollouts' sampling at (step, round_): its own seed; through the engine's
    logits head when a method gave it one."""
    r = run.settings.run
    return Sampling(r.temperature, r.top_p, r.max_new_tokens,
                    seed=sampling_seed(r.seed, run.rank, step, round_),
                    use_head=getattr(run.engine, "logits_head", None) is not None)


def generate_and_score(run: Run, pos: int, step: int, metrics: Metrics):
    """1. and 2.: `group_size` completions of each of this rank's next `per_rank` prompts
    (mine[pos:], wrapping around), graded and scored, or the allocate slot's; their numbers to
    `metrics`. Returns (fresh, every generated rollout, new pos)."""
    if "allocate" in run.slots:
        fresh, generated, pos = run.slots["allocate"].allocate(run.prompts, run.mine, pos,
                                                               step=step, metrics=metrics)
    else:
        prompts = [run.prompts[run.mine[(pos + i) % len(run.mine)]] for i in range(run.per_rank)]
        fresh = generate(run, prompts, run.settings.run.group_size, step, 0)
        score(run, fresh)
        generated, pos = list(fresh), pos + run.per_rank
    metrics_lib.rollout_metrics(metrics, fresh, generated)    # what was generated: its numbers
    return fresh, generated, pos


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


# ---- 5. the update -------------------------------------------------------------------------------

def micro_batch_loss(run: Run, mb: dict, normaliser: float, metrics: Metrics) -> torch.Tensor:
    """The loss of one micro-batch (grpo.py has each function's equation):

        rho_t = pi_theta(y_t) / pi_old(y_t)                      (the token ratio)
        L = (1/N) sum_t max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
            + kl_coef * KL(pi_theta || pi_ref)                   (--kl-coef > 0)
    aggregated by --agg over N, the whole optimizer step's normaliser; pi_old is the behaviour
    policy's (logged at generation), or with --tis-cap the proximal one, each token then weighted
    by min(pi_old / pi_behaviour, C). A method may narrow the loss mask, change the clip range or
    the ratio (the loss slot). Its metrics go to `metrics`."""
    f, hooks, temperature = run.settings.loss, run.hooks, run.settings.run.temperature
    logits, logp = rollout.forward_logprobs(run.model, mb, temperature)  # [b, T, V], [b, T]
    mask, old, adv = mb["completion_mask"], mb["old_logprobs"], mb["advantages"]
    loss_mask, eps = mask, (f.eps_low, f.eps_high)
    for restrict in hooks.restrict:
        loss_mask, eps = restrict(logp, mb, loss_mask, eps)
    log_w = (hooks.ratio or grpo.token_log_ratio)(logp, old, mask)                   # [b, T]
    w_tis = grpo.tis_weight(old, mb["behaviour_logprobs"], f.tis_cap) if f.tis_cap else None
    loss, m = grpo.policy_loss(log_w, adv, loss_mask, eps_low=eps[0], eps_high=eps[1],
                               dual_clip=f.dual_clip or None, agg=f.agg,
                               normaliser=normaliser, token_weight=w_tis)
    n = float(m.pop("loss/tokens"))
    with torch.no_grad():
        extra = {"entropy": grpo.masked_mean(grpo.entropy_from_logits(logits, temperature), mask)}
        for diagnostics in hooks.diagnostics:
            extra.update(diagnostics(logp, mb, log_w, eps))
    if f.kl_coef > 0:
        with torch.no_grad():
            ref_logp = rollout.forward_logprobs(run.ref_model, mb, temperature)[1]     # [b, T]
        kl = grpo.kl_penalty(logp, ref_logp, f.kl_estimator)                            # [b, T]
        loss = loss + f.kl_coef * grpo.aggregate(kl, loss_mask, f.agg, normaliser)
        extra["kl"] = grpo.masked_mean(kl.detach(), mask)
    metrics.token_means(m, n, grpo.COMBINE)       # policy_loss's means: over the loss tokens
    metrics.token_means(extra, float(mask.sum()))  # the rest: over every completion token
    metrics.total("loss/tokens", n)
    return loss


def optimizer_step(run: Run, mbs: list, normaliser: float, *, guard: parallel.StepGuard,
                   step: int, metrics: Metrics) -> None:
    """One optimizer step: forward/backward over the micro-batches (in lockstep with the other
    ranks), clip, step."""
    model, world = run.model, run.world
    for prepare in run.hooks.prepare:              # a method's step-wide pass, before the first
        prepare(model, mbs)
    loss = 0.0
    for mb in parallel.lockstep(mbs, model, run.tok.pad_token_id, world, backward=True):
        mb_loss = micro_batch_loss(run, mb, normaliser, metrics)
        # FSDP averages over ranks and N is global: so the sum is the step's gradient
        (mb_loss * world).backward()
        loss += mb_loss.item()
    grad_norm = parallel.clip_gradients(model, run.settings.optim.max_grad_norm)
    if guard.allow(loss, grad_norm, world, step):
        run.opt.step()
    run.opt.zero_grad(set_to_none=True)
    metrics.mean("loss/policy", loss * world, 1)       # the whole step's loss: summed over ranks
    metrics.mean("loss/grad_norm", grad_norm, 1)       # the global norm: the same on every rank


def update(run: Run, fresh: list, replayed: list, *, step: int, guard: parallel.StepGuard,
           per_update: list | None = None) -> Metrics:
    """5. `epochs` x `mini_batches` optimizer steps on this rank's fresh + replayed rollouts, each
    with the global normaliser N fixed first. Returns this rank's metrics; each optimizer step's
    own metrics are also appended to `per_update` when given (updates.jsonl)."""
    o, f, pad_id = run.settings.optim, run.settings.loss, run.tok.pad_token_id
    run.engine.sleep()                             # vLLM on CUDA frees its memory for the update
    metrics, updates = Metrics(), []
    batch = fresh + replayed
    old = None                                     # TIS: the proximal policy's, recomputed
    if f.tis_cap:
        old = rollout.lockstep_logprobs(run.model, batch, run.micro_batch[0],
                                        run.settings.run.temperature, pad_id, run.world,
                                        run.micro_batch[1])
    for epoch in range(o.epochs):
        order = shuffle_seed(run.settings.run.seed, step, epoch) if epoch else None
        for idx in rollout.mini_batches(len(fresh), len(replayed), o.mini_batches, order):
            mbs = rollout.micro_batches([batch[i] for i in idx], run.micro_batch[0], pad_id,
                                        run.device, old_logprobs=old and [old[i] for i in idx],
                                        max_tokens=run.micro_batch[1])
            for adjust in run.hooks.batch:
                adjust(mbs)
            normaliser = parallel.global_normaliser(mbs, f.agg, run.settings.run.max_new_tokens,
                                                    run.world)
            if normaliser is None:                     # no rank has a rollout in it: no step
                continue
            updates.append(Metrics())
            optimizer_step(run, mbs, normaliser, guard=guard, step=step, metrics=updates[-1])
            metrics.merge(updates[-1])
    metrics.max("stage/updates", len(updates))         # optimizer steps in this loop step
    metrics.max("train/skipped_steps", guard.skipped)
    if per_update is not None:
        per_update += updates
    return metrics


# ---- the loop ------------------------------------------------------------------------------------

def check_engine(run: Run, generated: list, m: Metrics) -> None:
    """Does the engine hold our weights (every --check-every steps)? rollout/logprob_diff (the
    canary), and under bf16 autocast the floor precision alone gives it."""
    temperature, pad_id = run.settings.run.temperature, run.tok.pad_token_id
    m.mean("rollout/logprob_diff", rollout.logprob_diff(run.model, generated[:16], temperature,
                                                        pad_id), 1)
    if run.precision == "autocast-bf16":
        floor = rollout.logprob_floor(run.model, generated[:16], temperature, pad_id)
        m.mean("rollout/logprob_floor", floor, 1)
    parallel.reshard(run.model)                    # the no-grad forward's gathered parameters


def train_step(run: Run, pos: int, m: Metrics, *, step: int, guard: parallel.StepGuard):
    """One pass of the loop, 1. to 6. of the module docstring, its metrics into `m`. Returns (the
    fresh rollouts, every generated rollout, the new prompt position, each optimizer step's
    metrics)."""
    t0 = time.perf_counter()
    per_update = []
    fresh, generated, pos = generate_and_score(run, pos, step, m)                # 1. and 2.
    if run.settings.engine.check_every and step % run.settings.engine.check_every == 0:
        check_engine(run, generated, m)            # does the engine hold our weights?
    t1 = time.perf_counter()
    phase = run.slots.get("phase")
    if phase is not None and phase.phase(step) != "policy":      # a method's own phase
        run.engine.sleep()
        m.merge(phase.run_phase(run.model, fresh))
    else:
        replay = run.replay
        replayed = replay.sample(step, len(fresh)) if replay is not None else []      # 3. sample
        if replay is not None:                                                         # 4. store
            replay.add([r for r in fresh if all(k(r) for k in run.hooks.keeps)], step)
        m.merge(update(run, fresh, replayed, step=step, guard=guard,                   # 5. update
                       per_update=per_update))
        run.engine.load_weights(parallel.full_parameters(run.model))                  # 6. sync
    t2 = time.perf_counter()
    for key, seconds in (("generate", t1 - t0), ("update", t2 - t1), ("step", t2 - t0)):
        m.max(f"time/{key}", seconds)
    return fresh, generated, pos, per_update


def log_step(run: Run, logs, m: Metrics, per_update: list, generated: list, *, step: int,
             verified: dict) -> dict:
    """The step's bookkeeping: the buffer's and a method's numbers, the verifier's error counts
    since `verified`; then every rank's metrics
    reduced in one collective, the log line, metrics.jsonl, samples.jsonl and updates.jsonl; then
    the canary's check. Returns the step's reduced metrics."""
    s = run.settings
    buffer.report(run.replay, m)                       # the buffer's state after this step
    if "phase" in run.slots:
        run.slots["phase"].report(m, step)
    for key, count in verify.stats().items():         # errors would zero rewards: count them
        m.total(f"verify/{key}", count - verified[key])
    row, *per_update_rows = metrics_lib.reduce_all([m, *per_update], run.world)
    row = {"step": step + 1, **row}
    metrics_lib.write_logs(logs, row, metrics_lib.log_line(row, LOG_LINE),
                           generated[:s.log.log_samples], run.tok, per_update_rows)
    rollout.check_canary(row.get("rollout/logprob_diff", 0.0), s.engine.max_logprob_diff,
                         step + 1)
    return row


# the step's log line: each component's fields, in this order (metrics.fields)
LOSS_LOG = ("loss {loss/policy:+.4f}", "clip {loss/clip_frac:.3f}")    # absent without an update
LOG_LINE = (*metrics_lib.LOG, *LOSS_LOG, *buffer.LOG, *methods.log_fields(), "{time/step:.2f}s",
            eval_lib.log_fields, verify.log_fields)


def train(run: Run) -> dict:
    """The loop of the module docstring, from step 0 or from the checkpoint run.resume; returns the
    last step's metrics."""
    s, rank, world = run.settings, run.rank, run.world
    guard = parallel.StepGuard(s.optim.max_bad_steps)
    phase = run.slots.get("phase")                     # a method's own phase, or None
    start, pos = checkpoint.restore(run.resume, run.model, run.opt, replay=run.replay,
                                    guard=guard, rank=rank, flags=run.flags, extra=phase)
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
        m = Metrics()
        fresh, generated, pos, per_update = train_step(run, pos, m, step=step, guard=guard)
        if (s.eval.eval_every and (step + 1) % s.eval.eval_every == 0) or step + 1 == s.run.steps:
            evaluate(m)
            if phase is not None:
                phase.at_eval(run.engine, generated, step, m)
        row = log_step(run, logs, m, per_update, generated, step=step, verified=verified)
        if (s.run.save_every and (step + 1) % s.run.save_every == 0) or step + 1 == s.run.steps:
            ckpt = checkpoint.save(os.path.join(s.run.out_dir, "checkpoints"), step + 1,
                                   run.model, run.opt, run.tok, run.flags, guard=guard,
                                   replay=run.replay, pos=pos, rank=rank, world=world,
                                   extra=phase)
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
        # no process group yet: rank 0 by its environment says it, every rank records it
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        parallel.record_error(f"error: {e}")
        return 2
    try:
        rank, world, device = setup_distributed()
    except ValueError as e:
        return parallel.fail(f"error: {e}", 2, every_rank=True)
    try:
        # bad input ends in one line and exit status 2; a bug past this point shows its traceback
        try:
            run = setup(args, rank=rank, world=world, device=device)
            if args.overwrite:                         # the inputs are good: only now delete
                checkpoint.start_over(args.out_dir, rank)
        except (ValueError, OSError) as e:
            return parallel.fail(f"error: {e}", 2)
        if args.resume and not run.resume:
            where = os.path.join(args.out_dir, "checkpoints")
            parallel.print0(f"--resume auto: no complete checkpoint in {where}; starting at step 0")
        try:
            train(run)
            if dist.is_initialized():
                # gloo torn down while another rank still has work in flight can abort
                dist.barrier()
        except (parallel.NonFiniteError, rollout.EngineMismatchError) as e:
            return parallel.fail(f"error: {e}", 1)
        except parallel.RanksStopped as e:           # bad input found mid-run, every rank stops
            return parallel.fail(f"error: {e}", 2)
        except reward_fn.RewardFnError as e:         # bad input found mid-run, on this rank
            return parallel.fail(f"error: {e}", 2, every_rank=True)
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
