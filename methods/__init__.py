"""The wings: every method beside GRPO with rollout replay, one file each, and their registry.

A wing is a module of this folder with some of:

    Flags                    its flags (a frozen dataclass, composed into train.py's by flags.py)
    PRESETS                  {name: (description, {flag: value})}, its --preset entries
    CHOICES                  {spine flag: (values,)}: values it adds to a spine flag (--ratio, ...)
    LOG                      its fields of the step's log line (metrics.fields format strings)
    COMBINE                  how each of its metrics keys combines over micro-batches and ranks
                             (metrics.Metrics: "mean tokens", "sum", "max", ...)
    make(flags, run, steps)  the slots it fills for a run, {slot: object} ({} where its flags are
                             off), at the door (run_setup.build)

`run` is the run (run_setup.Run; its fields are documented there) behind a read-only view
(`ReadOnly`): a wing reads it and never changes it, setting a field is an error; what a wing makes
for the run it returns as slots, which the door puts in place. `run.settings` holds each owner's
flags (the spine's; a wing's own come as `flags`). `steps` is `Steps`, the spine's step functions
a wing may call, each train.py's own.

The slots, the same for every method (the default step fills none):

    allocate   allocate(prompts, mine, pos, *, step) -> (fresh, generated, pos, metrics.Metrics):
               1. and 2. of a step in place of fixed groups (train.generate_and_score calls it)
    reward     reward(rollouts) -> [B], a term added to the shaped reward (every wing's adds)
    advantage  advantage(rewards, group_ids) -> [B], in place of grpo.grpo_advantages
    loss       an object with any of the six methods of `LossHooks` (every wing's adds)
    replay     the buffer, in place of buffer.make's: sample(step, n_fresh) -> replayed rollouts,
               add(rollouts, step), stats() -> {key: value}, state_dict(), load_state_dict(state),
               and COMBINE, how stats() combine (buffer.report)
    step       wrap(train_step) -> a function of train_step's signature, run in its place: a
               wrapper around the loop step that owns its schedule, its report and its state
               (train_step(run, pos, *, step, guard) -> rollout.StepOut)
    head       a module h -> residual logits that the torch engine samples the training rollouts
               through (engine.TorchEngine.logits_head; the door hands it over: R²PO's head)

One wing at most fills each slot but reward and loss. Any slot object with state_dict() and
load_state_dict(state) (the replay, a step wrapper; not the head, whose weights its method's state
keeps) has that state saved in every checkpoint's rank files and restored on resume
(checkpoint.py).

A wing imports the spine, never the reverse: the spine reaches a wing only through this registry
and the slots. Adding a method is its file and its line in WINGS (docs/methods.md, "Add a
method"); removing one is deleting both, which removes its flags and presets and leaves the rest
working (a registered name whose file is gone is left out; a file not registered is an error).
"""
import importlib
import os
from typing import Callable, NamedTuple

# The registry: one line a method file (its module name), in the order --help, the presets, the
# log line and the list slots take them. A file of this folder not named here is an error at start
# (unregistered, checked by flags.check_args), not a method silently left out.
WINGS = (
    "drgrpo",
    "gspo",
    "pnpo",
    "mu_grpo",
    "m2po",
    "dapo",
    "headroom_drift",
    "vigor",
    "r2po",
)
SLOTS = ("allocate", "reward", "advantage", "loss", "replay", "step", "head")
LISTS = ("reward", "loss")                                  # every method that fills one adds
SINGLE = ("allocate", "advantage", "replay", "step", "head")  # one wing at most fills each


class Steps(NamedTuple):
    """The spine's step functions a wing may call (train.py's own; each takes the run first)."""
    sampling: Callable            # sampling(run, step, round_) -> the Sampling of that round
    generate: Callable            # generate(run, prompts, n, step, round_) -> rollouts, graded
    grade: Callable               # grade(run, rollouts): sets r.correct and r.formatted
    score: Callable               # score(run, rollouts) -> verdicts [B]; sets reward, advantage
    credit: Callable              # credit(rollouts, reward_flags) -> [B], the verdict's term
    generate_and_score: Callable  # generate_and_score(run, pos, step) -> (fresh, generated,
                                  # pos, Metrics): 1. and 2. of a step, the allocate slot's too
    canary: Callable              # canary(run, generated, step) -> Metrics: the engine check,
                                  # every --check-every steps, run while the engine sleeps


