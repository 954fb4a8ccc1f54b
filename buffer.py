"""Replay: a rollout-level, advantage-prioritized, age-bounded buffer for GRPO (`RolloutReplay`).

    python buffer.py          # fills a toy buffer, samples from it, prints the stats

In the trainer, at each step (fresh = this step's scored rollouts, advantages set, version = step):

    replay = make(flags, seed=0)                             # once; None for --replay none
    batch = fresh + replay.sample(step, len(fresh))          # fresh first, the replayed after
    replay.add(fresh, step)
    report(replay, metrics)                                  # its numbers, as COMBINE says

Implements the replay buffer of "Rollout-Level Advantage-Prioritized Experience Replay for GRPO"
(Yoo et al., arXiv 2606.04560):

- **Rollout level.** The buffer stores individual rollouts, never whole groups. Each keeps the
  advantage it got in its own fresh group and its behaviour log-probs, unchanged for life: replay
  never recomputes either.
- **Age eviction.** With age_j = step - version_j, a rollout with age_j > tau_max is gone before the
  next sample (age == tau_max is still replayable).
- **Priority.** Replayed rollouts are drawn by advantage magnitude,

      P(j) = |A_j|^alpha / sum_k |A_k|^alpha        (k over the eligible rollouts)

  alpha = 0 is uniform replay (the naive-replay baseline); with alpha > 0 a rollout with A_j = 0 has
  P(j) = 0 and is never drawn. A third draw, `nonzero`, is the prioritized draw's support without
  its weighting: uniform among the eligible rollouts with A_j != 0 (not the paper's; the control
  that separates "drop the rollouts that carry no gradient" from "weight by |A|").
- **What the priority favours** (a property of GRPO's advantages, not a choice made here).
  Advantages sum to zero within a group, so at alpha = 1 a group's positive and negative rollouts
  hold equal total priority, and a draw replays A > 0 and A < 0 about equally often whatever the
  group's difficulty. With a binary reward and k of G right (p = k / G), the correct rollouts get
  A = (1 - p) / s and the wrong ones -p / s, s = sqrt(p (1 - p)) (times sqrt(G / (G - 1)) with
  Bessel's correction, grpo.grpo_advantages'), so the group's total

      sum_i |A_i| = 2 G p (1 - p) / s  ∝  sqrt(p (1 - p))

  is largest for mid-difficulty groups (k = 4 of 8 holds 1.51x the priority of k = 1 of 8) and 0
  for a group all right or all wrong. The `nonzero` draw instead weighs every group with A != 0
  alike (each of its G rollouts once) and draws a group's positives and negatives k : G - k; the
  uniform draw does the same among all groups, flat ones included. `replay/sampled_positive`
  logs how many replayed rollouts had A > 0 at each draw (tests/test_buffer.py checks all this
  on hand-made groups).
- **Fresh-anchored composition.** `sample(step, n_fresh)` returns only replayed rollouts, k =
  round(ratio * n_fresh) of them; the trainer's batch at `step` is every fresh rollout of `step`
  followed by these. Eligible rollouts have version < step: rollouts of the current step are
  excluded, so without a capacity bound the trainer may call `add(fresh, step)` before or after
  `sample(step, n)` and get the same draw (calling `sample` first is the natural order, and with
  a capacity bound it keeps fresh rollouts from pushing out replayable ones before they are
  drawn).

Departures and definitional choices (the paper states only the proportionality above):
- k > 1 draws are *successive* draws without replacement (no duplicates in one batch): the first
  draw follows P(j) exactly, each later draw follows P renormalised over the rollouts not yet drawn
  (what numpy's `Generator.choice(replace=False, p=P)` does). So for k > 1 the inclusion probability
  of a rollout is not k * P(j) but the successive-sampling one, e.g. for k = 2: P(j) + sum_{i != j}
  P(i) P(j) / (1 - P(i)). Implemented with Efraimidis–Spirakis keys in their exponential form: key_j
  = E_j / w_j with E_j ~ Exp(1) and w_j = |A_j|^alpha; the k smallest keys are the draw, in draw
  order. Computed in logs, log key_j = log E_j - alpha log|A_j|, so no |A|^alpha can overflow or
  underflow to 0.
- Fewer than k eligible (positive-weight) rollouts: all of them are returned.
- Optional capacity bound: after `add`, the oldest rollouts (lowest version, then earliest inserted)
  are dropped until `len(buffer) <= capacity`.
- `make(flags)` with `--replay none` returns None: no replay is an absent buffer, and the
  trainer's `if replay is not None` shows it at the line where the batch is built.

Storage: a numpy object array of records next to parallel numpy arrays of version and |A|, in
insertion order; eviction compacts all three with one boolean mask and sampling is vectorised, so
neither loops over rollouts in Python. The buffer holds references to the caller's `Rollout` objects
and never writes to them; callers must treat what `sample` returns as read-only.
"""
import textwrap
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from rollout import Rollout

