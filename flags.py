"""train.py's flags, composed at the door: each owner declares its own flags beside its code, in
a small frozen dataclass (the run's, the optimizer's, the reward's and the loss's are here; the
replay's in buffer.py, each method's in its file of methods/, the engine's in vllm_engine.py, the
eval's in eval.py, the logs' in metrics.py), and `Args` is all of them in one flat dataclass: one
`--flag` each, grouped in --help by owner, the presets and args.json flat. Also their bounds, so
that bad input ends in one clear sentence before anything runs, and the sizes they derive,
computed once. The dataclass -> argparse machinery is cli.py's.

    args = flags.parse(sys.argv[1:], __doc__)        # what train.main does
    part = cli.part(args, LossFlags)                 # an owner's own flags (run_setup binds them)
"""
import dataclasses
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from typing import Literal, NamedTuple

import buffer
import cli
import data
import eval
import grpo
import methods
import metrics
import vllm_engine

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the presets: GRPO and the seed paper's two replays; each method file adds its own ----------
# A preset's lr is the one its experiment chose on the built-in task's dev split
# (bench/experiments.py: the best mean final dev accuracy over lrs 3e-4, 1e-4, 3e-5, ...;
# bench/results/NAME/sweep.md). The default run's lr, 3e-4, is the 100-step demo's large step on
# the tiny model, not chosen on dev; the replay experiment's longer runs chose 1e-4.
SPINE_PRESETS = {
    "grpo": ("original GRPO (DeepSeekMath, arXiv 2402.03300): no replay, symmetric clip 0.2, "
             "per-sequence token mean; lr 1e-4; its logged loss is 0 at every step by "
             "construction (on-policy: ratio 1, each group's A sums to 0; the gradient is not 0)",
             dict(replay="none", ratio="token", agg="seq-mean-token-mean", eps_low=0.2,
                  eps_high=0.2, lr=1e-4)),
    "rollout-replay": ("rollout-level |A|-prioritized replay (arXiv 2606.04560): the defaults "
                       "at their experiment's dev-chosen lr 1e-4 (the default 3e-4 is the 100-step "
                       "demo's large step on the tiny model, not chosen on dev)",
                       dict(replay="prioritized", priority_alpha=1.0, tau_max=4, replay_ratio=0.5,
                            lr=1e-4)),
    "naive-replay": ("naive uniform rollout replay, the baseline of arXiv 2606.04560; lr 1e-4",
                     dict(replay="uniform", tau_max=4, replay_ratio=0.5, lr=1e-4)),
    "nonzero-replay": ("uniform rollout replay among rollouts with A != 0: the prioritized draw's "
                       "support without its |A| weighting (a control, not a paper's); lr 1e-4 "
                       "as naive replay's",
                       dict(replay="nonzero", tau_max=4, replay_ratio=0.5, lr=1e-4)),
}
PRESETS = {**SPINE_PRESETS, **methods.presets()}


# ---- the flags: each owner declares its own beside its code; these two are the run's -------------

@dataclass(frozen=True)
class RunFlags:
    # ---- run -------------------------------------------------------------------------------------
    preset: Literal["none", *PRESETS] = "none"
    """a paper's method (the list below; docs/methods.md has their flags); explicit flags win"""
    model: str = os.path.join(HERE, "assets", "tiny-arith")
    """local Hugging Face model directory (the default is the built-in tiny model), or a Hub id
    (org/name), fetched as transformers does where the Hub is reachable (elsewhere: hf download ID
    --local-dir DIR where it is, then --model DIR)"""
    train_data: str = "builtin"
    """prompt set: 'builtin' (synthetic arithmetic, 2-3 operands), builtin_steps (5-6 operands,
    worked step by step), builtin_mixed (2-6 operands), a benchmark name (gsm8k_train, ...) or a
    .jsonl / .json / .parquet file"""
    question_key: str = ""
    """the question field of a --train-data (and --eval-benchmarks) file, dotted for nested ('' =
    the first of question, problem, prompt)"""
    answer_key: str = ""
    """the gold answer field of such a file, dotted for nested ('' = the first of answer,
    final_answer, ground_truth); a list there (["1", "2"]) is one answer of several parts, "1, 2":
    a response must give them all (any order), not one of them"""
    prompt_template: Literal["auto", *data.TEMPLATES] = "auto"
    """plain | chat | builtin | instruct (data.apply_template); auto = for the built-in tasks
    instruct when the tokenizer has a chat template, else builtin; plain for any other set"""
    out_dir: str = "runs/default"
    """where metrics.jsonl, samples.jsonl and checkpoints/ go (final -> the last checkpoint)"""
    seed: int = 0
    """seed for data order, sampling and replay"""
    steps: int = 100
    """loop steps (generate -> update cycles)"""
    prompts_per_step: int = 64
    """distinct prompts generated per step"""
    group_size: int = 8
    """completions per prompt (the GRPO group); at least 2"""
    max_new_tokens: int = 8
    """completion length limit (L_max)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use the same"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    save_every: int = 50
    """write a checkpoint every N steps and at the end (0 = only at the end)"""
    resume: str = ""
    """a checkpoint directory to continue from, or 'auto' = the newest complete one in
    out_dir/checkpoints"""
    overwrite: bool = False
    """start over in an --out-dir that holds a run: delete its logs, checkpoints/ and final (a
    fresh run there is refused without this or --resume)"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""

    AT_LEAST_1 = ("steps", "prompts_per_step", "max_new_tokens")
    AT_LEAST_0 = ("save_every", "threads", "seed")


