"""Replay: a rollout-level, advantage-prioritized, age-bounded buffer for GRPO (`RolloutReplay`),
and Headroom-Drift's group-level replay (`GroupReplay`, its own docstring below), behind one
interface.

    python buffer.py          # fills a toy buffer, samples from it, prints the stats

In the trainer, at each step (fresh = this step's scored rollouts, advantages set, version = step):

    replay = make_replay("prioritized", tau_max=4, ratio=0.5, alpha=1.0, seed=0)   # once
    batch = fresh + replay.sample(step, len(fresh))      # fresh-anchored: the replayed ones after
    replay.add(fresh, step)
    report(replay, metrics)                                  # its numbers, each as it reduces

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
  P(j) = 0 and is never drawn.
- **Fresh-anchored composition.** `sample(step, n_fresh)` returns only replayed rollouts, k =
  round(ratio * n_fresh) of them; the trainer's batch at `step` is every fresh rollout of `step`
  followed by these. Eligible rollouts have version < step: rollouts of the current step are
  excluded, so the trainer may call `add(fresh, step)` before or after `sample(step, n)` and get the
  same draw (calling `sample` first is the natural order, and with a capacity bound it keeps fresh
  rollouts from pushing out replayable ones before they are drawn).

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
- `make_replay("none", ...)` returns None: no replay is an absent buffer, and the trainer's `if
  replay is not None` shows it at the line where the batch is built.

Storage: a numpy object array of records next to parallel numpy arrays of version and |A|, in
insertion order; eviction compacts all three with one boolean mask and sampling is vectorised, so
neither loops over rollouts in Python. The buffer holds references to the caller's `Rollout` objects
and never writes to them; callers must treat what `sample` returns as read-only.
"""
import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

import grpo
from rollout import Rollout

REPLAY_KINDS = ("none", "uniform", "prioritized", "headroom-drift")
HEADROOMS = ("variance", "failure", "abs-adv", "current")


@dataclass(frozen=True)
class Flags:
    # ---- replay ----------------------------------------------------------------------------------
    replay: Literal[REPLAY_KINDS] = "prioritized"
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
    hd_headroom: Literal[HEADROOMS] = "variance"
    """Headroom-Drift: rank stored groups by variance p(1 - p) | failure 1 - p | abs-adv mean |A| (p
    = success rate, at generation) | current p_theta(1 - p_theta) (p_theta: the current policy's
    success rate, importance-weighted over the stored completions, re-scored each step); variance
    (with --hd-drift-frac 1.12 in --preset headroom-drift): the arith dev split's choice"""
    hd_groups: int = 32
    """Headroom-Drift: stored groups replayed per step (the top ones that pass the drift gate)"""
    hd_candidates: int = 64
    """Headroom-Drift: at most this many groups, in headroom order, get the no-grad drift forward
    each step"""
    hd_drift_frac: float = 0.5
    """Headroom-Drift: skip (keep) a group whose drift mean_i |mean_t log(pi_theta / pi_behaviour)|
    is above this fraction of the nearer clip boundary, min(-log(1 - eps_low), log(1 + eps_high))"""

    AT_LEAST_1 = ("hd_groups", "hd_candidates")
    AT_LEAST_0 = ("tau_max", "replay_ratio", "priority_alpha", "replay_capacity", "hd_drift_frac")


