"""Headroom-Drift (methods.headroom_drift.GroupReplay), whole: the `current` headroom,
re-scored in the drift pass's forward by self-normalised importance sampling; the drift gate
stated relative to the clip range (drift_limit, the drift_max its make() gives from
--hd-drift-frac); the fixed headrooms' ranking, what is stored, age eviction and the state round
trip; the gate through a real drift pass and its bounded cost. Its preset runs with the others
(tests/test_presets.py).

    python -m pytest -q tests/test_headroom_drift.py
"""
import copy
import io
import math
import pickle

import pytest
import torch

import flags
import rollout
from make_tiny_model import make_model, make_tokenizer
from methods.headroom_drift import GroupReplay, drift_limit
from rollout import Rollout

LOG3 = math.log(3.0)


def group(pid: int, version: int, correct: list[float], length: int = 3) -> list[Rollout]:
    """A stored group: reward = verdict, behaviour log-prob -1 per token."""
    mean = sum(correct) / len(correct)
    return [Rollout(prompt_id=pid, prompt_ids=[1, 2], completion_ids=[5] * length,
                    logprobs=[-1.0] * length, correct=c, reward=c, advantage=c - mean,
                    version=version) for c in correct]


class Policy:
    """A fake no-grad forward: each rollout's behaviour log-probs plus `shift[prompt_id]` spread
    evenly over its tokens when it is correct (so sum_t log rho = shift for a correct completion,
    0 for a wrong one)."""

    def __init__(self):
        self.shift: dict[int, float] = {}
        self.calls: list[int] = []

    def __call__(self, rollouts):
        self.calls.append(len(rollouts))
        return [[lp + self.shift.get(r.prompt_id, 0.0) * r.correct / len(r.logprobs)
                 for lp in r.logprobs] for r in rollouts]


# ---- (a) the current headroom follows the policy -------------------------------------------------

def test_current_headroom_is_the_importance_weighted_success_rate_of_the_policy_now():
    """2 correct, 2 wrong. At the behaviour policy w_i = 1: p_theta = 1/2, h = 1/4 exactly (the
    stored p(1-p)). The policy raises each correct completion's log-prob by log 3: w = (3, 3, 1,
    1), p_theta = 6/8 = 3/4, h = 3/4 x 1/4 = 3/16; D(g) = (2 x log 3 / 3) / 4, from the same one
    forward."""
    g = group(0, 0, [1.0, 0.0, 1.0, 0.0])
    policy = Policy()
    replay = GroupReplay(tau_max=4, headroom="current", logprobs=policy)
    assert replay.drift_and_headroom([g]) == ([0.0], [0.25])
    assert replay.headroom_of(g) == 0.25                             # its value at generation
    policy.shift[0] = LOG3
    drift, headroom = replay.drift_and_headroom([g])
    assert headroom == [pytest.approx(3 / 16, abs=1e-12)]
    assert drift == [pytest.approx(2 * LOG3 / 3 / 4, abs=1e-12)]
    assert policy.calls == [4, 4]                                    # one forward per call
    assert replay.headroom_of(g) == 0.25                             # stored: unchanged
    policy.shift[0] = 1e4                                # w = e^10000: the softmax cannot overflow
    assert replay.drift_and_headroom([g])[1] == [0.0]                # p_theta = 1
    for fixed in ("variance", "failure", "abs-adv"):                 # fixed readings: as stored
        other = GroupReplay(tau_max=4, headroom=fixed, logprobs=policy)
        assert other.drift_and_headroom([g])[1] == [other.headroom_of(g)]