KINDS = ("none", "uniform", "prioritized", "nonzero")   # a method file may add its own (methods/)


@dataclass(frozen=True)
class Flags:
    # ---- replay ----------------------------------------------------------------------------------
    replay: Literal[KINDS] = "prioritized"
    """replay buffer: none | uniform (naive replay) | prioritized (P ∝ |A|^alpha) | nonzero
    (uniform among rollouts with A != 0) | a method's"""
    tau_max: int = 4
    """evict rollouts older than this many loop steps (age = step - version; one loop step holds
    epochs x mini_batches optimizer steps)"""
    replay_ratio: float = 0.5
    """replayed rollouts per fresh rollout in each batch"""
    priority_alpha: float = 1.0
    """priority exponent alpha in P(j) ∝ |A_j|^alpha"""
    replay_capacity: int = 0
    """maximum rollouts stored, oldest out first (0 = unbounded)"""

    AT_LEAST_0 = ("tau_max", "replay_ratio", "priority_alpha", "replay_capacity")

    def rules(self) -> list[tuple[bool, str]]:
        """(is it broken, the sentence that says so) for each rule between these flags."""
        return [(self.replay != "none" and self.replay_ratio > 0 and self.tau_max == 0,
                 "--tau-max 0 keeps only the step's own rollouts, never replayed: set it >= 1 "
                 "or --replay none")]