class RolloutReplay:
    """Rollout-level replay with age eviction (tau_max) and priority |A|^alpha; see the module
    docstring. `ratio`: replayed rollouts per fresh one (k = round(ratio * n_fresh) in `sample`)."""

    def __init__(self, tau_max: int, alpha: float = 1.0, capacity: int | None = None, seed: int = 0,
                 ratio: float = 1.0):
        _check_args(tau_max, alpha, capacity)
        if not np.isfinite(ratio) or ratio < 0:
            raise ValueError(f"replay: ratio must be a finite number >= 0, got {ratio!r}")
        self.tau_max = int(tau_max)
        self.alpha = float(alpha)
        self.capacity = capacity
        self.seed = int(seed)
        self.ratio = float(ratio)
        self._rng = np.random.default_rng(seed)
        self._clear()

    def _clear(self) -> None:
        self._records = np.empty(0, dtype=object)      # [N] Rollout, insertion order
        self._version = np.empty(0, dtype=np.int64)    # [N] version of each record
        self._abs_adv = np.empty(0, dtype=np.float64)  # [N] |advantage| of each record
        self._last = {"replay/evicted": 0, "replay/capacity_dropped": 0, **_empty_sample_stats()}

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
        self._last["replay/capacity_dropped"] = self._enforce_capacity()

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
        """The replayed part of the batch at `step` for `n_fresh` fresh rollouts: draw(round(ratio *
        n_fresh))."""
        return self.draw(round(self.ratio * n_fresh), step)

    def draw(self, k: int, step: int) -> list[Rollout]:
        """Evict by age, then draw up to k distinct rollouts with version < step, P(j) ∝
        |A_j|^alpha."""
        if k < 0:
            raise ValueError(f"replay: sample size k must be >= 0, got {k}")
        self.evict(step)
        # Fresh-anchored: the current step's rollouts are the batch's fresh part, never its replayed
        # part.
        eligible = self._version < step                 # [N]
        if self.alpha > 0:
            eligible &= self._abs_adv > 0  # w_j = 0 for A_j = 0 (also avoids log 0 below)
        cand = np.flatnonzero(eligible)                 # [M] indices of candidates
        picked = cand[self._draw_without_replacement(self._abs_adv[cand], k)]  # [min(k, M)]
        self._record_sample(picked, step)
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
        self._last.update(_empty_sample_stats())
        if len(picked):
            age = step - self._version[picked]               # [K]
            self._last.update({"replay/sampled": int(len(picked)),
                               "replay/age_mean": float(age.mean()),
                               "replay/age_max": int(age.max()),
                               "replay/abs_adv_sampled": float(self._abs_adv[picked].mean())})

    # ---- metrics and checkpointing ---------------------------------------------------------------
    def stats(self) -> dict:
        """Flat namespaced metrics. replay/size and replay/abs_adv_stored (mean |A| over every
        stored rollout, eligible for the next draw or not) describe the buffer now; replay/evicted
        the last evict (age); replay/capacity_dropped the last add; the rest the last sample (0 when
        it drew nothing, so the JSON stays finite)."""
        stored = float(self._abs_adv.mean()) if len(self) else 0.0
        return {"replay/size": len(self), **self._last, "replay/abs_adv_stored": stored}

    def state_dict(self) -> dict:
        """Everything needed to resume exactly, as plain Python data (dicts, lists, ints, floats,
        str), so that pickle and torch.save / torch.load(weights_only=True) both round-trip it."""
        return {"tau_max": self.tau_max, "alpha": self.alpha, "capacity": self.capacity,
                "seed": self.seed, "rollouts": [asdict(r) for r in self._records],
                "rng": self._rng.bit_generator.state, "last": dict(self._last)}

    def load_state_dict(self, sd: dict) -> None:
        """Restore contents, RNG and last stats. The hyperparameters must match this buffer's: a
        resumed run with a different tau_max, alpha or capacity could not replay the same data, so
        that is an error."""
        _check_same(sd, self, ("tau_max", "alpha", "capacity"))
        self.seed = sd["seed"]
        self._clear()
        rollouts = [Rollout(**d) for d in sd["rollouts"]]
        if rollouts:
            self.add(rollouts, step=max(r.version for r in rollouts))
        self._rng.bit_generator.state = sd["rng"]
        self._last = dict(sd["last"])