@dataclass(frozen=True)
class OptimFlags:
    # ---- optimisation ----------------------------------------------------------------------------
    lr: float = 3e-4
    """AdamW learning rate; 3e-4 is `python train.py`'s 100-step demo's large step on the tiny
    model, not chosen on dev: each --preset carries the lr its experiment chose on dev (1e-4 for
    the default's own method, --preset rollout-replay)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0 = off); the norm is global over all shards"""
    max_bad_steps: int = 3
    """optimizer steps in a row with a non-finite loss or gradient norm (each one skipped) that end
    the run"""
    grad_checkpointing: bool = False
    """recompute each layer's activations in backward: less memory, about a third more compute"""
    precision: Literal["auto", "bf16"] = "auto"
    """the forward's precision: auto = bf16 on CUDA (autocast in one process, FSDP2's policy under
    torchrun), fp32 on the CPU; bf16 = bf16 autocast on the CPU too, for the trainer and
    TorchEngine alike (fp32 weights, gradients and AdamW; SmolLM2-135M's log-probs moved by
    ~0.05). On a CPU with AMX a SmolLM2 step took 0.83x fp32's time (update 0.76x, generation
    1.09x); on one without bf16 units (avx512_bf16, amx_bf16) bf16 is emulated: 2 SmolLM2 steps
    took 368 s against fp32's 40 s (12-13x; the update 13-16x), so a run refuses it there unless
    --allow-slow-bf16 (docs/smollm2.md)"""
    allow_slow_bf16: bool = False
    """run --precision bf16 on a CPU without bf16 units all the same (emulated: about 12x fp32's
    step time), with a warning"""
    epochs: int = 1
    """passes over each step's batch"""
    mini_batches: int = 1
    """optimizer steps per pass (the batch is split into this many)"""
    micro_batch_size: int = 256
    """rollouts per forward/backward (memory only: does not change the gradient)"""
    micro_batch_tokens: int = 0
    """padded tokens (rows x longest row) per forward/backward at most, beside --micro-batch-size
    (memory only); 0 = auto: what fits 2 GiB of activations and logits on the CPU (on CUDA what
    the GPU's memory leaves beside the trainer's state and vLLM's, flags.plan_memory), at most
    2^28 / vocabulary size (2^30 on CUDA; flags.micro_batch_tokens)"""

    AT_LEAST_1 = ("micro_batch_size", "epochs", "mini_batches", "max_bad_steps")
    AT_LEAST_0 = ("micro_batch_tokens", "lr", "weight_decay", "max_grad_norm")


# --reward: the verdict's term (correct: the 1/0 verdict; partial: its partial credit), then
# "+format": the answer form's term added
REWARDS = ("correct", "correct+format", "partial", "partial+format")


@dataclass(frozen=True)
class RewardFlags:
    # ---- reward ----------------------------------------------------------------------------------
    reward: Literal[REWARDS] = "correct"
    """reward: correct (--reward-right / --reward-wrong by the verdict) | correct+format (plus
    --format-ok when the response is in the task's answer form, else --format-bad) | partial (the
    long task's partial credit: the verdict v replaced by (v + the share of the response's "="
    steps of the gold value) / 2, so 1 only for a right chain of right steps, at most 1/2 for a
    wrong answer) | partial+format (that plus the format term)"""
    reward_right: float = 1.0
    """reward of a correct response"""
    reward_wrong: float = 0.0
    """reward of a wrong response"""
    format_ok: float = 1.25
    """--reward correct+format: added when the response is in the answer form (built-in tasks: a
    plain integer after the last '='; benchmarks: a \\boxed{})"""
    format_bad: float = -1.0
    """--reward correct+format: added otherwise"""
    reward_fn: str = ""
    """a reward of your own, path/to/file.py:name: fn(completion, gold_answer) -> float replaces
    the verdict's term (reward_fn.py has the contract; the accuracy stays the grader's)"""