def test_current_ranking_flips_when_the_policy_changes_and_reports_both_headrooms():
    """A = (1, 1, 0, 0), B = (1, 0, 0, 0), same version, A stored first. At the behaviour policy
    h(A) = 1/4 > h(B) = 3/16: A is replayed. Raising every correct completion by log 3: A's p_theta
    = 3/4, h = 3/16; B's w = (3, 1, 1, 1), p_theta = 1/2, h = 1/4: B is replayed."""
    a, b = group(0, 0, [1.0, 1.0, 0.0, 0.0]), group(1, 0, [1.0, 0.0, 0.0, 0.0])
    policy = Policy()
    replay = GroupReplay(tau_max=4, headroom="current", groups=1, candidates=8,
                                drift_max=10.0, logprobs=policy)
    replay.add(a + b, step=0)
    assert replay.sample(1, 0) == a
    s = replay.stats()
    assert s["replay/headroom_mean"] == 0.25 and s["replay/headroom_stored_mean"] == 0.25
    policy.shift.update({0: LOG3, 1: LOG3})
    assert replay.sample(1, 0) == b
    s = replay.stats()
    assert s["replay/headroom_mean"] == pytest.approx(0.25, abs=1e-12)      # re-scored
    assert s["replay/headroom_stored_mean"] == 3 / 16                       # at generation
    variance = GroupReplay(tau_max=4, headroom="variance", groups=1, candidates=8,
                                  drift_max=10.0, logprobs=policy)
    variance.add(a + b, step=0)
    assert variance.sample(1, 0) == a                                # the fixed reading: no flip


def test_current_candidates_are_the_newest_then_ranked_by_the_rescored_headroom():
    """With current the headroom is known after the forward: the `candidates` newest eligible
    groups go into it (ties: earlier stored first), whatever their stored headroom, then ties of
    the re-scored h go newer first, then in stored order."""
    old, mid1, mid2, new = (group(0, 0, [1.0, 1.0, 0.0, 0.0]), group(1, 1, [1.0, 0.0, 0.0, 0.0]),
                            group(2, 1, [1.0, 0.0, 0.0, 0.0]), group(3, 2, [1.0, 0.0, 0.0, 0.0]))
    policy = Policy()
    replay = GroupReplay(tau_max=9, headroom="current", groups=3, candidates=3,
                                drift_max=10.0, logprobs=policy)
    replay.add(old, 0)
    replay.add(mid1 + mid2, 1)
    replay.add(new, 2)
    assert [g[0].prompt_id for g in replay.candidates(3)] == [3, 1, 2]     # h(old) = 1/4: not in
    out = replay.sample(3, 0)                                        # all h = 3/16: newer first
    assert [r.prompt_id for r in out[::4]] == [3, 1, 2] and policy.calls == [12]
    policy.shift[2] = LOG3                                           # h(mid2) = 1/4 now
    assert [r.prompt_id for r in replay.sample(3, 0)[::4]] == [2, 3, 1]


# ---- (b) the drift limit, (c) the gate uses it ---------------------------------------------------

def test_drift_limit_is_a_fraction_of_the_nearer_clip_boundary_in_log_space():
    # eps 0.2/0.2: min(-log 0.8, log 1.2) = log 1.2 = 0.18232; eps 0.2/0.28: -log 0.8 = 0.22314
    assert drift_limit(0.5, 0.2, 0.2) == pytest.approx(0.5 * 0.1823215568, abs=1e-10)
    assert drift_limit(0.5, 0.2, 0.28) == pytest.approx(0.5 * 0.2231435513, abs=1e-10)
    assert drift_limit(1.0, 0.2, 0.28) == pytest.approx(0.2231435513, abs=1e-10)
    assert drift_limit(0.5, 1.0, 4.0) == pytest.approx(0.5 * math.log(5.0))  # no lower bound
    assert drift_limit(0.0, 0.2, 0.2) == 0.0
    for bad in ((-0.1, 0.2, 0.2), (0.5, 1.5, 0.2), (0.5, 0.2, -0.1), (math.inf, 0.2, 0.2)):
        with pytest.raises(ValueError, match="drift_limit"):
            drift_limit(*bad)


def test_the_gate_uses_the_limit_just_above_is_skipped_just_below_replayed():
    """D(g) = |shift| / T for a group whose every rollout is shifted by `shift` per sequence."""
    limit = drift_limit(0.5, 0.2, 0.2)

    def shifted(rollouts):                               # every token of group pid by d[pid]
        d = {0: limit * (1 + 1e-6), 1: limit * (1 - 1e-6)}
        return [[lp + d[r.prompt_id] for lp in r.logprobs] for r in rollouts]
    replay = GroupReplay(tau_max=4, groups=2, candidates=2, drift_max=limit,
                                logprobs=shifted)
    above, below = group(0, 0, [1.0, 0.0, 0.0, 0.0]), group(1, 0, [1.0, 1.0, 0.0, 0.0])
    replay.add(above + below, step=0)
    assert replay.sample(1, 0) == below
    s = replay.stats()
    assert s["replay/drift_gated_frac"] == 0.5 and s["replay/groups"] == 1
    assert len(replay) == 8                                          # skipped, not deleted