class GroupReplay:
    """Headroom-Drift group replay (`--replay headroom-drift`). No paper text was available: this
    implements the reading of its abstract ("a group-level replay control primitive for GRPO that
    separates reuse into two decisions. Headroom ranks stored groups by remaining learning value,
    while Drift gates them by compatibility with the current policy. The fresh on-policy stream
    remains unchanged, and the method adds no auxiliary generation or training machinery"); every
    choice below is a flag (`--hd-*`) or stated here.

    - Store: whole fresh groups (rollouts sharing prompt_id and version), each rollout with its
      stored advantage and behaviour log-probs, as references never written to. A group whose
      rewards are all equal carries no signal (every A = 0) and is not stored. Age eviction as
      RolloutReplay: age = step - version > tau_max is gone.
    - Headroom h(g), with p = the group's success rate (mean reward, clamped to [0, 1]):
      variance p (1 - p) | failure 1 - p | abs-adv mean |A| over the group, all fixed at generation;
      or current, re-scored at every sample in the drift pass's forward (no other forward): the
      current policy's success rate of g by self-normalised importance sampling over g's stored
      completions i, with c_i the stored verdict (`correct`),

          log w_i = sum_t log rho_it,   p_theta(g) = sum_i w_i c_i / sum_i w_i,
          h(g) = p_theta (1 - p_theta)

      (w_i / sum_i w_i as a softmax over log w_i: it cannot overflow). At the behaviour policy w_i
      = 1 and h = p (1 - p) with p the verdicts' mean, its value at generation (`headroom_of`).
      Choices: the verdict, not the shaped reward (p_theta is a success rate); w_i is the
      sequence's whole ratio, so on long completions it can rest on a few rollouts (the estimate
      is biased, as every self-normalised one, but stays in [0, 1]).
    - Candidates: the eligible groups (version < step: fresh-anchored) in headroom order (ties:
      newer first, then earlier stored), at most `candidates` of them, so the drift pass has a
      bounded cost. With current the headroom is known only after the forward: the `candidates`
      newest eligible groups (ties: earlier stored first), ranked after it by the re-scored h
      (ties: newer first, then stored order).
    - Drift, per candidate group g:

          D(g) = mean over g's rollouts i of | mean_t log rho_it |,
          log rho_it = log pi_theta - log pi_behaviour

      (`drift`), with log pi_theta from `logprobs(rollouts) -> [per-token log-probs]`, the trainer's
      no-grad forward handed in when the buffer is made (rollout.lockstep_logprobs of the policy).
      Under torchrun it runs on every rank at every sample, also with no candidate, so the ranks
      make equal forward passes.
    - Gate: groups with D(g) > drift_max are skipped this step (kept, not deleted: they may pass
      again later); the first `groups` passing candidates in headroom order are replayed, all
      their rollouts, with their stored advantages. `sample(step, n_fresh)` ignores n_fresh: the
      replayed amount is `groups` groups. drift_max is absolute here; train.setup states it
      relative to the clip range, drift_max = `drift_limit(--hd-drift-frac, --eps-low,
      --eps-high)` = frac x min(-log(1 - eps_low), log(1 + eps_high)), the nearer clip boundary
      in log space.
    """

    def __init__(self, tau_max: int, headroom: str = "variance", groups: int = 32,
                 candidates: int = 64, drift_max: float = 0.05, logprobs=None):
        _check_args(tau_max, 0.0, None)
        if headroom not in HEADROOMS:
            raise ValueError(f"replay: headroom must be one of {', '.join(HEADROOMS)}, "
                             f"got {headroom!r}")
        if groups < 1 or candidates < 1 or not drift_max >= 0 or not np.isfinite(drift_max):
            raise ValueError("replay: need groups >= 1, candidates >= 1, a finite drift_max >= 0")
        self.tau_max = int(tau_max)
        self.headroom = headroom
        self.groups = int(groups)
        self.candidates_max = int(candidates)
        self.drift_max = float(drift_max)
        self.logprobs = logprobs
        self._groups: list[list[Rollout]] = []          # insertion order; each a whole fresh group
        self._last = {"replay/evicted": 0, "replay/unstored_groups": 0, **_empty_group_stats()}

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups)

    def add(self, rollouts: list[Rollout], step: int) -> None:
        """Split `rollouts` into groups by (prompt_id, version) and store those whose rewards are
        not all equal."""
        if any(r.version > step for r in rollouts):
            raise ValueError(f"replay: add at step {step} got a rollout with version > step")
        by_key: dict = {}
        for r in rollouts:
            by_key.setdefault((r.prompt_id, r.version), []).append(r)
        groups = list(by_key.values())
        kept = [g for g, flat in zip(groups, _flat(groups)) if not flat]
        self._groups += kept
        self._last["replay/unstored_groups"] = len(by_key) - len(kept)

    def evict(self, step: int) -> int:
        before = len(self._groups)
        self._groups = [g for g in self._groups if step - g[0].version <= self.tau_max]
        self._last["replay/evicted"] = before - len(self._groups)
        return self._last["replay/evicted"]

    def headroom_of(self, group: list[Rollout]) -> float:
        """h(g) from the stored numbers: the fixed readings, or current's value at generation."""
        if self.headroom == "abs-adv":
            return sum(abs(r.advantage) for r in group) / len(group)
        if self.headroom == "current":
            p = min(max(sum(r.correct for r in group) / len(group), 0.0), 1.0)
            return p * (1 - p)
        p = min(max(sum(r.reward for r in group) / len(group), 0.0), 1.0)
        return p * (1 - p) if self.headroom == "variance" else 1 - p

    def candidates(self, step: int) -> list[list[Rollout]]:
        """Evict by age, then the eligible groups (version < step) in headroom order (current: in
        newest-first order, ranked in `sample`), at most `candidates`."""
        self.evict(step)
        eligible = (g for g in self._groups if g[0].version < step)

        def rank(g):                                     # sorted() is stable: then stored order
            if self.headroom == "current":
                return -g[0].version
            return (-self.headroom_of(g), -g[0].version)

        return sorted(eligible, key=rank)[:self.candidates_max]

    def drift_and_headroom(self, groups: list[list[Rollout]]) -> tuple[list[float], list[float]]:
        """D(g) and h(g) of each group (the class docstring) from one no-grad forward over all
        their rollouts: h re-scored with current, headroom_of otherwise."""
        flat = [r for g in groups for r in g]
        logps = self.logprobs(flat)
        log_w = iter([(sum(a - b for a, b in zip(lp, r.logprobs)), max(len(lp), 1))
                      for lp, r in zip(logps, flat)])     # (sum_t log rho_it, T_i) per rollout
        drift, headroom = [], []
        for g in groups:
            s, n = np.array([next(log_w) for _ in g], dtype=np.float64).T
            drift.append(float(np.mean(np.abs(s) / n)))
            if self.headroom == "current":
                w = np.exp(s - s.max())                  # softmax over log w_i: no overflow
                p = min(max(float(w @ [r.correct for r in g] / w.sum()), 0.0), 1.0)
                headroom.append(p * (1 - p))
            else:
                headroom.append(self.headroom_of(g))
        return drift, headroom

    def sample(self, step: int, n_fresh: int) -> list[Rollout]:
        """Headroom ranks, Drift gates: the rollouts of the top `groups` candidates with D(g) <=
        drift_max."""
        if self.logprobs is None:
            raise ValueError("GroupReplay.sample needs the policy's forward: make it with logprobs")
        cands = self.candidates(step)
        # also with no candidate: equal forwards on every rank
        drift, headroom = self.drift_and_headroom(cands)
        # headroom order (ties: newer, then candidate order); fixed readings are in it already
        order = sorted(range(len(cands)), key=lambda i: (-headroom[i], -cands[i][0].version))
        chosen = [i for i in order if drift[i] <= self.drift_max][:self.groups]
        passing = [cands[i] for i in chosen]
        out = [r for g in passing for r in g]
        self._last.update(_empty_group_stats())
        if cands:
            gated = sum(d > self.drift_max for d in drift)
            reference = self.reference(cands)
            self._last.update({"replay/drift_candidates": len(cands),
                               "replay/drift_mean": float(np.mean(drift)),
                               "replay/drift_gated_frac": gated / len(cands),
                               "replay/hd_reference": len(reference),
                               "replay/hd_changed_frac":
                                   len(set(reference) - set(chosen)) / len(reference)})
        if passing:
            age = [step - g[0].version for g in passing for _ in g]
            now, stored = [headroom[i] for i in chosen], [self.headroom_of(g) for g in passing]
            abs_adv = [abs(r.advantage) for r in out]
            self._last.update({"replay/groups": len(passing), "replay/sampled": len(out),
                               "replay/headroom_mean": float(np.mean(now)),
                               "replay/headroom_stored_mean": float(np.mean(stored)),
                               "replay/headroom_shift": float(np.mean(np.abs(
                                   np.subtract(now, stored)))),
                               "replay/age_mean": float(np.mean(age)),
                               "replay/age_max": int(max(age)),
                               "replay/abs_adv_sampled": float(np.mean(abs_adv))})
        return out

    def reference(self, cands: list[list[Rollout]]) -> list[int]:
        """What the method's two decisions are measured against: the candidates (their indices)
        that ranking by the headroom fixed at generation (headroom_of) with no gate would replay,
        the first `groups` in that order (ties: newer first, then candidate order). The share of
        them not replayed, replay/hd_changed_frac, is what the drift gate and the re-scored
        headroom changed: the gate alone under a fixed reading, both under current."""
        stored = [self.headroom_of(g) for g in cands]
        order = sorted(range(len(cands)), key=lambda i: (-stored[i], -cands[i][0].version))
        return order[:self.groups]

    def stats(self) -> dict:
        """replay/size (rollouts stored) and replay/stored_groups now, replay/evicted (groups) at
        the last evict, replay/unstored_groups (all-equal groups) at the last add, the rest at the
        last sample."""
        return {"replay/size": len(self), "replay/stored_groups": len(self._groups), **self._last}

    def state_dict(self) -> dict:
        """Plain Python data (groups as lists of rollout dicts); sampling is deterministic, so no
        RNG."""
        return {"kind": "headroom-drift", "tau_max": self.tau_max, "headroom": self.headroom,
                "groups": [[asdict(r) for r in g] for g in self._groups], "last": dict(self._last)}

    def load_state_dict(self, sd: dict) -> None:
        _check_same(sd, self, ("tau_max", "headroom"))
        self._groups = [[Rollout(**d) for d in g] for g in sd["groups"]]
        self._last = dict(sd["last"])