class RolloutReplay:
    """Rollout-level replay with age eviction (tau_max) and priority |A|^alpha; see the module
    docstring. `ratio`: replayed rollouts per fresh one (k = round(ratio * n_fresh) in `sample`).
    `nonzero`: draw only rollouts with A != 0 (with alpha = 0: uniform among them; alpha > 0 draws
    only those anyway). COMBINE says how its stats combine over ranks (`report`)."""
    # a mean over the count of what it averages (another key), the oldest age, every count a total
    COMBINE = {"replay/age_mean": "mean replay/sampled",
               "replay/abs_adv_sampled": "mean replay/sampled",
               "replay/abs_adv_stored": "mean replay/size",
               "replay/abs_adv_stored_nonzero": "mean replay/stored_nonzero",
               "replay/age_max": "max",
               **dict.fromkeys(("replay/size", "replay/evicted", "replay/capacity_dropped",
                                "replay/sampled", "replay/sampled_nonzero",
                                "replay/sampled_positive", "replay/ess", "replay/stored_nonzero"),
                               "sum")}

    def __init__(self, tau_max: int, alpha: float = 1.0, capacity: int | None = None, seed: int = 0,
                 ratio: float = 1.0, nonzero: bool = False):
        check_args(tau_max, alpha, capacity)
        if not np.isfinite(ratio) or ratio < 0:
            raise ValueError(f"replay: ratio must be a finite number >= 0, got {ratio!r}")
        self.tau_max = int(tau_max)
        self.alpha = float(alpha)
        self.capacity = capacity
        self.seed = int(seed)
        self.ratio = float(ratio)
        self.nonzero = bool(nonzero)
        self._rng = np.random.default_rng(seed)
        self._clear()

    def _clear(self) -> None:
        self._records = np.empty(0, dtype=object)      # [N] Rollout, insertion order
        self._version = np.empty(0, dtype=np.int64)    # [N] version of each record
        self._abs_adv = np.empty(0, dtype=np.float64)  # [N] |advantage| of each record
        self._positive = np.empty(0, dtype=bool)        # [N] advantage > 0
        self._last = {"replay/evicted": 0, "replay/capacity_dropped": 0, **empty_sample_stats(),
                      "replay/sampled_positive": 0, "replay/ess": 0.0}

    def __len__(self) -> int:
        return len(self._records)

    # ---- store -----------------------------------------------------------------------------------
    def add(self, rollouts: list[Rollout], step: int) -> None:
        """Store each rollout as given (a reference; its advantage and logprobs are never touched).

        `step` is the trainer's current step; a rollout with version > step would come from the
        future and is an error, as is a non-finite advantage (it would poison every priority)."""
        n = len(rollouts)
        if n == 0:
            return
        records = np.empty(n, dtype=object)
        records[:] = rollouts                           # one slot per rollout, never unpacked
        version = np.fromiter((r.version for r in rollouts), dtype=np.int64, count=n)
        adv = np.fromiter((r.advantage for r in rollouts), dtype=np.float64, count=n)
        if not np.isfinite(adv).all():
            raise ValueError("replay: every rollout's advantage must be finite")
        if (version > step).any():
            raise ValueError(f"replay: add at step {step} got a rollout with version "
                             f"{int(version.max())} > step")
        self._records = np.concatenate([self._records, records])
        self._version = np.concatenate([self._version, version])
        self._abs_adv = np.concatenate([self._abs_adv, np.abs(adv)])
        self._positive = np.concatenate([self._positive, adv > 0])
        self._last["replay/capacity_dropped"] = self._enforce_capacity() if self.capacity else 0

    def _enforce_capacity(self) -> int:
        """Drop the oldest records (lowest version, ties by insertion order) to len <= capacity."""
        excess = len(self) - (self.capacity if self.capacity is not None else len(self))
        if excess <= 0:
            return 0
        # stable sort: ties stay in insertion order
        oldest = np.argsort(self._version, kind="stable")[:excess]
        keep = np.ones(len(self), dtype=bool)
        keep[oldest] = False
        self._compact(keep)
        return int(excess)

    def _compact(self, keep: np.ndarray) -> None:
        self._records = self._records[keep]
        self._version = self._version[keep]
        self._abs_adv = self._abs_adv[keep]
        self._positive = self._positive[keep]

    # ---- evict -----------------------------------------------------------------------------------
    def evict(self, step: int) -> int:
        """Remove every rollout with age = step - version > tau_max; returns how many went."""
        # [N] age == tau_max is kept (the paper: "older than")
        keep = (step - self._version) <= self.tau_max
        evicted = int(len(self) - keep.sum())
        if evicted:
            self._compact(keep)
        self._last["replay/evicted"] = evicted
        return evicted

    # ---- sample ----------------------------------------------------------------------------------
    def sample(self, step: int, n_fresh: int) -> list[Rollout]:
        """The replayed part of the batch at `step` for `n_fresh` fresh rollouts: evict by age, then
        draw up to k = round(ratio * n_fresh) distinct rollouts with version < step, P(j) ∝
        |A_j|^alpha."""
        k = round(self.ratio * n_fresh)
        if k < 0:
            raise ValueError(f"replay: sample size k must be >= 0, got {k}")
        self.evict(step)
        # Fresh-anchored: the current step's rollouts are the batch's fresh part, never its replayed
        # part.
        eligible = self._version < step                 # [N]
        if self.alpha > 0 or self.nonzero:
            eligible &= self._abs_adv > 0  # w_j = 0 for A_j = 0 (also avoids log 0 below)
        cand = np.flatnonzero(eligible)                 # [M] indices of candidates
        picked = cand[self._draw_without_replacement(self._abs_adv[cand], k)]  # [min(k, M)]
        self._record_sample(picked, step)
        self._last["replay/ess"] = (effective_size(self._abs_adv[cand], self.alpha)
                                    if len(picked) else 0.0)            # 0: nothing drawn
        return self._records[picked].tolist()

    def _draw_without_replacement(self, abs_adv: np.ndarray, k: int) -> np.ndarray:
        """Positions of min(k, M) successive draws without replacement with P ∝ abs_adv^alpha, in
        draw order.

        Efraimidis–Spirakis in exponential form: key_j = E_j / w_j, E_j ~ Exp(1); the smallest key
        is a draw with P(j) = w_j / sum w, the next smallest a draw from the rest, and so on. In
        logs for range safety: log key_j = log E_j - alpha * log|A_j|. One E_j per candidate, so the
        RNG advances identically for the same buffer contents (what makes a resumed run sample the
        same rollouts)."""
        m = len(abs_adv)
        log_key = np.log(self._rng.standard_exponential(m))  # [M]
        if self.alpha > 0:
            log_key -= self.alpha * np.log(abs_adv)          # [M] abs_adv > 0 here, see sample()
        k = min(k, m)
        if k == m:
            return np.argsort(log_key, kind="stable")
        first = np.argpartition(log_key, k)[:k]              # the k smallest keys, unordered
        return first[np.argsort(log_key[first], kind="stable")]

    def _record_sample(self, picked: np.ndarray, step: int) -> None:
        self._last.update({**empty_sample_stats(), "replay/sampled_positive": 0})
        if len(picked):
            age = step - self._version[picked]               # [K]
            self._last.update({"replay/sampled": int(len(picked)),
                               "replay/age_mean": float(age.mean()),
                               "replay/age_max": int(age.max()),
                               "replay/abs_adv_sampled": float(self._abs_adv[picked].mean()),
                               "replay/sampled_nonzero": int((self._abs_adv[picked] > 0).sum()),
                               "replay/sampled_positive": int(self._positive[picked].sum())})

    # ---- metrics and checkpointing ---------------------------------------------------------------
    def stats(self) -> dict:
        """Flat namespaced metrics. replay/size and replay/abs_adv_stored (mean |A| over every
        stored rollout, eligible for the next draw or not), replay/stored_nonzero (how many of them
        have A != 0) and replay/abs_adv_stored_nonzero (their mean |A|) describe the buffer now;
        replay/evicted the last evict (age); replay/capacity_dropped the last add; the rest the
        last sample (replay/sampled_nonzero: the drawn with A != 0, replay/sampled_positive: with A
        > 0; replay/ess: the draw's effective number of candidates, effective_size, summed over
        ranks under torchrun, each rank drawing from its own buffer; 0 when it drew nothing, so the
        JSON stays finite)."""
        nonzero = self._abs_adv[self._abs_adv > 0]                  # [N'] stored with A != 0
        return {"replay/size": len(self), **self._last,
                "replay/abs_adv_stored": float(self._abs_adv.mean()) if len(self) else 0.0,
                "replay/stored_nonzero": len(nonzero),
                "replay/abs_adv_stored_nonzero": float(nonzero.mean()) if len(nonzero) else 0.0}

    def state_dict(self) -> dict:
        """Everything needed to resume exactly, as plain Python data (dicts, lists, ints, floats,
        str), so that pickle and torch.save / torch.load(weights_only=True) both round-trip it."""
        return {"tau_max": self.tau_max, "alpha": self.alpha, "capacity": self.capacity,
                "nonzero": self.nonzero, "seed": self.seed,
                "rollouts": [asdict(r) for r in self._records],
                "rng": self._rng.bit_generator.state, "last": dict(self._last)}

    def load_state_dict(self, sd: dict) -> None:
        """Restore contents, RNG and last stats. The hyperparameters must match this buffer's: a
        resumed run with a different tau_max, alpha, capacity or draw could not replay the same
        data, so that is an error (a checkpoint from before the nonzero draw has nonzero False)."""
        check_same({"nonzero": False, **sd}, self, ("tau_max", "alpha", "capacity", "nonzero"))
        self.seed = sd["seed"]
        self._clear()
        rollouts = [Rollout(**d) for d in sd["rollouts"]]
        if rollouts:
            self.add(rollouts, step=max(r.version for r in rollouts))
        self._rng.bit_generator.state = sd["rng"]
        self._last = dict(sd["last"])


