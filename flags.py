"""train.py's flags: the presets (one per paper), the `Args` dataclass (every flag, its default and
what it does, grouped by owner as --help shows them) and their bounds, so that bad input ends in one
clear sentence before anything runs. The dataclass -> argparse machinery is cli.py's.

    args = flags.parse(Args, sys.argv[1:], __doc__, presets=PRESETS)     # what train.main does
"""
import dataclasses
import importlib.util
import math
import os
import re
from dataclasses import dataclass
from typing import Literal

import buffer
import data
import grpo
import r2po
import vigor
import vllm_engine
from cli import choices, field_docs, field_groups, parse  # noqa: F401  (flags.parse, as before)

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the presets: one per paper ------------------------------------------------------------------
# (each method's docstring says what was read, docs/methods.md links them)

PRESETS = {
    "grpo": ("original GRPO (DeepSeekMath, arXiv 2402.03300): no replay, symmetric clip 0.2, "
             "per-sequence token mean",
             dict(replay="none", adv="grpo", ratio="token", agg="seq-mean-token-mean", eps_low=0.2,
                  eps_high=0.2)),
    "dapo": ("DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token mean, dynamic sampling, "
             "overlong shaping and filter, 16 updates per step",
             dict(replay="none", adv="grpo", ratio="token", agg="token-mean", eps_low=0.2,
                  eps_high=0.28, dynamic_sampling=True, dynamic_sampling_rounds=3,
                  overlong_buffer=2, overlong_filter=True, mini_batches=16)),
    "drgrpo": ("Dr. GRPO (arXiv 2503.20783): advantage r - mean (no std), token sum / (G L_max), "
               "no replay",
               dict(replay="none", adv="drgrpo", ratio="token", agg="seq-mean-token-sum-norm",
                    eps_low=0.2, eps_high=0.2)),
    "gspo": ("GSPO (arXiv 2507.18071): sequence ratio, clip 3e-4/4e-4, 4 mini-batches per step, "
             "no replay",
             dict(replay="none", ratio="gspo", agg="seq-mean-token-mean", eps_low=3e-4,
                  eps_high=4e-4, mini_batches=4)),
    "pnpo": ("PNPO (arXiv 2608.01418): prefix geometric-mean ratio, 4 epochs per batch "
             "(off-policy regime)",
             dict(replay="none", ratio="pnpo", epochs=4)),
    "rollout-replay": ("rollout-level |A|-prioritized replay (arXiv 2606.04560): the defaults",
                       dict(replay="prioritized", priority_alpha=1.0, tau_max=4, replay_ratio=0.5)),
    "naive-replay": ("naive uniform rollout replay, the baseline of arXiv 2606.04560",
                     dict(replay="uniform", tau_max=4, replay_ratio=0.5)),
    "headroom-drift": ("Headroom-Drift group replay (abstract only): rank groups by p(1-p), "
                       "gate by drift",
                       dict(replay="headroom-drift", hd_headroom="variance", tau_max=4,
                            hd_groups=32, hd_candidates=64, hd_drift_frac=0.5)),
    "mu-grpo": ("mu-GRPO (arXiv 2605.17570, project page): 4 stages of 512 prompts x 64 updates, "
                "clip [0, 5], veto",
                dict(replay="none", eps_low=1.0, eps_high=4.0, veto_scope="suffix",
                     veto_threshold=1e-4, steps=4, prompts_per_step=512, mini_batches=64,
                     eval_every=1)),
    "m2po": ("M2PO (arXiv 2510.01161): second-moment trust region, mask the largest |log r| "
             "until M2 < 0.04, no eps-clip, token mean",
             dict(replay="none", ratio="token", agg="token-mean", m2po_tau=0.04)),
    "vigor": ("VIGOR (abstract only): variance-guided rollout allocation at the fixed allocation's "
              "budget, no replay",
              dict(replay="none", allocation="vigor", vigor_n_init=2, vigor_n_step=2,
                   vigor_top=16, vigor_rank="marginal", vigor_prior=1.0, vigor_weight="rollout")),
    "r2po": ("R²PO (arXiv 2601.11960, official code): rank-64 residual rollout head, 8 head "
             "then 10 policy steps, KL to the initial model, reward ±1 + format, T 0.9",
             dict(replay="none", r2po_head="residual", r2po_head_rank=64, r2po_schedule="8,10",
                  r2po_head_lr=1e-3, r2po_kl_coef=0.04, r2po_kl_anchor="initial",
                  reward="correct+format", reward_wrong=-1.0, temperature=0.9)),
}


# ---- the flags: one field each, its help text under it, its --help group in the header above it --