def _flat(groups: list[list[Rollout]]) -> list[bool]:
    """grpo's flat-group rule for each group (every advantage in it is 0), in one call."""
    if not groups:
        return []
    rewards = torch.tensor([r.reward for g in groups for r in g], dtype=torch.float64)   # [B]
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])                    # [B]
    first = torch.tensor([0] + [len(g) for g in groups[:-1]]).cumsum(0)          # [n_groups]
    return grpo.flat_groups(rewards, ids)[first].tolist()


def _empty_group_stats() -> dict:
    return {**_empty_sample_stats(), "replay/groups": 0, "replay/headroom_mean": 0.0,
            "replay/headroom_stored_mean": 0.0, "replay/headroom_shift": 0.0,
            "replay/drift_mean": 0.0, "replay/drift_gated_frac": 0.0, "replay/drift_candidates": 0,
            "replay/hd_changed_frac": 0.0, "replay/hd_reference": 0}


def _empty_sample_stats() -> dict:
    return {"replay/sampled": 0, "replay/age_mean": 0.0, "replay/age_max": 0,
            "replay/abs_adv_sampled": 0.0}


def _check_args(tau_max, alpha, capacity) -> None:
    if isinstance(tau_max, bool) or not isinstance(tau_max, (int, np.integer)) or tau_max < 0:
        raise ValueError(f"replay: tau_max must be an integer >= 0, got {tau_max!r}")
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"replay: priority alpha must be a finite number >= 0, got {alpha!r}")
    whole = isinstance(capacity, (int, np.integer)) and not isinstance(capacity, bool)
    if capacity is not None and (not whole or capacity < 1):
        raise ValueError(f"replay: capacity must be an integer >= 1 or None, got {capacity!r}")