@dataclass(frozen=True)
class LossFlags:
    # ---- objective -------------------------------------------------------------------------------
    ratio: Literal[("token",)] = "token"
    """importance weight: token (pi / pi_behaviour per token), or a method's (methods/)"""
    agg: Literal[grpo.AGG_MODES] = "token-mean"
    """loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum |
    seq-mean-token-sum-norm"""
    eps_low: float = 0.2
    """clip range below 1"""
    eps_high: float = 0.28
    """clip range above 1 (clip-higher: 0.28; symmetric PPO: 0.2)"""
    dual_clip: float = 0.0
    """dual-clip constant c for A < 0 (e.g. 3; 0 = off)"""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; the reference model is loaded only when > 0"""
    kl_estimator: Literal[tuple(grpo.KL_ESTIMATORS)] = "k3"
    """KL estimator: k1 | abs | k2 | k3"""
    tis_cap: float = 0.0
    """truncated importance sampling cap C (0 = off): recompute old log-probs, weight by
    min(pi_old/pi_engine, C)"""

    AT_LEAST_0 = ("kl_coef", "tis_cap", "dual_clip")

    def rules(self) -> list[tuple[bool, str]]:
        """(is it broken, the sentence that says so) for each rule between these flags."""
        return [
            (not 0 <= self.eps_low <= 1 or self.eps_high < 0,
             f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {self.eps_low}, {self.eps_high}"),
            (0 < self.dual_clip <= 1,
             f"--dual-clip must be > 1 (or 0 = off), got {self.dual_clip}"),
        ]


# Every flag of train.py, one flat frozen dataclass (the command line, the presets, args.json),
# composed from its owners in this order; --help shows each owner's groups. A method file adds its
# flags (methods.owners) and values to --ratio and --replay (methods.choices).
OWNERS = (RunFlags, OptimFlags, RewardFlags, LossFlags, buffer.Flags, *methods.owners(),
          vllm_engine.Flags, eval.TrainFlags, metrics.LogFlags)
Args = cli.compose("Args", OWNERS, __name__, more_choices={
    "ratio": methods.choices("ratio"), "replay": methods.choices("replay")})


# --help's first line: argparse's own would list all ~100 flags before the groups that explain them
USAGE = "%(prog)s [--preset NAME] [--model DIR] [--FLAG VALUE ...]   (every flag: --help)"


def parse(argv=None, description: str = "") -> Args:
    """train.py's command line: its flags, the chosen preset's values as the defaults."""
    return cli.parse(Args, argv, description, presets=PRESETS, usage=USAGE)


# ---- the bounds ----------------------------------------------------------------------------------

BF16_CPU = ("avx512_bf16", "amx_bf16")     # /proc/cpuinfo flags: bf16 matmuls in hardware


def cpu_has_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bf16 matmul units (a flag of BF16_CPU in `cpuinfo`, /proc/cpuinfo's
    text when None); None where there is no /proc/cpuinfo to tell."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    return bool(set(cpuinfo.split()) & set(BF16_CPU))


def bf16_cpu_warning(choice: str, device: str, cpuinfo: str | None = None) -> str | None:
    """Why --precision `choice` on `device` is slow: bf16 asked for on a CPU without bf16 units
    (cpu_has_bf16 False), where torch emulates bf16 autocast's matmuls (2 SmolLM2 steps: 368 s
    against fp32's 40 s, 12-13x; a greedy batch 4.6x); None otherwise (fp32, a GPU, a CPU with
    them, or one that cannot tell). A run refuses it unless --allow-slow-bf16, then warns."""
    if choice != "bf16" or device.split(":")[0] != "cpu" or cpu_has_bf16(cpuinfo) is not False:
        return None
    return "--precision bf16: no bf16 units on this CPU, 12x slower than fp32"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args, world: int = 1) -> None:
    """Reject bad input up front with one clear sentence (a ValueError that main prints). Every
    float flag must be finite; each owner's bounds (AT_LEAST_1, AT_LEAST_0) and rules come first,
    then the rules between owners. The bounds are what the code can run with, not a judgement of
    taste. First of all, a method file that the registry (methods.WINGS) does not name."""
    stray = methods.unregistered()
    if stray:
        raise ValueError(f"methods/{stray[0]} is not a method yet: add \"{stray[0][:-3]}\" to "
                         f"methods/__init__.py's WINGS")
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {value}")
    for owner in OWNERS:
        for attr, low in (("AT_LEAST_1", 1), ("AT_LEAST_0", 0)):
            for name in getattr(owner, attr, ()):
                if getattr(args, name) < low:
                    raise ValueError(f"{flag(name)} must be >= {low}, got {getattr(args, name)}")
    rules = [rule for owner in OWNERS if hasattr(owner, "rules")
             for rule in cli.part(args, owner).rules()]
    for bad, message in rules + _rules(args, world):
        if bad:
            raise ValueError(message)


def _rules(args, world: int) -> list[tuple[bool, str]]:
    """(is it broken, the sentence that says so) for each rule between the run's flags and across
    owners."""
    named = [args.train_data, *filter(None, map(str.strip, args.eval_benchmarks.split(","))),
             *([args.eval_data] if args.eval_data != "auto" else [])]
    files = [name for name in named if name not in data.BENCHMARK_NAMES]
    torch_needed = torch_engine_needed(args)
    model_problem = cli.model_problem(args.model)         # a Hub id passes: fetched at load
    return [
        (args.prompts_per_step % world,
         f"--prompts-per-step ({args.prompts_per_step}) must be divisible by the world size "
         f"({world}): every rank generates whole groups for an equal share"),
        (args.group_size < 2,
         f"--group-size must be >= 2 (a GRPO group needs a baseline), got {args.group_size}"),
        (args.seed >= 2 ** 31,
         f"--seed must be below 2**31 (sampling seeds are derived from it), got {args.seed}"),
        (args.threads > 1024, f"--threads must be at most 1024, got {args.threads}"),
        (args.temperature <= 0,
         "--temperature must be > 0: greedy decoding gives a group of identical completions"),
        (not 0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}"),
        (args.engine == "vllm" and torch_needed,
         f"--engine vllm: {torch_needed}; use --engine torch (or auto, which picks it)"),
        (args.tensorboard and importlib.util.find_spec("tensorboard") is None,
         "--tensorboard needs the tensorboard package: pip install -r requirements-bench.txt"),
        (bool(model_problem), model_problem),
        (args.overwrite and args.resume,
         "--overwrite starts over, --resume continues: choose one"),
        (args.reward_fn and args.reward.startswith("partial"),
         "--reward-fn replaces the verdict's term, --reward partial another: choose one"),
        ((args.question_key or args.answer_key) and not files,
         "--question-key / --answer-key name the fields of a data file, but --train-data, "
         "--eval-data and --eval-benchmarks name no file"),
    ]


# ---- what the flags derive: computed once, checked, printed at start -----------------------------

AUTO_LOGITS = 2 ** 28        # --micro-batch-tokens 0: logits per micro-batch (1 GiB in fp32)
# on CUDA, where the budget is the GPU's free memory: 4 GiB of fp32 logits, half of int32's
# index range (a kernel that indexes the logits with int32 stays within it)
AUTO_LOGITS_CUDA = 2 ** 30
AUTO_ACTIVATIONS = 2 ** 31   # --micro-batch-tokens 0: a micro-batch's activations and logits
GiB = 2 ** 30


class Sizes(NamedTuple):
    """The sizes the flags imply on one rank, computed once at start (`sizes`) and printed."""
    world: int
    prompts: int             # prompts this rank generates groups for each step
    group_size: int          # completions per prompt (fixed groups)
    completions: int         # completions this rank generates each step (0: fixed groups)
    micro_batch_tokens: int  # --micro-batch-tokens, 0 (auto) resolved

    def fields(self) -> list[str]:
        """The first screen's fields of the sizes (run_setup.setup prints them, metrics.wrap)."""
        if self.completions:
            per_step = f"{self.prompts} prompts, {self.completions} completions (a budget)"
        else:
            per_step = f"{self.prompts} prompts x {self.group_size} completions"
        return [f"world size {self.world}", f"{per_step} per rank per step",
                f"micro-batches of at most {self.micro_batch_tokens} padded tokens"]


