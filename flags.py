"""Command-line flags from a dataclass: one `--flag` per field, the string under the field as its help, a
`Literal[...]` type as its allowed values (used by train.py and eval.py); and the bounds of train.py's flags, so that
bad input ends in one clear sentence before anything runs.

    @dataclass
    class Args:
        ratio: Literal["token", "gspo"] = "token"
        \"\"\"importance weight\"\"\"
    args = flags.parse(Args, sys.argv[1:], description=__doc__)      # --ratio {token,gspo}, help from the docstring
"""
import argparse
import ast
import dataclasses
import inspect
import math
import os
import typing

import data


def field_docs(cls) -> dict[str, str]:
    """The string literal under each dataclass field, whitespace folded, which becomes its --help text."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {a.target.id: " ".join(b.value.value.split()) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def choices(cls, name: str) -> tuple | None:
    """The allowed values of a `Literal[...]` field, else None."""
    hint = typing.get_type_hints(cls)[name]
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def parse(cls, argv=None, description: str = "", formatter=argparse.RawDescriptionHelpFormatter,
          presets: dict | None = None):
    """An instance of the flags dataclass `cls` from the command line; bools are --flag / --no-flag. A bad value
    (unknown choice, not a number) ends in argparse's one `error:` line and exit status 2. With `presets` ({name:
    (description, {field: value})}, `cls` has a `preset` field): the command line is parsed twice, the second time
    with the chosen preset's values as the defaults, so a flag given explicitly wins over its preset."""
    epilog = "presets (--preset NAME):\n" + "\n".join(f"  {name:15s} {text}" for name, (text, _) in presets.items()) \
        if presets else None
    ap = argparse.ArgumentParser(description=description, formatter_class=formatter, epilog=epilog)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        kw = dict(default=f.default, help=f"{docs[f.name]} (default: {f.default!r})", choices=choices(cls, f.name))
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = type(f.default)
        ap.add_argument("--" + f.name.replace("_", "-"), **kw)
    ns = ap.parse_args(argv)
    if presets and ns.preset in presets:
        ap.set_defaults(**presets[ns.preset][1])
        ns = ap.parse_args(argv)
    return cls(**vars(ns))


# ---- train.py's presets: one per paper (README's Methods table says what was read and what inferred) -----------------

PRESETS = {
    "grpo": ("original GRPO (DeepSeekMath, arXiv 2402.03300): no replay, symmetric clip 0.2, per-sequence token mean",
             dict(replay="none", adv="grpo", ratio="token", agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.2)),
    "dapo": ("DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token mean, dynamic sampling, overlong shaping and "
             "filter, 16 updates per step",
             dict(replay="none", adv="grpo", ratio="token", agg="token-mean", eps_low=0.2, eps_high=0.28,
                  dynamic_sampling=True, dynamic_sampling_rounds=3, overlong_buffer=2, overlong_filter=True,
                  mini_batches=16)),
    "drgrpo": ("Dr. GRPO (arXiv 2503.20783): advantage r - mean (no std), token sum / (G L_max), no replay",
               dict(replay="none", adv="drgrpo", ratio="token", agg="seq-mean-token-sum-norm", eps_low=0.2,
                    eps_high=0.2)),
    "gspo": ("GSPO (arXiv 2507.18071): sequence ratio, clip 3e-4/4e-4, 4 mini-batches per step, no replay",
             dict(replay="none", ratio="gspo", agg="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4,
                  mini_batches=4)),
    "pnpo": ("PNPO (arXiv 2608.01418): prefix geometric-mean ratio, 4 epochs per batch (off-policy regime)",
             dict(replay="none", ratio="pnpo", epochs=4)),
    "rollout-replay": ("rollout-level |A|-prioritized replay (arXiv 2606.04560): the defaults",
                       dict(replay="prioritized", priority_alpha=1.0, tau_max=4, replay_ratio=0.5)),
    "naive-replay": ("naive uniform rollout replay, the baseline of arXiv 2606.04560",
                     dict(replay="uniform", tau_max=4, replay_ratio=0.5)),
    "headroom-drift": ("Headroom-Drift group replay (abstract only): rank groups by p(1-p), gate by drift",
                       dict(replay="headroom-drift", headroom="variance", tau_max=4, replay_groups=32,
                            drift_candidates=64, drift_max=0.25)),
    "mu-grpo": ("mu-GRPO (arXiv 2605.17570, project page): 4 stages of 512 prompts x 64 updates, clip [0, 5], veto",
                dict(replay="none", eps_low=1.0, eps_high=4.0, veto_scope="suffix", veto_threshold=1e-4, steps=4,
                     prompts_per_step=512, mini_batches=64, eval_every=1)),
    "vigor": ("VIGOR (abstract only): variance-guided rollout allocation at the fixed allocation's budget, no replay",
              dict(replay="none", allocation="vigor", n_init=2, n_step=2, vigor_top=16)),
}


# ---- train.py's bounds ---------------------------------------------------------------------------------------