class LossHooks(NamedTuple):
    """The loss slot's methods, gathered from every wing that fills it (`loss_hooks`), each called
    where train.py's update reaches it; all empty by default."""
    batch: list           # batch(mbs) -> mbs: a mini-batch's micro-batches, before the normaliser
    keeps: list           # keeps(rollout) -> whether a fresh rollout is stored for replay
    prepare: list         # prepare(model, mbs) -> mbs: an optimizer step's micro-batches, with
                          # what a pass over them all found, before the first backward
    restrict: list        # restrict(logp, mb, loss_mask, eps) -> (loss_mask, eps, {key: 0-dim}):
                          # a narrower loss mask or clip range, and token means to log
                          # (each declared in its COMBINE: "mean tokens")
    ratio: object | None  # log_ratio(logp, old, mask) -> log w, in place of the token ratio (one)
    diagnostics: list     # diagnostics(logp, mb, log_w, eps) -> {key: 0-dim}: token means, logged
                          # (its COMBINE too)


def loss_hooks(wings: list) -> LossHooks:
    """The LossHooks of the loss slot's objects, in WINGS order."""
    def of(name):
        return [getattr(w, name) for w in wings if hasattr(w, name)]
    ratios = of("log_ratio")
    return LossHooks(of("batch"), of("keeps"), of("prepare"), of("restrict"),
                     ratios[0] if ratios else None, of("diagnostics"))


NO_LOSS_HOOKS = LossHooks([], [], [], [], None, [])


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


def unregistered() -> list[str]:
    """The files of this folder (methods/) that WINGS does not name: a method written but not
    registered, which the registry would otherwise leave out without a word."""
    folder = os.path.dirname(os.path.abspath(__file__))
    files = sorted(f for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    return [f for f in files if f[:-3] not in WINGS]


def owners() -> tuple:
    """Every loaded wing's Flags, in WINGS order."""
    return tuple(w.Flags for w in loaded() if hasattr(w, "Flags"))


def presets() -> dict:
    """Every loaded wing's PRESETS, in WINGS order."""
    return {name: p for w in loaded() for name, p in getattr(w, "PRESETS", {}).items()}


def log_fields() -> tuple:
    """Every loaded wing's fields of the step's log line (LOG), in WINGS order."""
    return tuple(f for w in loaded() for f in getattr(w, "LOG", ()))


def combine() -> dict:
    """Every loaded wing's COMBINE: how its metrics keys combine (the loss slot's token means)."""
    return {key: rule for w in loaded() for key, rule in getattr(w, "COMBINE", {}).items()}


def choices(flag: str) -> tuple:
    """The values the loaded wings add to a spine flag (CHOICES)."""
    return tuple(v for w in loaded() for v in getattr(w, "CHOICES", {}).get(flag, ()))


class ReadOnly:
    """The run as a wing's make() sees it: every field of the run to read, none to set."""
    __slots__ = ("_run",)

    def __init__(self, run):
        object.__setattr__(self, "_run", run)

    def __getattr__(self, name: str):
        return getattr(self._run, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"run.{name}: a method's make() may read the run, not change it; "
                             "return what it makes as a slot (methods/__init__.py)")


def build(parts: dict, run, steps: Steps) -> dict:
    """{slot: what fills it} for a run: every loaded wing's make(its flags, the run read-only,
    steps); "reward" and "loss" are lists (in WINGS order), every other slot one object or absent.
    ValueError where two wings fill one slot."""
    slots: dict = {name: [] for name in LISTS}
    view = ReadOnly(run)
    for wing in loaded():
        if not hasattr(wing, "make"):
            continue
        filled = wing.make(parts.get(getattr(wing, "Flags", None)), view, steps)
        for slot, obj in filled.items():
            if slot in LISTS:
                slots[slot].append(obj)
            elif slot in slots:
                raise ValueError(f"{slots[slot][1]} and {wing.__name__} both fill the {slot} "
                                 f"slot: choose one")
            else:
                slots[slot] = (obj, wing.__name__)
    return {k: v if k in LISTS else v[0] for k, v in slots.items()}