def shown(changed: dict) -> list[str]:
    """The first screen's flags (`changed`), as the JSON object they are, one item a part
    (metrics.wrap breaks the line between items); ["the defaults"] when none changed."""
    if not changed:
        return ["the defaults"]
    items = [f"{json.dumps(name)}: {json.dumps(value)}," for name, value in changed.items()]
    items[-1] = items[-1].removesuffix(",") + "}"
    items[0] = "{" + items[0]                      # the last item may be the first
    return items


def sizes(args, model, world: int, bytes_per_value: int = 4,
          memory_budget: int = AUTO_ACTIVATIONS, logits: int = AUTO_LOGITS) -> Sizes:
    """The per-rank sizes of `args` for `model` at `world` ranks (activations kept in
    `bytes_per_value`: 4 in fp32, 2 in bf16; a micro-batch's `memory_budget`: activation_budget;
    at most `logits` logits a micro-batch: AUTO_LOGITS, AUTO_LOGITS_CUDA on CUDA)."""
    budget = max((part.completions(args.prompts_per_step, args.group_size)
                  for part in method_parts(args) if hasattr(part, "completions")), default=0)
    return Sizes(world, args.prompts_per_step // world, args.group_size, budget // world,
                 micro_batch_tokens(args, model, bytes_per_value, memory_budget, logits))


def method_parts(args) -> list:
    """Each method file's flags, as that file's own dataclass."""
    return [cli.part(args, owner) for owner in methods.owners()]


def torch_engine_needed(args) -> str:
    """Why these flags need --engine torch (the rule that says so when --engine vllm is asked for,
    the reason --engine auto gives for choosing it: vllm_engine.choose_engine), or "" when either
    engine will do: --top-p < 1, or a method's `needs_torch_engine`."""
    reasons = [part.needs_torch_engine for part in method_parts(args)
               if getattr(part, "needs_torch_engine", "")]
    if args.top_p < 1:
        reasons.insert(0, "--top-p < 1 needs the torch engine (vLLM returns log-probs "
                          "renormalised over the nucleus, not the full-vocabulary ones)")
    return "; ".join(reasons)