def _check_same(sd: dict, buffer, names) -> None:
    """A resumed buffer must have the checkpoint's hyperparameters, or it could not replay alike."""
    for name in names:
        if sd[name] != getattr(buffer, name):
            raise ValueError(f"replay: checkpoint has {name}={sd[name]!r}, "
                             f"this run has {getattr(buffer, name)!r}")


# ---- metrics: each key with how it combines over ranks -------------------------------------------

# a mean's weight is the count of what it averages; every other key is a total, but these maxima
MEAN_WEIGHTS = {"replay/age_mean": "replay/sampled", "replay/abs_adv_sampled": "replay/sampled",
                "replay/abs_adv_stored": "replay/size", "replay/headroom_mean": "replay/groups",
                "replay/headroom_stored_mean": "replay/groups",
                "replay/headroom_shift": "replay/groups",
                "replay/drift_mean": "replay/drift_candidates",
                "replay/drift_gated_frac": "replay/drift_candidates",
                "replay/hd_changed_frac": "replay/hd_reference"}
MAXIMA = ("replay/age_max",)
NO_REPLAY = {"replay/size": 0, "replay/sampled": 0, "replay/age_mean": 0.0}


def report(replay: "RolloutReplay | GroupReplay | None", metrics) -> None:
    """The buffer's stats() (NO_REPLAY without a buffer) into a metrics.Metrics, each key as it
    reduces."""
    stats = replay.stats() if replay is not None else NO_REPLAY
    for key, value in stats.items():
        if key in MEAN_WEIGHTS:
            metrics.mean(key, value, stats[MEAN_WEIGHTS[key]])
        elif key in MAXIMA:
            metrics.max(key, value)
        else:
            metrics.total(key, value)