AT_LEAST_1 = ("steps", "prompts_per_step", "max_new_tokens", "micro_batch_size", "eval_size", "epochs",
              "replay_groups", "drift_candidates",
              "mini_batches", "max_bad_steps", "eval_k", "n_init", "n_step", "vigor_top")
AT_LEAST_0 = ("tau_max", "replay_ratio", "priority_alpha", "replay_capacity", "kl_coef", "tis_cap", "dual_clip",
              "overlong_buffer", "dynamic_sampling_rounds", "lr", "weight_decay", "max_grad_norm", "eval_every",
              "save_every", "log_samples", "threads", "eval_temperature", "seed", "check_every", "max_logprob_diff",
              "drift_max", "rollout_budget")


def check_args(args, world: int = 1) -> None:
    """Reject bad input up front with one clear sentence (a ValueError that main prints). Every float flag must be
    finite; the bounds below are what the code can run with, not a judgement of taste."""
    flag = lambda name: "--" + name.replace("_", "-")                         # noqa: E731
    for f in dataclasses.fields(args):
        if isinstance(getattr(args, f.name), float) and not math.isfinite(getattr(args, f.name)):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {getattr(args, f.name)}")
    for names, low in ((AT_LEAST_1, 1), (AT_LEAST_0, 0)):
        for name in names:
            if getattr(args, name) < low:
                raise ValueError(f"{flag(name)} must be >= {low}, got {getattr(args, name)}")
    per_rank = args.prompts_per_step // world
    for bad, message in [
        (args.prompts_per_step % world, f"--prompts-per-step ({args.prompts_per_step}) must be divisible by the world "
                                        f"size ({world}): every rank generates whole groups for an equal share"),
        (args.group_size < 2, f"--group-size must be >= 2 (a GRPO group needs a baseline), got {args.group_size}"),
        (args.seed >= 2 ** 31, f"--seed must be below 2**31 (sampling seeds are derived from it), got {args.seed}"),
        (args.threads > 1024, f"--threads must be at most 1024, got {args.threads}"),
        (args.temperature <= 0, "--temperature must be > 0: greedy decoding gives a group of identical completions"),
        (not 0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}"),
        (not 0 <= args.eps_low <= 1 or args.eps_high < 0,
         f"need 0 <= --eps-low <= 1 and --eps-high >= 0, got {args.eps_low}, {args.eps_high}"),
        (0 < args.dual_clip <= 1, f"--dual-clip must be > 1 (or 0 = off), got {args.dual_clip}"),
        (args.mini_batches > per_rank * args.group_size,
         f"--mini-batches ({args.mini_batches}) exceeds the {per_rank * args.group_size} fresh rollouts per rank and "
         f"step: some optimizer steps would have no rollout"),
        (args.veto_threshold <= 0, f"--veto-threshold must be > 0 (a ratio below it triggers the veto), "
                                   f"got {args.veto_threshold}"),
        (args.overlong_buffer > args.max_new_tokens,
         f"--overlong-buffer ({args.overlong_buffer}) cannot exceed --max-new-tokens ({args.max_new_tokens})"),
        (args.allocation == "vigor" and args.dynamic_sampling, "--allocation vigor and --dynamic-sampling are two "
                                                                "ways to spend rollouts: choose one"),
        (args.allocation == "vigor" and args.n_init < 2, "--n-init must be >= 2 (a group needs a baseline)"),
        (args.allocation == "vigor" and (args.rollout_budget or args.prompts_per_step * args.group_size)
         < args.n_init * args.prompts_per_step, "--rollout-budget must cover --n-init completions of every prompt"),
        (args.engine == "vllm" and args.top_p < 1, "--top-p < 1 needs --engine torch: vLLM returns log-probs "
                                                   "renormalised over the nucleus, not the full-vocabulary ones"),
        (not 0 < args.gpu_memory_utilization <= 1, f"--gpu-memory-utilization must be in (0, 1], "
                                                    f"got {args.gpu_memory_utilization}"),
        (not os.path.isdir(args.model), f"--model: no such directory: {args.model}")]:
        if bad:
            raise ValueError(message)


def check_sizes(args, model, prompts: list, world: int) -> None:
    """Bounds that need the model and the data: a prompt must not appear twice in one step (its two groups would
    share a prompt_id and be merged), the eval split must hold --eval-size prompts, and the longest prompt plus
    --max-new-tokens must fit the model's positions."""
    if args.prompts_per_step // world > len(prompts) // world:
        raise ValueError(f"--prompts-per-step ({args.prompts_per_step}) exceeds the {len(prompts)} training prompts "
                         f"(at most {len(prompts) // world * world} on {world} rank(s))")
    n_test = len(data.builtin_test(args.train_data))
    if args.eval_size > n_test:
        raise ValueError(f"--eval-size ({args.eval_size}) exceeds the {n_test} prompts of the built-in test split")
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p.ids) for p in prompts)
    if limit and longest + args.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens ({args.max_new_tokens}) plus the longest prompt ({longest} tokens) "
                         f"exceeds the model's {limit} positions")