def empty_sample_stats() -> dict:
    return {"replay/sampled": 0, "replay/age_mean": 0.0, "replay/age_max": 0,
            "replay/abs_adv_sampled": 0.0, "replay/sampled_nonzero": 0}


def effective_size(abs_adv: np.ndarray, alpha: float) -> float:
    """The effective number of candidates of one draw, 1 / sum_j P(j)^2 with P(j) ∝ |A_j|^alpha
    over the M candidates (M for a uniform draw, fewer the more the priority concentrates it; 0
    with none): (sum w)^2 / sum w^2, with w scaled by its largest value so no power overflows."""
    if len(abs_adv) == 0:
        return 0.0
    if alpha == 0:
        return float(len(abs_adv))
    w = np.exp(alpha * (np.log(abs_adv) - np.log(abs_adv.max())))      # [M] in (0, 1]
    return float(w.sum() ** 2 / (w ** 2).sum())


def check_args(tau_max, alpha, capacity) -> None:
    if isinstance(tau_max, bool) or not isinstance(tau_max, (int, np.integer)) or tau_max < 0:
        raise ValueError(f"replay: tau_max must be an integer >= 0, got {tau_max!r}")
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"replay: priority alpha must be a finite number >= 0, got {alpha!r}")
    whole = isinstance(capacity, (int, np.integer)) and not isinstance(capacity, bool)
    if capacity is not None and (not whole or capacity < 1):
        raise ValueError(f"replay: capacity must be an integer >= 1 or None, got {capacity!r}")