def needs_initial(args) -> bool:
    """Whether a method needs the model as loaded, frozen (its `needs_initial`)."""
    return any(getattr(part, "needs_initial", False) for part in method_parts(args))


def changed(args) -> dict:
    """The flags whose values differ from the defaults or, with --preset, from the preset's: what
    the first screen of a run shows (args.json keeps them all)."""
    base = dataclasses.replace(Args(), **PRESETS[args.preset][1]) if args.preset in PRESETS \
        else Args()
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
            if getattr(args, f.name) != getattr(base, f.name)}


def token_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """Bytes one padded token of a micro-batch holds from its forward to its backward, measured on
    SmolLM2-135M in fp32 on the CPU (peak resident memory of one forward and backward at 512 to
    2,048 tokens: 1.69 MB a token without logits, 98 d bytes a layer; +0.43 MB with the logits, 8.8
    V): 100 d bytes a layer in fp32 (25 d values: the attention and SwiGLU inputs and outputs, the
    norms, the residual), half in bf16; with --grad-checkpointing each layer keeps only its input
    (d values) and one layer is recomputed at a time; plus the logits, their log-softmax and
    gradient (12 V bytes, fp32 whatever the forward's precision: grpo.token_logprobs)."""
    return activation_bytes(config, bytes_per_value, checkpointing) + 12 * config.vocab_size


def activation_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """token_bytes without the logits: what the decoder layers keep of one token."""
    d, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 25 * d * bytes_per_value
    return layers * d * bytes_per_value + per_layer if checkpointing else layers * per_layer


# Above a micro-batch's kept activations, measured (peak resident memory, the README's your-data
# run on the tiny model, 1.03 GiB of activations a micro-batch): its backward's gradients of them,
# and what the allocator keeps of an earlier micro-batch's (the layers' tensors are small enough,
# under glibc's 32 MiB mmap threshold, to be served from a heap that fragments; the logits' are
# not): the peak was 1.85 GiB after the first update, 2.29 after the third and 2.4 over 100 steps.
ACTIVATION_SLACK = 0.75


def peak_token_bytes(config, bytes_per_value: int = 4, checkpointing: bool = False) -> int:
    """What one padded token of a micro-batch costs at the run's peak: token_bytes plus
    ACTIVATION_SLACK of its activations."""
    return (token_bytes(config, bytes_per_value, checkpointing)
            + int(ACTIVATION_SLACK * activation_bytes(config, bytes_per_value, checkpointing)))