def drift_limit(frac: float, eps_low: float, eps_high: float) -> float:
    """GroupReplay's drift_max from `--hd-drift-frac` and the clip range [1 - eps_low, 1 +
    eps_high]: a fraction of the nearer clip boundary in log space,

        drift_max = frac x min(-log(1 - eps_low), log(1 + eps_high))

    (0.5 x 0.182 = 0.091 for eps 0.2/0.2, 0.5 x 0.223 = 0.112 for 0.2/0.28; eps_low = 1 has no
    lower boundary, -log 0 = inf). D(g) is a mean log ratio, the scale of that range."""
    if not (np.isfinite(frac) and frac >= 0 and 0 <= eps_low <= 1 and np.isfinite(eps_high)
            and eps_high >= 0):
        raise ValueError(f"replay: drift_limit needs a finite frac >= 0, 0 <= eps_low <= 1 and a "
                         f"finite eps_high >= 0, got {frac}, {eps_low}, {eps_high}")
    low = -math.log1p(-eps_low) if eps_low < 1 else math.inf
    return frac * min(low, math.log1p(eps_high))


# the replay's field of the log line (metrics.fields): rollouts replayed / stored, their mean age
LOG = ("replay {replay/sampled:3d}/{replay/size:<5d} age {replay/age_mean:.2f}",)


def make(flags: Flags, *, eps_low: float, eps_high: float, seed: int,
         logprobs=None) -> "RolloutReplay | GroupReplay | None":
    """The buffer of the flags (make_replay), Headroom-Drift's drift limit relative to the clip
    range [1 - eps_low, 1 + eps_high] (drift_limit) and its no-grad forward `logprobs`."""
    f = flags
    return make_replay(f.replay, tau_max=f.tau_max, ratio=f.replay_ratio, alpha=f.priority_alpha,
                       capacity=f.replay_capacity or None, seed=seed, headroom=f.hd_headroom,
                       groups=f.hd_groups, candidates=f.hd_candidates,
                       drift_max=drift_limit(f.hd_drift_frac, eps_low, eps_high),
                       logprobs=logprobs)


def make_replay(kind: str, *, tau_max: int, ratio: float = 1.0, alpha: float = 1.0,
                capacity: int | None = None, seed: int = 0, headroom: str = "variance",
                groups: int = 32, candidates: int = 64, drift_max: float = 0.05,
                logprobs=None) -> RolloutReplay | GroupReplay | None:
    """The buffer behind `--replay {none,uniform,prioritized,headroom-drift}`: None (no replay),
    RolloutReplay with alpha = 0 (naive uniform replay), RolloutReplay with the given alpha, or
    GroupReplay (headroom, groups, candidates, drift_max (absolute; train.setup's is
    `drift_limit`'s), and `logprobs`, the policy's no-grad forward for its drift gate). Arguments
    are validated whatever the kind, so a bad flag is an error even when replay is off."""
    if kind not in REPLAY_KINDS:
        raise ValueError(f"replay: kind must be one of {', '.join(REPLAY_KINDS)}, got {kind!r}")
    _check_args(tau_max, alpha, capacity)
    if kind == "none":
        return None
    if kind == "headroom-drift":
        return GroupReplay(tau_max, headroom=headroom, groups=groups, candidates=candidates,
                           drift_max=drift_max, logprobs=logprobs)
    alpha = 0.0 if kind == "uniform" else alpha
    return RolloutReplay(tau_max, alpha=alpha, capacity=capacity, seed=seed, ratio=ratio)


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
        print("   ", replay.stats())