def test_the_door_gives_the_buffer_the_limit_of_the_flags(cpu_only):
    from tiny import setup
    for eps_low, eps_high, frac in ((0.2, 0.2, 0.5), (0.2, 0.28, 0.75)):
        args = flags.Args(engine="torch", replay="headroom-drift", eps_low=eps_low,
                          eps_high=eps_high, hd_drift_frac=frac, eval_size=8)
        run = setup(args)
        assert run.replay.drift_max == drift_limit(frac, eps_low, eps_high)
    assert not hasattr(flags.Args(), "hd_drift_max")                 # the absolute flag is gone
    assert flags.PRESETS["headroom-drift"][1]["hd_drift_frac"] == 1.12   # the arith dev choice


# ---- (d) resume --------------------------------------------------------------------------------

def test_state_round_trip_with_current_stores_nothing_new():
    policy = Policy()
    policy.shift.update({1: LOG3, 11: -LOG3})
    replay = GroupReplay(tau_max=3, headroom="current", groups=1, candidates=2,
                                drift_max=10.0, logprobs=policy)
    for step in range(3):
        replay.add(group(step, step, [1.0, 0.0, 0.0]) + group(10 + step, step, [1.0, 1.0, 0.0]),
                   step)
    replay.sample(2, 0)
    sd = replay.state_dict()
    plain = GroupReplay(tau_max=3, logprobs=policy)
    assert set(sd) == set(plain.state_dict()) and sd["headroom"] == "current"
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    for loaded in (torch.load(buf, weights_only=True), pickle.loads(pickle.dumps(sd))):
        other = GroupReplay(tau_max=3, headroom="current", groups=1, candidates=2,
                                   drift_max=10.0, logprobs=policy)
        other.load_state_dict(loaded)
        assert other.stats() == replay.stats()
        ref = copy.deepcopy(replay)
        assert other.sample(3, 0) == ref.sample(3, 0) != []
        assert other.stats() == ref.stats()
    with pytest.raises(ValueError, match="headroom"):
        plain.load_state_dict(sd)


# ---- the fixed headrooms: ranking, storage, age; the drift gate through a real drift pass --------

def graded(pid: int, version: int, rewards: list[float], completion=(5, 6, 7)) -> list[Rollout]:
    """A stored group with these rewards, advantage r - mean."""
    mean = sum(rewards) / len(rewards)
    return [Rollout(prompt_id=pid, prompt_ids=[1, 2], completion_ids=list(completion),
                    logprobs=[-1.0] * len(completion), reward=r, advantage=r - mean,
                    version=version) for r in rewards]


def own_logprobs(rollouts):
    """A policy forward that gives each rollout its own behaviour log-probs back: drift 0."""
    return [list(r.logprobs) for r in rollouts]


def test_headroom_ranks_groups_and_all_equal_groups_are_never_stored():
    g_half, g_quarter, g_three = (graded(0, 0, [1, 1, 0, 0]), graded(1, 1, [1, 0, 0, 0]),
                                  graded(2, 0, [1, 1, 1, 0]))
    for headroom, order in [
            ("variance", [0, 1, 2]),      # p(1-p): .25, then .1875 twice (newer version first)
            ("failure", [1, 0, 2]),       # 1 - p: .75, .5, .25
            ("abs-adv", [0, 1, 2])]:      # mean |A|: .5, .375, .375 (newer first)
        replay = GroupReplay(tau_max=4, headroom=headroom, groups=2, candidates=8,
                                    logprobs=own_logprobs)
        flat = graded(3, 0, [1, 1, 1, 1]) + graded(4, 0, [0, 0, 0, 0])
        replay.add(g_half + g_three + flat, step=0)
        assert (replay.stats()["replay/unstored_groups"] == 2
                and replay.stats()["replay/stored_groups"] == 2)
        replay.add(g_quarter, step=1)
        assert [g[0].prompt_id for g in replay.candidates(step=2)] == order, headroom
        out = replay.sample(2, 0)
        # whole groups, top 2
        assert [r.prompt_id for r in out] == [order[0]] * 4 + [order[1]] * 4
        assert out[0] is (g_half + g_quarter + g_three)[order[0] * 4]  # stored as given, not copied
    assert GroupReplay(4).candidates(0) == []
    assert (len(replay) == 12
            and all(r.prompt_id not in (3, 4) for g in replay.candidates(9) for r in g))


