"""Replay: a rollout-level, advantage-prioritized, age-bounded buffer for GRPO (`RolloutReplay`), and Headroom-Drift's
group-level replay (`GroupReplay`, its own docstring below).

    python buffer.py          # fills a toy buffer, samples from it, prints the stats

In the trainer, at each step (fresh = this step's scored rollouts, advantages set, version = step):

    replay = make_replay("prioritized", tau_max=4, alpha=1.0, capacity=None, seed=0)   # once
    batch = fresh + replay.sample(round(replay_ratio * len(fresh)), step)              # fresh-anchored batch
    replay.add(fresh, step)

Implements the replay buffer of "Rollout-Level Advantage-Prioritized Experience Replay for GRPO"
(Yoo et al., arXiv 2606.04560):

- **Rollout level.** The buffer stores individual rollouts, never whole groups. Each keeps the advantage it got in
  its own fresh group and its behaviour log-probs, unchanged for life: replay never recomputes either.
- **Age eviction.** With age_j = step - version_j, a rollout with age_j > tau_max is gone before the next sample
  (age == tau_max is still replayable).
- **Priority.** Replayed rollouts are drawn by advantage magnitude,

      P(j) = |A_j|^alpha / sum_k |A_k|^alpha        (k over the eligible rollouts)

  alpha = 0 is uniform replay (the naive-replay baseline); with alpha > 0 a rollout with A_j = 0 has P(j) = 0 and is
  never drawn.
- **Fresh-anchored composition.** `sample(k, step)` returns only replayed rollouts; the trainer's batch at `step` is
  every fresh rollout of `step` followed by these. Eligible rollouts have version < step: rollouts of the current
  step are excluded, so the trainer may call `add(fresh, step)` before or after `sample(k, step)` and get the same
  draw (calling `sample` first is the natural order, and with a capacity bound it keeps fresh rollouts from pushing
  out replayable ones before they are drawn).

Departures and definitional choices (the paper states only the proportionality above):
- k > 1 draws are *successive* draws without replacement (no duplicates in one batch): the first draw follows P(j)
  exactly, each later draw follows P renormalised over the rollouts not yet drawn (what
  numpy's `Generator.choice(replace=False, p=P)` does). So for k > 1 the inclusion probability of a rollout is not
  k * P(j) but the successive-sampling one, e.g. for k = 2: P(j) + sum_{i != j} P(i) P(j) / (1 - P(i)).
  Implemented with Efraimidis–Spirakis keys in their exponential form: key_j = E_j / w_j with E_j ~ Exp(1) and
  w_j = |A_j|^alpha; the k smallest keys are the draw, in draw order. Computed in logs,
  log key_j = log E_j - alpha log|A_j|, so no |A|^alpha can overflow or underflow to 0.
- Fewer than k eligible (positive-weight) rollouts: all of them are returned.
- Optional capacity bound: after `add`, the oldest rollouts (lowest version, then earliest inserted) are dropped
  until `len(buffer) <= capacity`.
- `make_replay("none", ...)` returns None: no replay is an absent buffer, and the trainer's `if replay is not None`
  shows it at the line where the batch is built.

Storage: a numpy object array of records next to parallel numpy arrays of version and |A|, in insertion order;
eviction compacts all three with one boolean mask and sampling is vectorised, so neither loops over rollouts in
Python. The buffer holds references to the caller's `Rollout` objects and never writes to them; callers must treat
what `sample` returns as read-only.
"""
import random
from dataclasses import asdict

import numpy as np

from rollout import Rollout

REPLAY_KINDS = ("none", "uniform", "prioritized", "headroom-drift")
HEADROOMS = ("variance", "failure", "abs-adv")


