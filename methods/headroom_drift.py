"""Headroom-Drift: group-level replay for GRPO, "a group-level replay control primitive ... Headroom
ranks stored groups by remaining learning value, while Drift gates them by compatibility with the
current policy" (its abstract; no paper text was available).

    python train.py --preset headroom-drift     # 32 of 64 candidate groups a step, p(1 - p)

It fills the replay slot (`--replay headroom-drift`): `GroupReplay` behind the spine's buffer
interface (sample, add, stats, state_dict, load_state_dict), with the policy's no-grad forward
for its drift gate handed in at set-up. Every reading is a flag (`--hd-*`) or stated in
`GroupReplay`'s docstring; the dev results that chose them are in docs/methods.md.
"""
import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

import buffer
import grpo
from rollout import Rollout, lockstep_logprobs

HEADROOMS = ("variance", "failure", "abs-adv", "current")
CHOICES = {"replay": ("headroom-drift",)}


@dataclass(frozen=True)
class Flags:
    # ---- Headroom-Drift --------------------------------------------------------------------------
    hd_headroom: Literal[HEADROOMS] = "variance"
    """Headroom-Drift: rank stored groups by variance p(1 - p) | failure 1 - p | abs-adv mean |A| (p
    = success rate, at generation) | current p_theta(1 - p_theta) (p_theta: the current policy's
    success rate, importance-weighted over the stored completions, re-scored each step)"""
    hd_groups: int = 32
    """Headroom-Drift: stored groups replayed per step (the top ones that pass the drift gate)"""
    hd_candidates: int = 64
    """Headroom-Drift: at most this many groups, in headroom order, get the no-grad drift forward
    each step"""
    hd_drift_frac: float = 0.5
    """Headroom-Drift: skip (keep) a group whose drift mean_i |mean_t log(pi_theta / pi_behaviour)|
    is above this fraction of the nearer clip boundary, min(-log(1 - eps_low), log(1 + eps_high))"""

    AT_LEAST_1 = ("hd_groups", "hd_candidates")
    AT_LEAST_0 = ("hd_drift_frac",)


PRESETS = {
    "headroom-drift": ("Headroom-Drift group replay (abstract only): rank groups by p(1-p), "
                       "gate by drift (1.12 of the clip range); lr 3e-5",
                       dict(replay="headroom-drift", hd_headroom="variance", tau_max=4,
                            hd_groups=32, hd_candidates=64, hd_drift_frac=1.12, lr=3e-5)),
}


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
      replayed amount is `groups` groups. drift_max is absolute here; `make` states it relative
      to the clip range, drift_max = `drift_limit(--hd-drift-frac, --eps-low, --eps-high)` =
      frac x min(-log(1 - eps_low), log(1 + eps_high)), the nearer clip boundary in log space.
    """

    # how stats() combine over ranks (buffer.report): the buffer's keys as it says, the groups'
    # means over the count of what they average, the counts totals
    COMBINE = {**buffer.COMBINE, "replay/headroom_mean": "mean replay/groups",
               "replay/headroom_stored_mean": "mean replay/groups",
               "replay/headroom_shift": "mean replay/groups",
               "replay/drift_mean": "mean replay/drift_candidates",
               "replay/drift_gated_frac": "mean replay/drift_candidates",
               "replay/hd_changed_frac": "mean replay/hd_reference",
               **dict.fromkeys(("replay/stored_groups", "replay/unstored_groups", "replay/groups",
                                "replay/drift_candidates", "replay/hd_reference"), "sum")}

    def __init__(self, tau_max: int, headroom: str = "variance", groups: int = 32,
                 candidates: int = 64, drift_max: float = 0.05, logprobs=None):
        buffer.check_args(tau_max, 0.0, None)
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
        buffer.check_same(sd, self, ("tau_max", "headroom"))
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
    return {**buffer.empty_sample_stats(), "replay/groups": 0, "replay/headroom_mean": 0.0,
            "replay/headroom_stored_mean": 0.0, "replay/headroom_shift": 0.0,
            "replay/drift_mean": 0.0, "replay/drift_gated_frac": 0.0, "replay/drift_candidates": 0,
            "replay/hd_changed_frac": 0.0, "replay/hd_reference": 0}


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


def make(flags: Flags, run, steps) -> dict:
    """The replay slot under `--replay headroom-drift`: GroupReplay with the run's tau_max, the
    drift limit from the run's clip range, and the policy's no-grad forward in lockstep
    (rollout.lockstep_logprobs at --temperature, micro-batched as the update is)."""
    s = run.settings
    if s.replay.replay != "headroom-drift":
        return {}

    def logprobs(rollouts):
        return lockstep_logprobs(run.model, rollouts, run.micro_batch[0], s.run.temperature,
                                 run.tok.pad_token_id, run.world, run.micro_batch[1])

    return {"replay": GroupReplay(s.replay.tau_max, headroom=flags.hd_headroom,
                                  groups=flags.hd_groups, candidates=flags.hd_candidates,
                                  drift_max=drift_limit(flags.hd_drift_frac, s.loss.eps_low,
                                                        s.loss.eps_high),
                                  logprobs=logprobs)}