def test_fresh_groups_are_not_candidates_and_age_eviction_at_tau_max():
    replay = GroupReplay(tau_max=2)
    replay.add(graded(0, 0, [1, 0]), step=0)
    assert replay.candidates(0) == []                           # version == step: the fresh part
    assert len(replay.candidates(2)) == 1                       # age 2 == tau_max: still replayable
    assert replay.candidates(3) == [] and len(replay) == 0      # age 3: evicted
    assert replay.stats()["replay/evicted"] == 1


def test_state_round_trip():
    replay = GroupReplay(tau_max=3, headroom="failure", groups=1, candidates=2,
                                logprobs=own_logprobs)
    for step in range(3):
        replay.add(graded(step, step, [1, 0, 0]) + graded(10 + step, step, [1, 1, 0]), step)
    replay.sample(2, 0)
    sd = replay.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    for loaded in (torch.load(buf, weights_only=True), pickle.loads(pickle.dumps(sd))):
        other = GroupReplay(tau_max=3, headroom="failure", groups=1, candidates=2,
                                   logprobs=own_logprobs)
        other.load_state_dict(loaded)
        assert other.stats() == replay.stats()
        assert other.sample(3, 0) == copy.deepcopy(replay).sample(3, 0)
    with pytest.raises(ValueError, match="headroom"):
        GroupReplay(tau_max=3).load_state_dict(sd)


# ---- Drift: gating through the real drift pass, and its bounded cost -----------------------------

def _policy_groups(model, n_groups: int, size: int = 4) -> list[list[Rollout]]:
    """Groups whose behaviour log-probs are the model's own now (drift 0)."""
    gs = [graded(p, 0, [1.0, 0.0] * (size // 2), completion=(5 + p % 3, 6, 7))
          for p in range(n_groups)]
    flat = [r for g in gs for r in g]
    for r, lp in zip(flat, rollout.lockstep_logprobs(model, flat, 64, 1.0, 0, 1)):
        r.logprobs = lp
    return gs


def test_drift_gate_skips_then_replays_when_the_policy_returns_and_candidates_bound_the_forwards():
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0).eval()
    a = flags.Args(micro_batch_size=4, hd_drift_frac=0.25)         # one forward pass per group of 4
    drift_max = drift_limit(a.hd_drift_frac, a.eps_low, a.eps_high)   # as its make: 0.056

    def policy_logprobs(rollouts):                                # as make gives the buffer
        return rollout.lockstep_logprobs(model, rollouts, a.micro_batch_size, a.temperature,
                                         tok.pad_token_id, 1)
    replay = GroupReplay(tau_max=9, groups=2, candidates=3, drift_max=drift_max,
                                logprobs=policy_logprobs)
    replay.add([r for g in _policy_groups(model, 5) for r in g], step=0)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))

    assert len(replay.sample(1, 0)) == 8 and len(calls) == 3    # 5 stored, 3 candidates: 3 forwards
    s = replay.stats()
    assert (s["replay/groups"] == 2 and s["replay/drift_candidates"] == 3
            and s["replay/drift_mean"] < 1e-5)
    start = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)                           # the policy moves away
    assert replay.sample(2, 0) == [] and len(calls) == 6    # all candidates gated, still 3 forwards
    s = replay.stats()
    assert s["replay/drift_gated_frac"] == 1.0 and s["replay/drift_mean"] > drift_max
    assert s["replay/groups"] == 0
    assert len(replay) == 20                                                # skipped, not deleted
    model.load_state_dict(start)                                            # ... and returns
    assert len(replay.sample(3, 0)) == 8 and replay.stats()["replay/drift_gated_frac"] == 0.0
    calls.clear()
    assert replay.sample(0, 0) == [] and calls == []         # nothing eligible: no forward (1 rank)