class RolloutReplay:
    """Rollout-level replay with age eviction (tau_max) and priority |A|^alpha; see the module docstring."""

    def __init__(self, tau_max: int, alpha: float = 1.0, capacity: int | None = None, seed: int = 0):
        _check_args(tau_max, alpha, capacity)
        self.tau_max, self.alpha, self.capacity, self.seed = int(tau_max), float(alpha), capacity, int(seed)
        self._rng = np.random.default_rng(seed)
        self._clear()

    def _clear(self) -> None:
        self._records = np.empty(0, dtype=object)      # [N] Rollout, insertion order
        self._version = np.empty(0, dtype=np.int64)    # [N] version of each record
        self._abs_adv = np.empty(0, dtype=np.float64)  # [N] |advantage| of each record
        self._last = {"replay/evicted": 0, "replay/capacity_dropped": 0, **_empty_sample_stats()}

    def __len__(self) -> int:
        return len(self._records)

    # ---- store ----------------------------------------------------------------------------------------------------
    def add(self, rollouts: list[Rollout], step: int) -> None:
        """Store each rollout as given (a reference; its advantage and logprobs are never touched).

        `step` is the trainer's current step; a rollout with version > step would come from the future and is an
        error, as is a non-finite advantage (it would poison every priority)."""
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
            raise ValueError(f"replay: add at step {step} got a rollout with version {int(version.max())} > step")
        self._records = np.concatenate([self._records, records])
        self._version = np.concatenate([self._version, version])
        self._abs_adv = np.concatenate([self._abs_adv, np.abs(adv)])
        self._last["replay/capacity_dropped"] = self._enforce_capacity()

    def _enforce_capacity(self) -> int:
        """Drop the oldest records (lowest version, ties by insertion order) until len <= capacity."""
        excess = len(self) - (self.capacity if self.capacity is not None else len(self))
        if excess <= 0:
            return 0
        oldest = np.argsort(self._version, kind="stable")[:excess]  # stable sort: ties stay in insertion order
        keep = np.ones(len(self), dtype=bool)
        keep[oldest] = False
        self._compact(keep)
        return int(excess)

    def _compact(self, keep: np.ndarray) -> None:
        self._records, self._version, self._abs_adv = self._records[keep], self._version[keep], self._abs_adv[keep]

    # ---- evict ----------------------------------------------------------------------------------------------------
    def evict(self, step: int) -> int:
        """Remove every rollout with age = step - version > tau_max; returns how many were removed."""
        keep = (step - self._version) <= self.tau_max   # [N] age == tau_max is kept (the paper: "older than")
        evicted = int(len(self) - keep.sum())
        if evicted:
            self._compact(keep)
        self._last["replay/evicted"] = evicted
        return evicted

    # ---- sample ---------------------------------------------------------------------------------------------------
    def sample(self, k: int, step: int) -> list[Rollout]:
        """Evict by age, then draw up to k distinct rollouts with version < step, P(j) ∝ |A_j|^alpha."""
        if k < 0:
            raise ValueError(f"replay: sample size k must be >= 0, got {k}")
        self.evict(step)
        # Fresh-anchored: the current step's rollouts are the batch's fresh part, never its replayed part.
        eligible = self._version < step                 # [N]
        if self.alpha > 0:
            eligible &= self._abs_adv > 0               # w_j = 0 for A_j = 0 (also avoids log 0 below)
        cand = np.flatnonzero(eligible)                 # [M] indices of candidates
        picked = cand[self._draw_without_replacement(self._abs_adv[cand], k)]  # [min(k, M)]
        self._record_sample(picked, step)
        return self._records[picked].tolist()

    def _draw_without_replacement(self, abs_adv: np.ndarray, k: int) -> np.ndarray:
        """Positions of min(k, M) successive draws without replacement with P ∝ abs_adv^alpha, in draw order.

        Efraimidis–Spirakis in exponential form: key_j = E_j / w_j, E_j ~ Exp(1); the smallest key is a draw with
        P(j) = w_j / sum w, the next smallest a draw from the rest, and so on. In logs for range safety:
        log key_j = log E_j - alpha * log|A_j|. One E_j per candidate, so the RNG advances identically for the
        same buffer contents (what makes a resumed run sample the same rollouts)."""
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
        self._last.update(_empty_sample_stats())
        if len(picked):
            age = step - self._version[picked]               # [K]
            self._last.update({"replay/sampled": int(len(picked)), "replay/age_mean": float(age.mean()),
                               "replay/age_max": int(age.max()),
                               "replay/abs_adv_sampled": float(self._abs_adv[picked].mean())})

    # ---- metrics and checkpointing --------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Flat namespaced metrics. replay/size and replay/abs_adv_stored (mean |A| over every stored rollout,
        eligible for the next draw or not) describe the buffer now; replay/evicted
        the last evict (age); replay/capacity_dropped the last add; the rest the last sample (0 when it drew
        nothing, so the JSON stays finite)."""
        stored = float(self._abs_adv.mean()) if len(self) else 0.0
        return {"replay/size": len(self), **self._last, "replay/abs_adv_stored": stored}

    def state_dict(self) -> dict:
        """Everything needed to resume exactly, as plain Python data (dicts, lists, ints, floats, str), so that
        pickle and torch.save / torch.load(weights_only=True) both round-trip it."""
        return {"tau_max": self.tau_max, "alpha": self.alpha, "capacity": self.capacity, "seed": self.seed,
                "rollouts": [asdict(r) for r in self._records],
                "rng": self._rng.bit_generator.state, "last": dict(self._last)}

    def load_state_dict(self, sd: dict) -> None:
        """Restore contents, RNG and last stats. The hyperparameters must match this buffer's: a resumed run with
        a different tau_max, alpha or capacity could not replay the same data, so that is an error."""
        for name in ("tau_max", "alpha", "capacity"):
            if sd[name] != getattr(self, name):
                raise ValueError(f"replay: checkpoint has {name}={sd[name]!r}, this run has {getattr(self, name)!r}")
        self.seed = sd["seed"]
        self._clear()
        rollouts = [Rollout(**d) for d in sd["rollouts"]]
        if rollouts:
            self.add(rollouts, step=max(r.version for r in rollouts))
        self._rng.bit_generator.state = sd["rng"]
        self._last = dict(sd["last"])


class GroupReplay:
    """Headroom-Drift group replay (`--replay headroom-drift`). No paper text was available: this implements the
    reading of its abstract ("a group-level replay control primitive for GRPO that separates reuse into two
    decisions. Headroom ranks stored groups by remaining learning value, while Drift gates them by compatibility with
    the current policy. The fresh on-policy stream remains unchanged, and the method adds no auxiliary generation or
    training machinery") given in issue 12; every choice below is a flag or stated here.

    - Store: whole fresh groups (rollouts sharing prompt_id and version), each rollout with its stored advantage and
      behaviour log-probs, as references never written to. A group whose rewards are all equal carries no signal
      (every A = 0) and is not stored. Age eviction as RolloutReplay: age = step - version > tau_max is gone.
    - Headroom h(g), with p = the group's success rate (mean reward, clamped to [0, 1]):
      variance p (1 - p) | failure 1 - p | abs-adv mean |A| over the group.
    - Candidates: the eligible groups (version < step: fresh-anchored) in headroom order (ties: newer first, then
      earlier stored), at most `drift_candidates` of them, so the drift pass has a bounded cost.
    - Drift D(g) = mean over g's rollouts of |mean_t log rho_t|, log rho_t = log pi_theta - log pi_behaviour: computed
      by the caller's `drift_fn(candidate groups) -> [D(g)]` (train.group_drift: one no-grad forward). Under torchrun
      it is called on every rank at every sample, also with no candidate, so the ranks make equal forward passes.
    - Gate: groups with D(g) > drift_max are skipped this step (kept, not deleted: they may pass again later);
      the first `replay_groups` passing candidates are replayed, all their rollouts, with their stored advantages.
    """

    def __init__(self, tau_max: int, headroom: str = "variance", replay_groups: int = 32, drift_candidates: int = 64,
                 drift_max: float = 0.05):
        _check_args(tau_max, 0.0, None)
        if headroom not in HEADROOMS:
            raise ValueError(f"replay: headroom must be one of {', '.join(HEADROOMS)}, got {headroom!r}")
        if replay_groups < 1 or drift_candidates < 1 or not drift_max >= 0 or not np.isfinite(drift_max):
            raise ValueError("replay: need replay_groups >= 1, drift_candidates >= 1 and a finite drift_max >= 0")
        self.tau_max, self.headroom, self.replay_groups = int(tau_max), headroom, int(replay_groups)
        self.drift_candidates, self.drift_max = int(drift_candidates), float(drift_max)
        self._groups: list[list[Rollout]] = []          # insertion order; each a whole fresh group
        self._last = {"replay/evicted": 0, "replay/unstored_groups": 0, **_empty_group_stats()}

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups)

    def add(self, rollouts: list[Rollout], step: int) -> None:
        """Split `rollouts` into groups by (prompt_id, version) and store those whose rewards are not all equal."""
        if any(r.version > step for r in rollouts):
            raise ValueError(f"replay: add at step {step} got a rollout with version > step")
        by_key: dict = {}
        for r in rollouts:
            by_key.setdefault((r.prompt_id, r.version), []).append(r)
        kept = [g for g in by_key.values() if len({r.reward for r in g}) > 1]
        self._groups += kept
        self._last["replay/unstored_groups"] = len(by_key) - len(kept)

    def evict(self, step: int) -> int:
        before = len(self._groups)
        self._groups = [g for g in self._groups if step - g[0].version <= self.tau_max]
        self._last["replay/evicted"] = before - len(self._groups)
        return self._last["replay/evicted"]

    def headroom_of(self, group: list[Rollout]) -> float:
        if self.headroom == "abs-adv":
            return sum(abs(r.advantage) for r in group) / len(group)
        p = min(max(sum(r.reward for r in group) / len(group), 0.0), 1.0)
        return p * (1 - p) if self.headroom == "variance" else 1 - p

    def candidates(self, step: int) -> list[list[Rollout]]:
        """Evict by age, then the eligible groups (version < step) in headroom order, at most drift_candidates."""
        self.evict(step)
        order = sorted((g for g in self._groups if g[0].version < step),
                       key=lambda g: (-self.headroom_of(g), -g[0].version))       # stable: then stored order
        return order[:self.drift_candidates]

    def sample(self, step: int, drift_fn) -> list[Rollout]:
        """Headroom ranks, Drift gates: the rollouts of the top `replay_groups` candidates with D(g) <= drift_max."""
        cands = self.candidates(step)
        drift = list(drift_fn(cands))                    # called also with no candidate (lockstep under torchrun)
        passing = [g for g, d in zip(cands, drift) if d <= self.drift_max][:self.replay_groups]
        out = [r for g in passing for r in g]
        self._last.update(_empty_group_stats())
        if cands:
            self._last.update({"replay/drift_candidates": len(cands), "replay/drift_mean": float(np.mean(drift)),
                               "replay/drift_gated_frac": sum(d > self.drift_max for d in drift) / len(cands)})
        if passing:
            age = [step - g[0].version for g in passing for _ in g]
            self._last.update({"replay/groups": len(passing), "replay/sampled": len(out),
                               "replay/headroom_mean": float(np.mean([self.headroom_of(g) for g in passing])),
                               "replay/age_mean": float(np.mean(age)), "replay/age_max": int(max(age)),
                               "replay/abs_adv_sampled": float(np.mean([abs(r.advantage) for r in out]))})
        return out

    def stats(self) -> dict:
        """replay/size (rollouts stored) and replay/stored_groups now, replay/evicted (groups) at the last evict,
        replay/unstored_groups (all-equal groups) at the last add, the rest at the last sample."""
        return {"replay/size": len(self), "replay/stored_groups": len(self._groups), **self._last}

    def state_dict(self) -> dict:
        """Plain Python data (groups as lists of rollout dicts); sampling is deterministic, so no RNG."""
        return {"kind": "headroom-drift", "tau_max": self.tau_max, "headroom": self.headroom,
                "groups": [[asdict(r) for r in g] for g in self._groups], "last": dict(self._last)}

    def load_state_dict(self, sd: dict) -> None:
        for name in ("tau_max", "headroom"):
            if sd[name] != getattr(self, name):
                raise ValueError(f"replay: checkpoint has {name}={sd[name]!r}, this run has {getattr(self, name)!r}")
        self._groups = [[Rollout(**d) for d in g] for g in sd["groups"]]
        self._last = dict(sd["last"])


def _empty_group_stats() -> dict:
    return {**_empty_sample_stats(), "replay/groups": 0, "replay/headroom_mean": 0.0, "replay/drift_mean": 0.0,
            "replay/drift_gated_frac": 0.0, "replay/drift_candidates": 0}


def _empty_sample_stats() -> dict:
    return {"replay/sampled": 0, "replay/age_mean": 0.0, "replay/age_max": 0, "replay/abs_adv_sampled": 0.0}


def _check_args(tau_max, alpha, capacity) -> None:
    if isinstance(tau_max, bool) or not isinstance(tau_max, (int, np.integer)) or tau_max < 0:
        raise ValueError(f"replay: tau_max must be an integer >= 0, got {tau_max!r}")
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"replay: priority alpha must be a finite number >= 0, got {alpha!r}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer))
                                 or capacity < 1):
        raise ValueError(f"replay: capacity must be an integer >= 1 or None, got {capacity!r}")


def mini_batches(n_fresh: int, n_replayed: int, parts: int, shuffle_seed: int | None = None) -> list[list[int]]:
    """Fresh-anchored mini-batches: indices into fresh + replayed for `parts` optimizer steps. The fresh rollouts and
    the replayed ones are each cut into `parts` near-equal pieces and mini-batch j takes piece j of both, so every
    optimizer step holds its proportional share of each (none is pure replay). With a seed both are shuffled first
    (python's random.Random(seed)); without one the batch order is kept."""
    fresh, replayed = list(range(n_fresh)), list(range(n_fresh, n_fresh + n_replayed))
    if shuffle_seed is not None:
        rng = random.Random(shuffle_seed)
        rng.shuffle(fresh)
        rng.shuffle(replayed)
    piece = lambda xs, j: xs[len(xs) * j // parts:len(xs) * (j + 1) // parts]      # noqa: E731
    return [piece(fresh, j) + piece(replayed, j) for j in range(parts)]


def make_replay(kind: str, tau_max: int, alpha: float, capacity: int | None, seed: int,
                **group_kw) -> RolloutReplay | GroupReplay | None:
    """The buffer behind `--replay {none,uniform,prioritized,headroom-drift}`: None (no replay), RolloutReplay with
    alpha = 0 (naive uniform replay), RolloutReplay with the given alpha, or GroupReplay(tau_max, **group_kw)
    (headroom, replay_groups, drift_candidates, drift_max). Arguments are validated whatever the kind, so a bad flag
    is an error even when replay is off."""
    if kind not in REPLAY_KINDS:
        raise ValueError(f"replay: kind must be one of {', '.join(REPLAY_KINDS)}, got {kind!r}")
    _check_args(tau_max, alpha, capacity)
    if kind == "none":
        return None
    if kind == "headroom-drift":
        return GroupReplay(tau_max, **group_kw)
    return RolloutReplay(tau_max, alpha=0.0 if kind == "uniform" else alpha, capacity=capacity, seed=seed)


if __name__ == "__main__":
    replay = RolloutReplay(tau_max=2, alpha=1.0, seed=0)
    for step in range(5):
        batch = replay.sample(k=4, step=step)
        print(f"step {step}: replayed (version, A) = {[(r.version, round(r.advantage, 2)) for r in batch]}")
        fresh = [Rollout(prompt_id=p, prompt_ids=[1], completion_ids=[2], logprobs=[-0.5], advantage=a, version=step)
                 for p in range(2) for a in (-1.0, 0.0, 0.5, 0.5)]
        replay.add(fresh, step)
        print("   ", replay.stats())
