"""The wings: every method beside GRPO with rollout replay, one file each, and their registry.

A wing is a module of this folder with some of:

    Flags              its flags (a frozen dataclass, composed into train.py's by flags.py)
    PRESETS            {name: (description, {flag: value})}, its --preset entries
    CHOICES            {spine flag: (values,)}: values it adds to a spine flag (--ratio, --replay)
    make(flags, ctx)   the slots it fills for a run, {slot: object} ({} where its flags are off)

`ctx` is `Context`: what the spine hands a wing at set-up (train.setup). The slots, the same for
every method (train.py calls them; the default step calls none):

    allocate   allocate(prompts, mine, pos, *, step, metrics) -> (fresh, generated, pos): steps 1-2
               for a step, in place of fixed groups (it may call ctx.generate and ctx.score)
    reward     reward(rollouts) -> [B], a term added to the shaped reward (one from each method)
    advantage  advantage(rewards, group_ids) -> [B], in place of grpo.grpo_advantages
    loss       an object with any of: batch(mbs) (micro-batches before the normaliser),
               keeps(rollout) (stored for replay?), prepare(model, mbs) (before the first
               micro-batch), restrict(logp, mb, loss_mask, eps) -> (loss_mask, eps),
               log_ratio(logp, old, mask) -> log w (one wing at most), diagnostics(logp, mb,
               log_w, eps) -> {key: 0-dim} (token means, logged)
    replay     the buffer, in place of buffer.make's (sample, add, stats, state_dict, ...)
    phase      an object with phase(step) ("policy" or its own phase), run_phase(model, fresh,
               metrics) for the steps of its own phase, report(metrics, step), at_eval(engine,
               generated, sampling, metrics) and checkpoint save / state_dict / restore

A wing imports the spine, never the reverse: the spine reaches a wing only through this registry
and the slots. Removing a wing (deleting its file, or its line in WINGS) removes its flags and
presets and leaves the rest working.
"""
import importlib
from typing import Callable, NamedTuple

WINGS = ("drgrpo", "gspo", "pnpo", "mu_grpo", "m2po", "dapo", "headroom_drift", "vigor", "r2po")
SLOTS = ("allocate", "reward", "advantage", "loss", "replay", "phase")
LISTS = ("reward", "loss")                                  # every method that fills one adds
SINGLE = ("allocate", "advantage", "replay", "phase")      # one wing at most fills each


def loaded() -> list:
    """The wing modules that import (a missing or unimportable one is left out, not an error)."""
    out = []
    for name in WINGS:
        try:
            out.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
        except ImportError as e:                 # sys.modules[name] = None: made unimportable
            if f"{__name__}.{name}" not in str(e):
                raise
    return out


def owners() -> tuple:
    """Every loaded wing's Flags, in WINGS order."""
    return tuple(w.Flags for w in loaded() if hasattr(w, "Flags"))


def presets() -> dict:
    """Every loaded wing's PRESETS, in WINGS order."""
    return {name: p for w in loaded() for name, p in getattr(w, "PRESETS", {}).items()}


def log_fields() -> tuple:
    """Every loaded wing's fields of the step's log line (LOG), in WINGS order."""
    return tuple(f for w in loaded() for f in getattr(w, "LOG", ()))


def choices(flag: str) -> tuple:
    """The values the loaded wings add to a spine flag (CHOICES)."""
    return tuple(v for w in loaded() for v in getattr(w, "CHOICES", {}).get(flag, ()))


class Context(NamedTuple):
    """What a wing's make() may use: the run's objects and the spine's steps it may call."""
    model: object                   # the policy (sharded under torchrun)
    tok: object
    engine: object
    device: str
    world: int
    initial: object | None          # the frozen model as loaded, when a wing's flags need it
    eps: tuple[float, float]        # the clip range (eps_low, eps_high)
    agg: str                        # the loss aggregation
    dual_clip: float                # --dual-clip (0: off)
    tis_cap: float                  # --tis-cap (0: off)
    ratio: str                      # --ratio: the importance weight (token: the spine's)
    replay: str                     # --replay: the buffer (none, uniform, prioritized: the spine's)
    tau_max: int                    # --tau-max: the replay's age bound
    temperature: float
    max_len: int                    # --max-new-tokens
    group_size: int
    per_rank: int                   # prompts this rank generates groups for each step
    completions: int                # the step's completions per rank (0: fixed groups)
    micro_batch: tuple[int, int]    # (rows, padded tokens) per micro-batch at most
    max_grad_norm: float
    logprobs: Callable              # logprobs(rollouts) -> per-token log-probs, no grad, lockstep
    sampling: Callable              # sampling(step, round_) -> the training rollouts' Sampling
    grade: Callable                 # grade(rollouts): r.correct and r.formatted, set once
    generate: Callable              # generate(prompts, n, step, round_) -> rollouts, graded
    score: Callable                 # score(rollouts) -> verdicts [B] (r.reward, r.advantage set)
    credit: Callable                # credit(rollouts) -> [B] the verdict's term of the reward


def build(parts: dict, ctx: Context) -> dict:
    """{slot: what fills it} for a run: every loaded wing's make(its flags, ctx); "reward" and
    "loss" are lists (in WINGS order), every other slot one object or absent. ValueError where two
    wings fill one slot."""
    slots: dict = {name: [] for name in LISTS}
    for wing in loaded():
        if not hasattr(wing, "make"):
            continue
        filled = wing.make(parts.get(getattr(wing, "Flags", None)), ctx)
        for slot, obj in filled.items():
            if slot in LISTS:
                slots[slot].append(obj)
            elif slot in slots:
                raise ValueError(f"{slots[slot][1]} and {wing.__name__} both fill the {slot} "
                                 f"slot: choose one")
            else:
                slots[slot] = (obj, wing.__name__)
    return {k: v if k in LISTS else v[0] for k, v in slots.items()}