def test_drift_is_the_mean_over_rollouts_of_the_absolute_mean_log_ratio():
    """D(g) = mean_i |mean_t (log pi_theta - log pi_behaviour)|, from the `logprobs` forward given
    at construction: 0 for the rollouts' own log-probs, per group, one forward for all groups."""
    gs = [graded(0, 0, [1.0, 0.0]), graded(1, 0, [1.0, 0.0, 0.0])]
    shifts = {id(gs[0][0]): [0.3, 0.3, 0.3], id(gs[0][1]): [-0.6, 0.0, 0.0],      # |.3|, |-.2|
              id(gs[1][0]): [0.5, -0.5, 0.0], id(gs[1][1]): [0.0] * 3, id(gs[1][2]): [-0.9] * 3}
    calls = []

    def shifted(rollouts):
        calls.append(len(rollouts))
        return [[lp + d for lp, d in zip(r.logprobs, shifts[id(r)])] for r in rollouts]
    drift = GroupReplay(tau_max=2, logprobs=shifted).drift_and_headroom(gs)[0]
    assert drift == [pytest.approx((0.3 + 0.2) / 2), pytest.approx((0.0 + 0.0 + 0.9) / 3)]
    assert calls == [5]
    assert GroupReplay(tau_max=2, logprobs=own_logprobs).drift_and_headroom(gs)[0] == [0.0,
                                                                                              0.0]
    with pytest.raises(ValueError, match="logprobs"):
        GroupReplay(tau_max=2).sample(1, 0)          # no forward given: no drift gate



def test_changed_frac_is_the_share_of_the_ungated_stored_ranking_not_replayed():
    """hd_changed_frac against GroupReplay.reference, the first `groups` candidates by the stored
    headroom with no gate. Stored p(1-p): A = (1, 1, 0, 0) h 1/4, B = (1, 0, 0, 0) h 3/16, C =
    (1, 1, 1, 0) h 3/16 (C newer: ranked before B). groups 2: the reference is {A, C}. Gate A
    (drift above the limit): B and C are replayed, 1 of the 2 reference groups changed. Current:
    raising every correct completion by log 3 re-scores A 3/16, B 1/4, C 9/100 (w = 3, 3, 3, 1:
    p = 9/10): B, A replayed, C of {A, C} changed: 1/2 with no gate at all."""
    a, b, c = (group(0, 0, [1.0, 1.0, 0.0, 0.0]), group(1, 0, [1.0, 0.0, 0.0, 0.0]),
               group(2, 1, [1.0, 1.0, 1.0, 0.0]))
    limit = 0.1

    def drifted(rollouts):                               # A's every token drifts by 2 x limit
        return [[lp + (2 * limit if r.prompt_id == 0 else 0.0) for lp in r.logprobs]
                for r in rollouts]
    replay = GroupReplay(tau_max=4, groups=2, candidates=8, drift_max=limit,
                                logprobs=drifted)
    replay.add(a + b, step=0)
    replay.add(c, step=1)
    assert [cands[0].prompt_id for cands in replay.candidates(2)] == [0, 2, 1]
    out = replay.sample(2, 0)
    assert {r.prompt_id for r in out} == {1, 2}
    s = replay.stats()
    assert s["replay/hd_reference"] == 2 and s["replay/hd_changed_frac"] == 0.5
    policy = Policy()
    current = GroupReplay(tau_max=4, headroom="current", groups=2, candidates=8,
                                 drift_max=10.0, logprobs=policy)
    current.add(a + b, step=0)
    current.add(c, step=1)
    current.sample(2, 0)
    assert current.stats()["replay/hd_changed_frac"] == 0.0          # the policy has not moved
    policy.shift.update({0: LOG3, 1: LOG3, 2: LOG3})
    out = current.sample(2, 0)
    assert {r.prompt_id for r in out} == {0, 1}
    assert current.stats()["replay/hd_changed_frac"] == 0.5
