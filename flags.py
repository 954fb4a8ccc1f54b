"""train.py's flags, composed at the door: each owner declares its own flags beside its code, in
a small frozen dataclass (the run's, the optimizer's, the reward's and the loss's are here; the
replay's in buffer.py, each method's in its file of methods/, the engine's in vllm_engine.py, the
eval's in eval.py, the logs' in metrics.py), and `Args` is all of them in one flat dataclass: one
`--flag` each, grouped in --help by owner, the presets and args.json flat. Also their bounds, so
that bad input ends in one clear sentence before anything runs. The sizes and the memory they
imply are memory.py's; the dataclass -> argparse machinery is cli.py's.

    args = flags.parse(sys.argv[1:], __doc__)        # what train.main does
    part = cli.part(args, LossFlags)                 # an owner's own flags (run_setup binds them)
"""
import dataclasses
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from typing import Literal

import buffer
import cli
import data
import eval
import grpo
import logged
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
    """distinct prompts generated per step (0: none, the run trains on --rollouts-from alone)"""
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

    AT_LEAST_1 = ("steps", "max_new_tokens")
    AT_LEAST_0 = ("save_every", "threads", "seed", "prompts_per_step")


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
    the GPU's memory leaves beside the trainer's state and vLLM's, memory.plan_memory), at most
    2^28 / vocabulary size (2^30 on CUDA; memory.micro_batch_tokens)"""

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
OWNERS = (RunFlags, OptimFlags, RewardFlags, LossFlags, buffer.Flags, logged.Flags,
          *methods.owners(),
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
        (args.prompts_per_step == 0 and not args.rollouts_from,
         "--prompts-per-step 0 generates nothing: train on logged rollouts, --rollouts-from FILE"),
        (args.logged_per_step % world,
         f"--logged-per-step ({args.logged_per_step}) must be divisible by the world size "
         f"({world}): every rank draws an equal share"),
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


# ---- what the flags tell: the first screen's, the methods' needs ---------------------------------

def shown(changed: dict) -> list[str]:
    """The first screen's flags (`changed`), as the JSON object they are, one item a part
    (metrics.wrap breaks the line between items); ["the defaults"] when none changed."""
    if not changed:
        return ["the defaults"]
    items = [f"{json.dumps(name)}: {json.dumps(value)}," for name, value in changed.items()]
    items[-1] = items[-1].removesuffix(",") + "}"
    items[0] = "{" + items[0]                      # the last item may be the first
    return items


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