@dataclass
class Args:
    # ---- run -------------------------------------------------------------------------------------
    preset: Literal["none", *PRESETS] = "none"
    """a paper's method (the list below; docs/methods.md has their flags); explicit flags win"""
    model: str = os.path.join(HERE, "assets", "tiny-arith")
    """local Hugging Face model directory (the default is the built-in tiny model)"""
    train_data: str = "builtin"
    """prompt set: 'builtin' (synthetic arithmetic), a benchmark name (gsm8k_train, math500, ...) or
    a JSONL path"""
    prompt_template: Literal["auto", *data.TEMPLATES] = "auto"
    """plain | chat | builtin; auto = builtin for the built-in task, plain otherwise"""
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
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""
    # ---- optimisation ----------------------------------------------------------------------------
    lr: float = 3e-4
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0 = off); the norm is global over all shards"""
    max_bad_steps: int = 3
    """optimizer steps in a row with a non-finite loss or gradient norm (each one skipped) that end
    the run"""
    grad_checkpointing: bool = False
    """recompute each layer's activations in backward: less memory, about a third more compute"""
    epochs: int = 1
    """passes over each step's batch"""
    mini_batches: int = 1
    """optimizer steps per pass (the batch is split into this many)"""
    micro_batch_size: int = 256
    """rollouts per forward/backward (memory only: does not change the gradient)"""
    micro_batch_tokens: int = 0
    """padded tokens (rows x longest row) per forward/backward at most, beside --micro-batch-size
    (memory only); 0 = auto: 2^28 / vocabulary size, about 1 GiB of fp32 logits"""
    # ---- objective -------------------------------------------------------------------------------
    reward: Literal["correct", "correct+format"] = "correct"
    """reward: correct (--reward-right / --reward-wrong by the verdict) | correct+format (plus
    --format-ok when the response is in the task's answer form, else --format-bad)"""
    reward_right: float = 1.0
    """reward of a correct response"""
    reward_wrong: float = 0.0
    """reward of a wrong response (R²PO's official reward: -1)"""
    format_ok: float = 1.25
    """--reward correct+format: added when the response is in the answer form (built-in tasks: a
    plain integer after the last '='; benchmarks: a \\boxed{}); R²PO's official 1.25"""
    format_bad: float = -1.0
    """--reward correct+format: added otherwise (R²PO's official -1)"""
    adv: Literal[tuple(grpo.ADVANTAGES)] = "grpo"
    """advantage: grpo ((r - mean) / (std + 1e-6)) | drgrpo (r - mean)"""
    ratio: Literal[tuple(grpo.RATIOS)] = "token"
    """importance weight: token | gspo (sequence ratio) | pnpo (prefix geometric mean)"""
    pnpo_grad: Literal[grpo.PNPO_GRADS] = "detached"
    """PNPO's gradient: detached (w_t = sg[w_t] pi_t / sg[pi_t], GRPO's on-policy) | full (through
    the prefix mean)"""
    agg: Literal[grpo.AGG_MODES] = "token-mean"
    """loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum |
    seq-mean-token-sum-norm"""
    eps_low: float = 0.2
    """clip range below 1 (mu-GRPO's relaxed range [0, 5]: --eps-low 1 --eps-high 4)"""
    eps_high: float = 0.28
    """clip range above 1 (DAPO clip-higher: 0.28; symmetric PPO: 0.2)"""
    dual_clip: float = 0.0
    """dual-clip constant c for A < 0 (e.g. 3; 0 = off)"""
    veto_scope: Literal["none", *grpo.VETO_SCOPES] = "none"
    """mu-GRPO negative-advantage veto: none | suffix (the method) | trigger | response
    (ablations)"""
    veto_threshold: float = 1e-4
    """veto trigger: a token of an A < 0 response whose ratio is below this"""
    m2po_tau: float = 0.0
    """M2PO: in each optimizer step, mask the tokens of largest |log r| until the mean (log r)^2
    of the rest is below tau; no eps-clip (--eps-low/--eps-high ignored); 0 = off (M2PO: 0.04)"""
    kl_coef: float = 0.0
    """KL-to-reference coefficient; the reference model is loaded only when > 0"""
    kl_estimator: Literal[tuple(grpo.KL_ESTIMATORS)] = "k3"
    """KL estimator: k1 | abs | k2 | k3"""
    tis_cap: float = 0.0
    """truncated importance sampling cap C (0 = off): recompute old log-probs, weight by
    min(pi_old/pi_engine, C)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop zero-variance groups from the fresh batch"""
    dynamic_sampling_rounds: int = 0
    """with dynamic sampling: up to this many extra generation rounds to refill the batch"""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last L_cache tokens before max_new_tokens are penalised (0 =
    off)"""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated responses get no loss"""
    # ---- replay ----------------------------------------------------------------------------------
    replay: Literal[buffer.REPLAY_KINDS] = "prioritized"
    """replay buffer: none | uniform (naive replay) | prioritized (P ∝ |A|^alpha) | headroom-drift
    (group replay)"""
    tau_max: int = 4
    """evict rollouts older than this many loop steps (age = step - version; one loop step holds
    epochs x mini_batches optimizer steps)"""
    replay_ratio: float = 0.5
    """replayed rollouts per fresh rollout in each batch"""
    priority_alpha: float = 1.0
    """priority exponent alpha in P(j) ∝ |A_j|^alpha"""
    replay_capacity: int = 0
    """maximum rollouts stored, oldest out first (0 = unbounded)"""
    hd_headroom: Literal[buffer.HEADROOMS] = "variance"
    """Headroom-Drift: rank stored groups by variance p(1 - p) | failure 1 - p | abs-adv mean |A| (p
    = success rate, at generation) | current p_theta(1 - p_theta) (p_theta: the current policy's
    success rate, importance-weighted over the stored completions, re-scored each step); variance
    and --hd-drift-frac 0.5: the dev split's choice"""
    hd_groups: int = 32
    """Headroom-Drift: stored groups replayed per step (the top ones that pass the drift gate)"""
    hd_candidates: int = 64
    """Headroom-Drift: at most this many groups, in headroom order, get the no-grad drift forward
    each step"""
    hd_drift_frac: float = 0.5
    """Headroom-Drift: skip (keep) a group whose drift mean_i |mean_t log(pi_theta / pi_behaviour)|
    is above this fraction of the nearer clip boundary, min(-log(1 - eps_low), log(1 + eps_high))"""
    # ---- VIGOR -----------------------------------------------------------------------------------
    allocation: Literal[vigor.ALLOCATIONS] = "fixed"
    """completions per prompt: fixed (group_size each) | vigor (variance-guided at the same budget:
    --vigor-*)"""
    vigor_n_init: int = 2
    """VIGOR: completions every prompt starts with"""
    vigor_n_step: int = 2
    """VIGOR: completions added to each chosen prompt per round"""
    vigor_top: int = 16
    """VIGOR: per round, --vigor-rank variance: the prompts (per rank) of highest reward variance
    that get --vigor-n-step more each; marginal: top x n_step completions, one by one to the
    largest gain"""
    vigor_rank: Literal[vigor.RANKS] = "marginal"
    """VIGOR: variance (the top prompts by reward variance) | marginal (the largest drop in sum_q
    sigma_q^2 / n_q per completion: Neyman allocation, n_q ∝ sigma_q); the defaults of --vigor-*
    are the dev split's choice (bench/results/vigor)"""
    vigor_prior: float = 1.0
    """VIGOR: a Beta(a, a) prior on each prompt's success rate, so 2 agreeing completions are not a
    verdict of variance 0 (0 = the empirical rate, the first reading)"""
    vigor_weight: Literal[vigor.WEIGHTS] = "rollout"
    """VIGOR: rollout (a prompt weighs as many rollouts as it got) | prompt (advantages x n_mean /
    n_q: every prompt's group weighs as one prompt)"""
    vigor_budget: int = 0
    """VIGOR: completions per step over all ranks (0 = prompts_per_step x group_size, the fixed
    allocation's)"""
    # ---- R²PO ------------------------------------------------------------------------------------
    r2po_head: Literal[r2po.HEADS] = "none"
    """R²PO: none | residual (training rollouts sampled from base + a low-rank residual head; eval
    uses the base)"""
    r2po_head_rank: int = 64
    """R²PO: rank r of the head W2 ReLU(W1 h): r (d + V) parameters (64: 2% of a 0.5B model)"""
    r2po_schedule: str = "8,10"
    """R²PO: 'H,P' = H loop steps of the head phase (base frozen), then P of the policy phase (head
    frozen), again"""
    r2po_head_lr: float = 1e-3
    """R²PO: the head's AdamW learning rate (the official code: 1e-6 at 3B-8B; the preset's is
    chosen on the dev split)"""
    r2po_kl_coef: float = 0.04
    """R²PO: head phase, coefficient of the k3 KL of the rollout head's policy to the anchor
    (--r2po-kl-anchor; the official code: 0.04)"""
    r2po_kl_anchor: Literal[r2po.KL_ANCHORS] = "initial"
    """R²PO: head phase, the KL's anchor: initial (the model as loaded at step 0, frozen: the
    official code's) | current (the current base policy)"""
    # ---- engine ----------------------------------------------------------------------------------
    engine: Literal[vllm_engine.ENGINES] = "auto"
    """rollout engine: torch (TorchEngine) | vllm (colocated vLLM, docs/gpus.md) | auto (vllm on
    CUDA if installed)"""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of GPU memory for its weights and KV cache (it sleeps while the trainer
    updates)"""
    check_every: int = 10
    """log rollout/logprob_diff (mean |engine - trainer| log-prob, 16 rollouts) every N steps (0 =
    never)"""
    max_logprob_diff: float = 0.1
    """stop with an error when rollout/logprob_diff exceeds this (fp32 engines agree to ~1e-6, bf16
    to ~1e-2)"""
    # ---- eval and logs ---------------------------------------------------------------------------
    eval_every: int = 20
    """evaluate every N steps and at the end (0 = only at the end)"""
    eval_size: int = 500
    """held-out prompts of the built-in task trained on, greedy (eval/accuracy; builtin_steps: its
    own test split); 0 = no test eval"""
    dev_size: int = 0
    """prompts of the built-in task's dev split evaluated greedy as eval/dev_accuracy (0 = none):
    what learning rates are chosen on (bench/compare.py --experiment)"""
    eval_benchmarks: str = ""
    """comma-separated benchmarks (names from data.py or files) also evaluated at each eval:
    eval/<bench>/mean@<k>"""
    eval_k: int = 1
    """samples per problem for --eval-benchmarks"""
    eval_temperature: float = 0.0
    """sampling temperature for --eval-benchmarks (0 = greedy)"""
    data_dir: str = data.DEFAULT_DATA_DIR
    """where named benchmarks (--train-data, --eval-benchmarks) are read from"""
    log_samples: int = 4
    """decoded rollouts written to samples.jsonl each step (rank 0's)"""
    tensorboard: bool = False
    """also write metrics.jsonl's numeric keys as TensorBoard scalars to out_dir/tensorboard
    (requirements-bench.txt)"""


# ---- the bounds ----------------------------------------------------------------------------------

AT_LEAST_1 = ("steps", "prompts_per_step", "max_new_tokens", "micro_batch_size",
              "epochs", "hd_groups", "hd_candidates", "mini_batches", "max_bad_steps", "eval_k",
              "vigor_n_init", "vigor_n_step", "vigor_top", "r2po_head_rank")
AT_LEAST_0 = ("micro_batch_tokens", "tau_max", "replay_ratio", "priority_alpha", "replay_capacity",
              "kl_coef", "tis_cap", "eval_size", "dev_size",
              "dual_clip", "overlong_buffer", "dynamic_sampling_rounds", "lr", "weight_decay",
              "max_grad_norm", "eval_every", "save_every", "log_samples", "threads",
              "eval_temperature", "seed", "check_every", "max_logprob_diff", "hd_drift_frac",
              "vigor_budget", "vigor_prior", "r2po_head_lr", "r2po_kl_coef", "m2po_tau")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_args(args, world: int = 1) -> None:
    """Reject bad input up front with one clear sentence (a ValueError that main prints). Every
    float flag must be finite; the bounds below are what the code can run with, not a judgement of
    taste."""
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {value}")
    for names, low in ((AT_LEAST_1, 1), (AT_LEAST_0, 0)):
        for name in names:
            if getattr(args, name) < low:
                raise ValueError(f"{flag(name)} must be >= {low}, got {getattr(args, name)}")
    for bad, message in _rules(args, world):
        if bad:
            raise ValueError(message)


def _rules(args, world: int) -> list[tuple[bool, str]]:
    """(is it broken, the sentence that says so) for each rule between flags."""
    per_rank = args.prompts_per_step // world
    vigor = args.allocation == "vigor"
    budget = args.vigor_budget or args.prompts_per_step * args.group_size
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
        (not 0 <= args.eps_low <= 1 or args.eps_high < 0,
         f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {args.eps_low}, {args.eps_high}"),
        (0 < args.dual_clip <= 1, f"--dual-clip must be > 1 (or 0 = off), got {args.dual_clip}"),
        (args.mini_batches > per_rank * args.group_size,
         f"--mini-batches ({args.mini_batches}) exceeds the {per_rank * args.group_size} fresh "
         f"rollouts per rank and step: some optimizer steps would have no rollout"),
        (args.veto_threshold <= 0,
         f"--veto-threshold must be > 0 (a ratio below it triggers the veto), "
         f"got {args.veto_threshold}"),
        (args.m2po_tau > 0 and (args.ratio != "token" or args.dual_clip or args.tis_cap),
         "--m2po-tau (M2PO) needs --ratio token, no --dual-clip and no --tis-cap: its mask is of "
         "the token ratio to the behaviour policy, and it has no clip"),
        (args.overlong_buffer > args.max_new_tokens,
         f"--overlong-buffer ({args.overlong_buffer}) cannot exceed --max-new-tokens "
         f"({args.max_new_tokens})"),
        (vigor and args.dynamic_sampling,
         "--allocation vigor and --dynamic-sampling are two ways to spend rollouts: choose one"),
        (vigor and args.vigor_n_init < 2, "--vigor-n-init must be >= 2 (a group needs a baseline)"),
        (vigor and budget < args.vigor_n_init * args.prompts_per_step,
         "--vigor-budget must cover --vigor-n-init completions of every prompt"),
        (args.r2po_head != "none" and args.engine == "vllm",
         "--r2po-head residual needs --engine torch: vLLM cannot add R²PO's head to its logits"),
        (not re.fullmatch(r"\d+,[1-9]\d*", args.r2po_schedule),
         f"--r2po-schedule must be 'H,P' (loop steps of the head phase, >= 0, then of the policy "
         f"phase, >= 1), got {args.r2po_schedule!r}"),
        (args.engine == "vllm" and args.top_p < 1,
         "--top-p < 1 needs --engine torch: vLLM returns log-probs renormalised over the nucleus, "
         "not the full-vocabulary ones"),
        (not 0 < args.gpu_memory_utilization <= 1,
         f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}"),
        (args.tensorboard and importlib.util.find_spec("tensorboard") is None,
         "--tensorboard needs the tensorboard package: pip install -r requirements-bench.txt"),
        (not os.path.isdir(args.model), f"--model: no such directory: {args.model}"),
    ]


AUTO_LOGITS = 2 ** 28        # --micro-batch-tokens 0: logits per micro-batch (1 GiB in fp32)


def micro_batch_tokens(args, model) -> int:
    """--micro-batch-tokens, with 0 resolved to AUTO_LOGITS / the vocabulary size."""
    return args.micro_batch_tokens or max(AUTO_LOGITS // model.config.vocab_size, 1)


def update_memory(args, model, longest_prompt: int) -> int:
    """Bytes an optimizer step needs, roughly: weights, gradients and AdamW's two moments in fp32
    (16 bytes a parameter), plus one micro-batch's activations: per padded token, the fp32 logits
    with their gradient and log-softmax (12 V bytes) and about 34 d bytes a layer in 16 bits
    (Korthikanti et al. 2022, without attention scores)."""
    c = model.config
    rows = args.micro_batch_size * (longest_prompt + args.max_new_tokens)
    tokens = min(micro_batch_tokens(args, model), rows)
    per_token = 12 * c.vocab_size + 34 * c.hidden_size * c.num_hidden_layers
    n_params = sum(p.numel() for p in model.parameters())
    return 16 * n_params + tokens * per_token


def check_sizes(args, model, prompts: list, world: int, device_memory: int | None = None) -> list:
    """Bounds that need the model and the data: a prompt must not appear twice in one step (its two
    groups would share a prompt_id and be merged), the test and dev splits must hold --eval-size
    and --dev-size prompts, and the longest prompt plus --max-new-tokens must fit the model's
    positions. Returns warnings: an update that may not fit `device_memory` bytes (update_memory's
    estimate)."""
    if args.prompts_per_step // world > len(prompts) // world:
        raise ValueError(f"--prompts-per-step ({args.prompts_per_step}) exceeds the {len(prompts)} "
                         f"training prompts (at most {len(prompts) // world * world} on {world} "
                         f"rank(s))")
    for name, split in (("eval_size", "test"), ("dev_size", "dev")):
        n = len(data.builtin_split(args.train_data, split))
        if getattr(args, name) > n:
            raise ValueError(f"{flag(name)} ({getattr(args, name)}) exceeds the {n} prompts of "
                             f"the built-in {split} split")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p.ids) for p in prompts)
    if limit and longest + args.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens ({args.max_new_tokens}) plus the longest prompt "
                         f"({longest} tokens) exceeds the model's {limit} positions")
    need = update_memory(args, model, longest)
    if device_memory is not None and need > device_memory:
        return [f"the update may need about {need / 2**30:.1f} GiB (weights, gradients, AdamW "
                f"and one micro-batch), more than the device's {device_memory / 2**30:.1f} GiB: "
                f"lower --micro-batch-tokens or --micro-batch-size, or use more GPUs"]
    return []