def micro_batch_tokens(args, model, bytes_per_value: int = 4,
                       budget: int = AUTO_ACTIVATIONS, logits: int = AUTO_LOGITS) -> int:
    """--micro-batch-tokens, with 0 resolved to what fits `budget` bytes (token_bytes) and
    `logits` / the vocabulary size, whichever is fewer (SmolLM2-135M in fp32 on the CPU, 2 GiB:
    926 tokens; the built-in tiny model: 41,001, no bound in practice). The budget: AUTO_ACTIVATIONS
    on the CPU, what the GPU's memory leaves on CUDA (activation_budget)."""
    if args.micro_batch_tokens:
        return args.micro_batch_tokens
    c = model.config
    per_token = token_bytes(c, bytes_per_value, args.grad_checkpointing)
    return max(min(logits // c.vocab_size, budget // per_token), 1)


def activation_budget(device: str, beside: int = 0) -> int:
    """The bytes one micro-batch may hold under --micro-batch-tokens 0: AUTO_ACTIVATIONS on the CPU
    (the same on every machine, so a run's micro-batches, and its rounding, do not depend on the
    RAM); on CUDA what is left of GPU_USABLE of the GPU's memory after `beside` bytes (the
    trainer's resident state and what vLLM keeps asleep: Memory.beside_micro_batch), over 1 +
    ACTIVATION_SLACK, so that the micro-batch and its backward fit what is left (0 when nothing
    is: fits_machine then says what to change)."""
    import torch
    if torch.device(device).type != "cuda":
        return AUTO_ACTIVATIONS
    total = torch.cuda.get_device_properties(device).total_memory
    return max(int((GPU_USABLE * total - beside) / (1 + ACTIVATION_SLACK)), 0)


GPU_USABLE = 0.9         # of a GPU's memory planned for; the rest: the CUDA context, fragmentation
VLLM_SHARE_MAX = 0.85    # --gpu-memory-utilization 0 (auto): vLLM's share at most
VLLM_ASLEEP_SHARE = 0.05  # what vLLM keeps while it sleeps (CUDA graphs' pools, NCCL and cuBLAS
#                           workspaces): an estimate until a GPU run measures it (ops/gpu_check.sh)


def engine_share(asked: float, *, total: int, trainer: int, engine_weights: int) -> float:
    """vLLM's share of a GPU of `total` bytes: --gpu-memory-utilization `asked`, or with 0 (auto)
    all that GPU_USABLE leaves beside the `trainer`'s bytes while the engine is awake
    (Memory.between_updates), at most VLLM_SHARE_MAX (an 80 GB GPU beside a 7B's FSDP shard on 8
    ranks: 0.85, ~50 GB of KV cache; the old fixed 0.3 left ~4 GB). A ValueError naming the flag
    when the share cannot fit beside the trainer (the engine's first wake after an update would
    run out of memory), or holds no more than its own `engine_weights` and a fifth for the KV
    cache."""
    room = GPU_USABLE - trainer / total
    share = asked or min(VLLM_SHARE_MAX, room)
    if share > room:
        raise ValueError(f"--gpu-memory-utilization {share:.2f}: vLLM's {share * total / GiB:.1f} "
                         f"GiB and the {trainer / GiB:.1f} GiB the trainer keeps between updates "
                         f"exceed {GPU_USABLE:.0%} of this GPU's {total / GiB:.1f} GiB: set it "
                         f"to at most {max(room, 0):.2f}, or 0 (auto)")
    if share * total < 1.2 * engine_weights:
        raise ValueError(f"--gpu-memory-utilization {share:.2f}: {share * total / GiB:.1f} GiB "
                         f"leaves no room for a KV cache beside the engine's "
                         f"{engine_weights / GiB:.1f} GiB of bf16 weights: raise it, shard the "
                         f"trainer over more GPUs (torchrun), or use --engine torch")
    return share


class GpuPlan(NamedTuple):
    """How a run divides its device's memory, decided at start (plan_memory)."""
    budget: int              # bytes a micro-batch may hold (activation_budget)
    engine_share: float      # --gpu-memory-utilization, 0 (auto) resolved
    engine_asleep: int       # bytes vLLM keeps on the GPU while the trainer updates


def plan_memory(args, model, prompts: list, *, world: int, device: str, value_bytes: int,
                frozen_bytes: int) -> GpuPlan:
    """The micro-batch's budget and vLLM's share for this run on `device`. On the CPU nothing
    changes with the machine: AUTO_ACTIVATIONS, and the share vLLM's CPU build ignores (0.3 for
    auto). On CUDA the trainer's resident state comes first (update_memory): with vLLM, its share
    is checked against it (engine_share) and VLLM_ASLEEP_SHARE of the GPU stays the engine's while
    it sleeps; the budget is what is left (activation_budget)."""
    import torch
    if torch.device(device).type != "cuda":
        return GpuPlan(AUTO_ACTIVATIONS, args.gpu_memory_utilization or 0.3, 0)
    total = torch.cuda.get_device_properties(device).total_memory
    longest = max(len(p.ids) for p in prompts)
    resident = update_memory(args, model, longest, world, engine_copy=args.engine == "torch",
                             bytes_per_value=value_bytes, budget=0, frozen_bytes=frozen_bytes)
    share, asleep = args.gpu_memory_utilization or 0.3, 0
    if args.engine == "vllm":
        n_params = sum(p.numel() for p in model.parameters())
        share = engine_share(args.gpu_memory_utilization, total=total,
                             trainer=resident.between_updates, engine_weights=2 * n_params)
        asleep = int(VLLM_ASLEEP_SHARE * total)
    return GpuPlan(activation_budget(device, resident.beside_micro_batch + asleep), share, asleep)


class Memory(NamedTuple):
    """What a run holds at its peak on one rank, in bytes (update_memory): the parts of the
    message when it does not fit. The backward's terms (the bf16 cast, a micro-batch and its
    backward) and AdamW's step are never resident together: the peak holds the larger."""
    training: int         # the policy's weights, gradients and AdamW's two moments
    copies: int           # the engine's copy of the weights, the frozen reference / a method's
    micro_batch: int      # one micro-batch's activations and logits (token_bytes)
    runtime: int          # the interpreter, torch and transformers themselves
    slack: int = 0        # the backward's gradients and the allocator's keep (ACTIVATION_SLACK)
    cast: int = 0         # under bf16 autocast: the weights cast to bf16, kept for the backward
    optimizer: int = 0    # AdamW's temporaries at opt.step (foreach: a value a parameter)
    engine: int = 0       # what vLLM keeps on the GPU while it sleeps (VLLM_ASLEEP_SHARE)

    @property
    def beside_micro_batch(self) -> int:
        """What the backward holds beside its micro-batch: all but micro_batch, slack, optimizer."""
        return self.training + self.copies + self.runtime + self.engine + self.cast

    @property
    def between_updates(self) -> int:
        """What the trainer keeps while the engine is awake: the weights and AdamW's moments (the
        gradients are freed after each step), the copies, the runtime."""
        return self.training * 3 // 4 + self.copies + self.runtime

    @property
    def total(self) -> int:
        return (self.training + self.copies + self.runtime + self.engine
                + max(self.cast + self.micro_batch + self.slack, self.optimizer))

    def line(self) -> str:
        gib = [f"{x / GiB:.1f}" for x in self]
        return (f"{self.total / GiB:.1f} GiB (weights, gradients and AdamW {gib[0]}, copies of the "
                f"weights {gib[1]}, the runtime {gib[3]}, vLLM asleep {gib[7]}, then the larger "
                f"of the backward's: bf16 weights {gib[5]}, one micro-batch {gib[2]} and its "
                f"backward {gib[4]}, and AdamW's step {gib[6]})")


RUNTIME_BYTES = 700 * 2 ** 20   # python, torch, transformers and a tokenizer, resident (measured)


def update_memory(args, model, longest_prompt: int, world: int = 1, *, engine_copy: bool = True,
                  bytes_per_value: int = 4, budget: int = AUTO_ACTIVATIONS, frozen_bytes: int = 4,
                  engine_asleep: int = 0, foreach: bool = True) -> Memory:
    """The run's peak memory on one rank, roughly (Memory), each term its own field:
    - training: 16 bytes a parameter, the weights, gradients and AdamW's two moments in fp32,
      sharded over `world` ranks by FSDP2;
    - copies: 4 for TorchEngine's whole copy (`engine_copy`), `frozen_bytes` for the frozen
      reference of --kl-coef or a method's anchor (run_setup.frozen_dtype: 2 on CUDA, 4 on the
      CPU), sharded as the policy;
    - cast: in bf16 (`bytes_per_value` 2), 2 a parameter, the weights cast to bf16 that autocast
      keeps from the forward to the backward;
    - micro_batch and slack: one micro-batch's tokens (the fewer of --micro-batch-tokens and
      --micro-batch-size rows of the longest prompt + --max-new-tokens) at token_bytes each, and
      ACTIVATION_SLACK of their activations again (its backward, the allocator);
    - optimizer: AdamW's temporaries at opt.step: with `foreach` (torch's choice on CUDA) 4 a
      parameter of the shard, the square root of the second moment of every parameter at once;
      without (on the CPU), two of the largest parameter's, one parameter at a time;
    - engine: `engine_asleep`, what vLLM keeps while it sleeps (engine_asleep_bytes);
    - runtime. Held at or above the measured peaks of the README's runs
    (tests/test_gpu_ready.py)."""
    c = model.config
    numels = [p.numel() for p in model.parameters()]
    n_params = sum(numels)
    rows = args.micro_batch_size * (longest_prompt + args.max_new_tokens)
    tokens = min(micro_batch_tokens(args, model, bytes_per_value, budget), rows)
    frozen = args.kl_coef > 0 or needs_initial(args)
    copies = 4 * n_params * int(engine_copy) + frozen_bytes * n_params * int(frozen) // world
    cast = 2 * n_params if bytes_per_value == 2 else 0
    return Memory(16 * n_params // world, copies,
                  tokens * token_bytes(c, bytes_per_value, args.grad_checkpointing),
                  RUNTIME_BYTES,
                  int(tokens * ACTIVATION_SLACK * activation_bytes(c, bytes_per_value,
                                                                   args.grad_checkpointing)),
                  cast=cast, optimizer=(4 * n_params if foreach else 8 * max(numels)) // world,
                  engine=engine_asleep)


def machine_memory(device: str) -> tuple[int, int, str]:
    """(total, available, what) bytes of the memory a run on `device` lives in: the GPU's on CUDA
    (all of it counted available: this process is its only user at start), else the machine's RAM
    (/proc/meminfo's MemTotal and MemAvailable; where there is none, the physical pages, all
    counted available)."""
    import torch
    if torch.device(device).type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return total, total, "GPU memory"
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        total, available = (int(info[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        total = available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, available, "RAM"


def check_memory(need: Memory, per_token: int, *, checkpointing: bool, total: int,
                 available: int, what: str, ranks_here: int = 1) -> str | None:
    """The run against the machine, at start: a ValueError naming the flag that fixes it when
    `ranks_here` ranks of `need` exceed the `total` memory (a run that cannot fit is killed
    mid-step, or takes the machine down with it); a warning when they exceed what is `available`
    now (other processes hold the rest); else None. `per_token`: peak_token_bytes of the run;
    `checkpointing`: --grad-checkpointing is on already."""
    if ranks_here * need.total <= total:
        if ranks_here * need.total > available:
            return (f"the run may need about {ranks_here} x {need.line()}, more than the "
                    f"{available / GiB:.1f} GiB of {what} available now")
        return None
    room = (0.9 * total / ranks_here - need.beside_micro_batch) // per_token
    if room < 64 or need.beside_micro_batch + need.optimizer > 0.9 * total / ranks_here:
        fix = ("the weights and the optimizer alone do not fit: a machine with more memory, or "
               "more ranks (FSDP2 shards them)")
    else:
        fix = f"set --micro-batch-tokens {int(room)}"
        if not checkpointing:
            fix += " (or --grad-checkpointing: about a third more compute)"
    raise ValueError(f"the run needs about {ranks_here} x {need.line()}, more than this "
                     f"machine's {total / GiB:.1f} GiB of {what}: {fix}")


def fits_machine(args, model, prompts: list, *, world: int, device: str, value_bytes: int,
                 budget: int, frozen_bytes: int = 4,
                 engine_asleep: int = 0) -> tuple[Memory, str | None]:
    """The run's memory (update_memory) against the machine's (machine_memory: RAM on the CPU,
    shared by the ranks of this node; the GPU's own on CUDA), at start: (the estimate, a warning
    when it may not fit what is free now, or None); a ValueError naming the flag that fixes it
    when it cannot fit (check_memory)."""
    import torch
    longest = max(len(p.ids) for p in prompts)
    need = update_memory(args, model, longest, world, engine_copy=args.engine == "torch",
                         bytes_per_value=value_bytes, budget=budget, frozen_bytes=frozen_bytes,
                         engine_asleep=engine_asleep, foreach=torch.device(device).type == "cuda")
    cuda = torch.device(device).type == "cuda"
    ranks_here = 1 if cuda else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    total, available, what = machine_memory(device)
    per_token = peak_token_bytes(model.config, value_bytes, args.grad_checkpointing)
    return need, check_memory(need, per_token, checkpointing=args.grad_checkpointing,
                              total=total, available=available, what=what,
                              ranks_here=ranks_here)


def resolve_sizes(args, model, prompts: list, *, world: int, device: str, value_bytes: int,
                  frozen_bytes: int):
    """(args with --micro-batch-tokens 0 and --gpu-memory-utilization 0 resolved, the sizes, the
    memory estimate, a warning or None): the device's memory divided (plan_memory: on CUDA the
    micro-batch's budget is what the trainer's resident state and vLLM's leave), the sizes
    checked (check_sizes) and the run against the machine (fits_machine: a ValueError when it
    cannot fit, a warning when it may not fit what is free now). `value_bytes`: what the
    activations are kept in; `frozen_bytes`: a frozen copy's (run_setup.frozen_dtype)."""
    import torch
    plan = plan_memory(args, model, prompts, world=world, device=device,
                       value_bytes=value_bytes, frozen_bytes=frozen_bytes)
    logits = AUTO_LOGITS_CUDA if torch.device(device).type == "cuda" else AUTO_LOGITS
    found = sizes(args, model, world, value_bytes, plan.budget, logits)
    args = dataclasses.replace(args, micro_batch_tokens=found.micro_batch_tokens,   # 0 resolved
                               gpu_memory_utilization=plan.engine_share)
    check_sizes(args, model, prompts, found)
    need, warning = fits_machine(args, model, prompts, world=world, device=device,
                                 value_bytes=value_bytes, budget=plan.budget,
                                 frozen_bytes=frozen_bytes, engine_asleep=plan.engine_asleep)
    return args, found, need, warning


def check_sizes(args, model, prompts: list, sizes: Sizes) -> None:
    """Bounds that need the sizes, the model and the data: every optimizer step must hold a fresh
    rollout, a prompt must not appear twice in one step (its two groups would share a prompt_id and
    be merged), the test and dev splits must hold --eval-size and --dev-size prompts, and the
    longest prompt plus --max-new-tokens must fit the model's positions. (Memory: fits_machine.)"""
    world, fresh = sizes.world, sizes.prompts * sizes.group_size
    if args.mini_batches > fresh:
        raise ValueError(f"--mini-batches ({args.mini_batches}) exceeds the {fresh} fresh "
                         f"rollouts per rank and step: some optimizer steps would have no rollout")
    if sizes.prompts > len(prompts) // world:
        raise ValueError(f"--prompts-per-step ({args.prompts_per_step}) exceeds the {len(prompts)} "
                         f"training prompts (at most {len(prompts) // world * world} on {world} "
                         f"rank(s))")
    for name, split in (("eval_size", "test"), ("dev_size", "dev")):
        if args.train_data not in data.BUILTIN_NAMES:
            break                       # a file's held-out rows: as many as there are (eval.py)
        if name == "eval_size" and args.eval_data != "auto":
            continue                    # another set: its first --eval-size rows
        n = len(data.builtin_split(args.train_data, split))
        if getattr(args, name) > n:
            raise ValueError(f"{flag(name)} ({getattr(args, name)}) exceeds the {n} prompts of "
                             f"the built-in {split} split")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p.ids) for p in prompts)
    if limit and longest + args.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens ({args.max_new_tokens}) plus the longest prompt "
                         f"({longest} tokens) exceeds the model's {limit} positions")