def check_same(sd: dict, buffer, names) -> None:
    """A resumed buffer must have the checkpoint's hyperparameters, or it could not replay alike."""
    for name in names:
        if sd[name] != getattr(buffer, name):
            raise ValueError(f"replay: checkpoint has {name}={sd[name]!r}, "
                             f"this run has {getattr(buffer, name)!r}")


# ---- metrics and set-up -------------------------------------------------------------------------

NO_REPLAY = {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0}
COMBINE = RolloutReplay.COMBINE      # a replay of a method file extends it


def report(replay, metrics) -> None:
    """The buffer's stats() (NO_REPLAY without a buffer) into a metrics.Metrics, each key as the
    buffer's COMBINE says."""
    if replay is None:
        metrics.add(COMBINE, NO_REPLAY)
    else:
        metrics.add(replay.COMBINE, replay.stats())


# the replay's field of the log line (metrics.fields): rollouts replayed / stored, their mean age
LOG = ("replay {replay/sampled:3d}/{replay/size:<5d} age {replay/age_mean:.2f}",)


def make(flags: Flags, *, seed: int) -> RolloutReplay | None:
    """The buffer behind `--replay`: RolloutReplay with alpha = 0 (uniform: naive replay), alpha =
    0 among the rollouts with A != 0 (nonzero) or with --priority-alpha (prioritized); None for
    none, and for a kind a method file makes (its replay slot). Arguments are validated whatever
    the kind, so a bad flag is an error even when replay is off."""
    f = flags
    check_args(f.tau_max, f.priority_alpha, f.replay_capacity or None)
    if f.replay not in ("uniform", "prioritized", "nonzero"):
        return None
    alpha = f.priority_alpha if f.replay == "prioritized" else 0.0
    return RolloutReplay(f.tau_max, alpha=alpha, capacity=f.replay_capacity or None, seed=seed,
                         ratio=f.replay_ratio, nonzero=f.replay == "nonzero")


if __name__ == "__main__":
    replay = RolloutReplay(tau_max=2, alpha=1.0, seed=0, ratio=0.5)
    for step in range(5):
        batch = replay.sample(step, n_fresh=8)
        drawn = [(r.version, round(r.advantage, 2)) for r in batch]
        print(f"step {step}: replayed (version, A) = {drawn}")
        fresh = [Rollout(prompt_id=p, prompt_ids=[1], completion_ids=[2], logprobs=[-0.5],
                         advantage=a, version=step)
                 for p in range(2) for a in (-1.0, 0.0, 0.5, 0.5)]
        replay.add(fresh, step)
        stats = ", ".join(f"{k.removeprefix('replay/')} {v:.3g}" for k, v in replay.stats().items())
        print(textwrap.fill(stats, 100, initial_indent="    ", subsequent_indent="    "))
