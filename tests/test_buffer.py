"""RolloutReplay (buffer.py): age eviction at exactly tau_max, fresh-anchoring, P(j) ∝ |A_j|^alpha
within a binomial k-sigma bound, A = 0 never drawn, no duplicates, capacity order, exact resume,
stats by hand, no mutation.

    python -m pytest -q tests/test_buffer.py
"""
import copy
import io
import pickle
from contextlib import redirect_stderr
from dataclasses import asdict

import numpy as np
import pytest

import buffer
from buffer import RolloutReplay
from methods.headroom_drift import GroupReplay
from metrics import Metrics
from rollout import Rollout

Z = 5.0  # k-sigma bound: a correct sampler fails one category with prob ~6e-7


def mk(adv: float, version: int, pid: int = 0) -> Rollout:
    return Rollout(prompt_id=pid, prompt_ids=[1, 2], completion_ids=[3, 4, 5],
                   logprobs=[-0.1, -0.2, -0.3], text=f"A={adv} v={version}", answer="7",
                   reward=float(adv > 0), advantage=adv, version=version)


def within_binomial_bound(counts: np.ndarray, probs: np.ndarray, n: int) -> bool:
    """|count_j - n p_j| <= Z sqrt(n p_j (1 - p_j)) for every j (each count is Binomial(n, p_j))."""
    return bool(np.all(np.abs(counts - n * probs) <= Z * np.sqrt(n * probs * (1 - probs)) + 1e-9))


def single_draw_counts(replay: RolloutReplay, n: int, step: int) -> np.ndarray:
    """How often each stored rollout (identified by prompt_id) is the one drawn in n calls of
    sample(step, 1) (ratio 1: one rollout)."""
    ids = [replay.sample(step, 1)[0].prompt_id for _ in range(n)]
    return np.bincount(ids, minlength=len(replay))


# ---- age eviction and fresh-anchoring ------------------------------------------------------------
def test_eviction_at_exactly_tau_max():
    replay = RolloutReplay(tau_max=3, alpha=0.0)
    for v in range(6):
        replay.add([mk(1.0, v), mk(-1.0, v)], step=v)
    assert replay.evict(5) == 4                    # versions 0, 1: age 5, 4 > 3
    # age 3 == tau_max is kept
    assert sorted({r.version for r in replay.sample(5, 100)}) == [2, 3, 4]
    assert len(replay) == 8                        # versions 2..5 stored, 5 not replayable yet
    assert replay.sample(6, 100) and all(6 - r.version <= 3 for r in replay.sample(6, 100))
    assert replay.stats()["replay/evicted"] == 0   # the second sample at step 6 evicted nothing new
    assert len(replay) == 6                        # version 2 (age 4) went at step 6


def test_tau_max_zero_replays_nothing():
    replay = RolloutReplay(tau_max=0, alpha=1.0)
    replay.add([mk(1.0, 0)], step=0)
    assert replay.sample(1, 5) == [] and len(replay) == 0


def test_fresh_anchored_excludes_current_step_whatever_the_order():
    """add(fresh, step) before or after draw(k, step): same draw, nothing of version step, all
    versions < step."""
    a, b = RolloutReplay(tau_max=4, alpha=1.0, seed=3), RolloutReplay(tau_max=4, alpha=1.0, seed=3)
    for step in range(6):
        fresh = [mk(float(g - 1.5), step, pid=10 * step + g) for g in range(4)]
        a.add(fresh, step)                          # store first, then sample
        got_a = a.sample(step, 3)
        got_b = b.sample(step, 3)                     # sample first, then store
        b.add(fresh, step)
        assert [asdict(r) for r in got_a] == [asdict(r) for r in got_b]
        assert all(r.version < step for r in got_a)
        assert (len(got_a) == 3) == (step > 0)      # step 0 has nothing older to replay


# ---- the nonzero draw: uniform among the rollouts with A != 0 ------------------------------------
def test_nonzero_draw_never_returns_a_zero_advantage_and_is_uniform_over_the_rest():
    """--replay nonzero: P(j) = 1 / |{k: A_k != 0}| for A_j != 0, else 0, whatever |A_j| is
    (a priority draw would favour the 3.0); the bound has power against the |A| weighting."""
    abs_adv = np.array([0.0, 0.25, 0.0, 1.0, 3.0, 0.0, 0.5])
    signs = np.array([1, -1, 1, 1, -1, -1, 1])
    replay = RolloutReplay(tau_max=10, alpha=0.0, seed=4, nonzero=True)
    replay.add([mk(float(s * a), 0, pid=j) for j, (s, a) in enumerate(zip(signs, abs_adv))],
               step=0)
    n = 8000
    counts = single_draw_counts(replay, n, step=1)
    assert counts[abs_adv == 0].sum() == 0
    probs = (abs_adv > 0) / (abs_adv > 0).sum()
    assert within_binomial_bound(counts, probs, n)
    weighted = abs_adv / abs_adv.sum()
    assert not within_binomial_bound(counts, weighted, n)
    # many draws at once: never a zero, and all four nonzero ones when asked for more
    assert sorted(r.prompt_id for r in replay.sample(1, 10)) == [1, 3, 4, 6]
    assert replay.stats()["replay/sampled_nonzero"] == 4


def test_nonzero_draw_through_make_and_its_checkpoint():
    """buffer.make's nonzero kind is alpha 0 with the filter; a checkpoint records the draw, and
    one made before it existed (no key) reads as not nonzero."""
    nz = make_replay("nonzero", tau_max=2, alpha=0.7)
    assert (nz.alpha, nz.nonzero) == (0.0, True)
    assert make_replay("uniform", tau_max=2).nonzero is False
    sd = nz.state_dict()
    with pytest.raises(ValueError, match="nonzero"):
        RolloutReplay(tau_max=2, alpha=0.0).load_state_dict(sd)
    old = {k: v for k, v in RolloutReplay(tau_max=2, alpha=0.0).state_dict().items()
           if k != "nonzero"}
    RolloutReplay(tau_max=2, alpha=0.0).load_state_dict(old)
    with pytest.raises(ValueError, match="nonzero"):
        RolloutReplay(tau_max=2, alpha=0.0, nonzero=True).load_state_dict(old)


# ---- priority P(j) = |A_j|^alpha / sum_k |A_k|^alpha ---------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_single_draw_frequencies_match_priority(alpha):
    abs_adv = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
    signs = np.array([1, -1, 1, -1, 1, -1])
    replay = RolloutReplay(tau_max=10, alpha=alpha, seed=1)
    replay.add([mk(float(s * a), 0, pid=j) for j, (s, a) in enumerate(zip(signs, abs_adv))], step=0)
    n = 8000
    counts = single_draw_counts(replay, n, step=1)
    probs = abs_adv ** alpha / (abs_adv ** alpha).sum()
    assert within_binomial_bound(counts, probs, n)
    # The bound has power: the counts are far outside it under a neighbouring exponent.
    wrong = abs_adv ** (alpha + 1) / (abs_adv ** (alpha + 1)).sum()
    assert not within_binomial_bound(counts, wrong, n)


def test_uniform_replay_draws_zero_advantage_too():
    """alpha = 0 is naive replay: every stored rollout equally likely, including A = 0 (0^0 = 1)."""
    replay = RolloutReplay(tau_max=10, alpha=0.0, seed=2)
    replay.add([mk(a, 0, pid=j) for j, a in enumerate([0.0, 0.0, 5.0, -0.1])], step=0)
    n = 8000
    assert within_binomial_bound(single_draw_counts(replay, n, step=1), np.full(4, 0.25), n)


def test_k2_inclusion_follows_successive_draws_without_replacement():
    """For k = 2: P(j in S) = P(j) + sum_{i != j} P(i) P(j) / (1 - P(i)), P the normalised
    priorities; the first returned rollout is distributed as one draw, P(j)."""
    abs_adv = np.array([1.0, 2.0, 3.0, 4.0])
    replay = RolloutReplay(tau_max=10, alpha=1.0, seed=4)
    replay.add([mk(float(a), 0, pid=j) for j, a in enumerate(abs_adv)], step=0)
    p = abs_adv / abs_adv.sum()
    incl = p + np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j)
                         for j in range(4)])
    assert incl.sum() == pytest.approx(2.0)
    n = 6000
    counts, first = np.zeros(4), np.zeros(4)
    for _ in range(n):
        got = replay.sample(1, 2)
        first[got[0].prompt_id] += 1
        for r in got:
            counts[r.prompt_id] += 1
    assert within_binomial_bound(counts, incl, n)
    # returned in draw order: the first is a single draw
    assert within_binomial_bound(first, p, n)
    # not k * P(j) = [.2, .4, .6, .8]: incl = [.23, ..., .72]
    assert not within_binomial_bound(counts, 2 * p, n)


def naive_sample(stored: list[Rollout], rng: np.random.Generator, k: int, step: int, tau_max: int,
                 alpha: float) -> list[Rollout]:
    """Reference, one rollout at a time: keep age <= tau_max and version < step (and |A| > 0 if
    alpha > 0), give each key E_j / |A_j|^alpha with E_j ~ Exp(1) in storage order, return the k
    smallest keys in increasing order."""
    cand = [r for r in stored
            if step - r.version <= tau_max and r.version < step and (alpha == 0 or r.advantage)]
    e = rng.standard_exponential(len(cand))
    keyed = sorted(((e[i] / abs(r.advantage) ** alpha, i, r) for i, r in enumerate(cand)),
                   key=lambda t: t[:2])
    return [r for _, _, r in keyed[:k]]


@pytest.mark.paths
@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_vectorised_sample_equals_naive_loop(alpha):
    """Same seed, same draws, same order, across steps with eviction: the numpy path is the naive
    loop. Two paths (log keys, vectorised; E / |A|^alpha, one by one) that round differently in the
    last bits: the keys are continuous, so two of 3,000 within 1e-15 of each other (an order that
    rounding could flip) has probability ~1e-8."""
    replay, rng, stored = (RolloutReplay(tau_max=2, alpha=alpha, seed=11),
                           np.random.default_rng(11), [])
    for step in range(6):
        # 1000 of up to 3000: a partial selection
        expected = naive_sample(stored, rng, 1000, step, 2, alpha)
        assert [id(r) for r in replay.sample(step, 1000)] == [id(r) for r in expected]
        # A in {-2..2}, some 0
        fresh = [mk(float((step * 7 + g) % 5 - 2), step, pid=g) for g in range(1500)]
        replay.add(fresh, step)
        stored += fresh


def test_zero_advantage_never_drawn_when_alpha_positive():
    replay = RolloutReplay(tau_max=10, alpha=0.5, seed=5)
    replay.add([mk(0.0, 0, pid=j) for j in range(50)] + [mk(1e-6, 0, pid=50), mk(-2.0, 0, pid=51)],
               step=0)
    for _ in range(2000):
        assert all(r.advantage != 0.0 for r in replay.sample(1, 1))
    # fewer eligible than k: all of them
    assert sorted(r.prompt_id for r in replay.sample(1, 10)) == [50, 51]


def test_no_duplicates_and_all_eligible_when_short():
    replay = RolloutReplay(tau_max=10, alpha=1.0, seed=6)
    replay.add([mk(float(j % 7 + 1), j % 3, pid=j) for j in range(100)], step=2)
    for k in (1, 10, 50, 67):
        got = [r.prompt_id for r in replay.sample(2, k)]   # version 2 (33 rollouts) not eligible
        assert len(got) == k and len(set(got)) == k
    got = replay.sample(2, 1000)
    assert len(got) == 67 and len({id(r) for r in got}) == 67
    assert replay.sample(2, 0) == []


# ---- capacity, resume, stats, immutability, factory ----------------------------------------------
def test_capacity_drops_oldest_version_then_earliest_inserted():
    replay = RolloutReplay(tau_max=100, alpha=0.0, capacity=4)
    replay.add([mk(1.0, 3, pid=0), mk(1.0, 1, pid=1), mk(1.0, 2, pid=2)], step=3)
    replay.add([mk(1.0, 1, pid=3), mk(1.0, 3, pid=4), mk(1.0, 2, pid=5)], step=3)
    # versions in insertion order: 3 1 2 1 3 2 -> drop the two version-1 rollouts (pids 1 and 3)
    assert replay.stats()["replay/capacity_dropped"] == 2
    assert sorted(r.prompt_id for r in replay.sample(4, 10)) == [0, 2, 4, 5]
    # versions 3 2 3 2 4: the first-inserted version 2 (pid 2) goes
    replay.add([mk(1.0, 4, pid=6)], step=4)
    assert sorted(r.prompt_id for r in replay.sample(5, 10)) == [0, 4, 5, 6]


def _run(replay: RolloutReplay, steps: range) -> list[list[dict]]:
    """A toy loop: sample, then store a fresh group of 4 with rewards and advantages depending on
    the step."""
    out = []
    for step in steps:
        out.append([asdict(r) for r in replay.sample(step, 5)])
        adv = [(-1.0) ** g * ((step + g) % 3) for g in range(4)]
        replay.add([mk(a, step, pid=100 * step + g) for g, a in enumerate(adv)], step)
    return out


@pytest.mark.paths
def test_state_round_trip_resumes_identical_samples():
    """Bitwise: the resumed buffer holds the same records and RNG state, so it makes the same
    computations."""
    import torch
    original = RolloutReplay(tau_max=3, alpha=1.0, capacity=20, seed=7)
    _run(original, range(0, 6))
    sd = original.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    via_torch = torch.load(buf, weights_only=True)          # plain data: the safe loader accepts it
    via_pickle = pickle.loads(pickle.dumps(sd))
    # the seed comes from the state
    resumed_t = RolloutReplay(tau_max=3, alpha=1.0, capacity=20, seed=999)
    resumed_t.load_state_dict(via_torch)
    resumed_p = RolloutReplay(tau_max=3, alpha=1.0, capacity=20)
    resumed_p.load_state_dict(via_pickle)
    assert resumed_t.stats() == original.stats() and len(resumed_t) == len(original)
    expected = _run(original, range(6, 12))
    assert sum(len(s) for s in expected) > 20
    assert _run(resumed_t, range(6, 12)) == expected
    assert _run(resumed_p, range(6, 12)) == expected


def test_load_state_dict_rejects_other_hyperparameters():
    sd = RolloutReplay(tau_max=3, alpha=1.0).state_dict()
    with pytest.raises(ValueError, match="tau_max"):
        RolloutReplay(tau_max=4, alpha=1.0).load_state_dict(sd)
    with pytest.raises(ValueError, match="alpha"):
        RolloutReplay(tau_max=3, alpha=0.0).load_state_dict(sd)


def test_stats_on_a_hand_built_case():
    replay = RolloutReplay(tau_max=2, alpha=1.0)
    replay.add([mk(1.0, 0), mk(-3.0, 0), mk(0.0, 0)], step=0)
    replay.add([mk(2.0, 1), mk(-0.5, 1)], step=1)
    replay.add([mk(4.0, 2)], step=2)
    got = replay.sample(3, 10)       # evicts version 0 (age 3 > 2); eligible |A| = 2, 0.5, 4
    assert sorted(abs(r.advantage) for r in got) == [0.5, 2.0, 4.0]
    replay.add([mk(0.0, 3), mk(1.0, 3)], step=3)
    assert replay.stats() == {
        "replay/size": 5,                            # 3 left after eviction + 2 fresh
        "replay/evicted": 3,
        "replay/capacity_dropped": 0,
        "replay/sampled": 3,
        "replay/age_mean": pytest.approx((2 + 2 + 1) / 3),
        "replay/age_max": 2,
        "replay/abs_adv_sampled": pytest.approx((2 + 0.5 + 4) / 3),
        "replay/abs_adv_stored": pytest.approx((2 + 0.5 + 4 + 0 + 1) / 5),
        "replay/sampled_nonzero": 3,                 # a prioritized draw: every one has A != 0
        "replay/sampled_positive": 2,                # A = 2 and 4 (not -0.5)
        "replay/ess": pytest.approx(6.5 ** 2 / 20.25),  # (2 + 0.5 + 4)^2 / (4 + 0.25 + 16)
        "replay/stored_nonzero": 4,                  # the stored 0.0 of step 3 is the one left
        "replay/abs_adv_stored_nonzero": pytest.approx((2 + 0.5 + 4 + 1) / 4),
    }
    assert replay.sample(20, 3) == [] and replay.stats()["replay/sampled"] == 0
    assert replay.stats()["replay/age_mean"] == 0.0 and replay.stats()["replay/size"] == 0


def test_records_are_stored_as_given_and_never_mutated():
    rollouts = [mk(float(a), v, pid=j)
                for j, (a, v) in enumerate([(1, 0), (-2, 0), (0.5, 1), (3, 1), (-1, 2)])]
    before = copy.deepcopy(rollouts)
    replay = RolloutReplay(tau_max=1, alpha=1.0, capacity=4, seed=8)
    replay.add(rollouts[:3], step=1)
    replay.add(rollouts[3:], step=2)
    got = replay.sample(2, 10)
    assert all(any(g is r for r in rollouts) for g in got)   # the very objects, not re-made copies
    replay.evict(3)
    replay.load_state_dict(replay.state_dict())
    replay.sample(3, 10)
    assert rollouts == before


def test_add_rejects_future_versions_and_non_finite_advantages():
    replay = RolloutReplay(tau_max=2)
    with pytest.raises(ValueError, match="version"):
        replay.add([mk(1.0, 5)], step=4)
    with pytest.raises(ValueError, match="finite"):
        replay.add([mk(float("nan"), 0)], step=0)
    assert len(replay) == 0
    with pytest.raises(ValueError, match="k must be"):
        replay.sample(0, -1)


def make_replay(kind: str, *, tau_max: int, ratio: float = 1.0, alpha: float = 1.0,
                capacity: int | None = None, seed: int = 0):
    """buffer.make of these flags (--replay kind, --tau-max, --replay-ratio, --priority-alpha,
    --replay-capacity; capacity None: the flag's 0, unbounded)."""
    f = buffer.Flags(replay=kind, tau_max=tau_max, replay_ratio=ratio, priority_alpha=alpha,
                     replay_capacity=0 if capacity is None else capacity)
    return buffer.make(f, seed=seed)


def test_make_replay_kinds_and_argument_errors():
    assert make_replay("none", tau_max=2, alpha=1.0, capacity=None, seed=0) is None
    uniform = make_replay("uniform", tau_max=2, alpha=1.0, capacity=None, seed=0)
    prioritized = make_replay("prioritized", tau_max=2, alpha=0.7, capacity=10, seed=0)
    assert (uniform.alpha, uniform.tau_max) == (0.0, 2)
    assert (prioritized.alpha, prioritized.capacity) == (0.7, 10)
    # the flag's 0 is "unbounded"; a capacity of 0 is an error where the buffer is made directly
    bad = [dict(tau_max=-1), dict(kind="none", tau_max=-1), dict(alpha=-0.1),
           dict(alpha=float("nan")), dict(capacity=-1), dict(tau_max=1.5)]
    for override in bad:
        kw = dict(kind="prioritized", tau_max=2, alpha=1.0, capacity=None, seed=0) | override
        with pytest.raises(ValueError, match="replay: "):
            make_replay(**kw)
    with pytest.raises(ValueError, match="replay: capacity"):
        RolloutReplay(tau_max=2, capacity=0)
    # an unknown kind is the command line's error (the kinds: buffer.KINDS and the methods')
    import flags
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()):
        flags.parse(["--replay", "greedy"])


# ---- the trainer's interface: sample(step, n_fresh), buffer.report ------------------------------
def test_sample_draws_round_ratio_times_n_fresh():
    """sample(step, n_fresh) draws k = round(ratio * n_fresh): the same rollouts, in the same
    order, as a ratio-1 buffer asked for k."""
    for n_fresh in (0, 1, 3, 7, 8, 16, 40):
        a = RolloutReplay(tau_max=4, alpha=1.0, seed=9, ratio=0.5)
        b = RolloutReplay(tau_max=4, alpha=1.0, seed=9, ratio=1.0)
        stored = [mk(float(j % 5 + 1), 0, pid=j) for j in range(30)]
        a.add(stored, step=0)
        b.add(stored, step=0)
        got = a.sample(1, n_fresh)
        assert len(got) == round(0.5 * n_fresh), n_fresh
        assert [id(r) for r in got] == [id(r) for r in b.sample(1, round(0.5 * n_fresh))]
    short = RolloutReplay(tau_max=4, alpha=1.0, ratio=2.0)
    short.add([mk(1.0, 0, pid=j) for j in range(5)], step=0)
    assert len(short.sample(1, 8)) == 5             # fewer eligible than round(2 x 8): all of them
    assert make_replay("prioritized", tau_max=2, ratio=0.25).ratio == 0.25
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ratio"):
            RolloutReplay(tau_max=2, ratio=bad)


def test_report_weights_each_key_by_what_it_averages():
    """buffer.report: a mean with the count it averages (age_mean and abs_adv_sampled by
    replay/sampled, abs_adv_stored by replay/size), age_max a maximum, the rest totals; two buffers
    reported into one Metrics combine as two ranks do. No buffer: NO_REPLAY."""
    one = RolloutReplay(tau_max=9, alpha=0.0)
    one.add([mk(1.0, 0), mk(-3.0, 1), mk(2.0, 2)], step=2)
    assert len(one.sample(3, 10)) == 3                 # ages 3, 2, 1; |A| 1, 3, 2
    two = RolloutReplay(tau_max=9, alpha=0.0)
    two.add([mk(4.0, 5)], step=5)
    assert len(two.sample(6, 10)) == 1                 # age 1; |A| 4
    empty = RolloutReplay(tau_max=9, alpha=0.0)
    empty.add([mk(8.0, 7)] * 4, step=7)
    assert empty.sample(7, 10) == []                   # nothing drawn: its age_mean 0.0 weighs 0
    m = Metrics()
    for replay in (one, two, empty):
        buffer.report(replay, m)
    assert m.stats["replay/age_mean"][0] == "mean" and m.stats["replay/age_max"][0] == "max"
    assert m.stats["replay/size"][0] == m.stats["replay/sampled"][0] == "sum"
    row = m.reduce(1)
    assert row["replay/size"] == 3 + 1 + 4 and row["replay/sampled"] == 4
    assert row["replay/age_mean"] == pytest.approx((3 + 2 + 1 + 1) / 4)
    assert row["replay/abs_adv_sampled"] == pytest.approx((1 + 3 + 2 + 4) / 4)
    assert row["replay/abs_adv_stored"] == pytest.approx((1 + 3 + 2 + 4 + 8 * 4) / 8)
    assert row["replay/age_max"] == 3
    none = Metrics()
    buffer.report(None, none)
    assert none.reduce(1) == buffer.NO_REPLAY == {"replay/size": 0, "replay/sampled": 0,
                                                  "replay/age_mean": 0.0}


def test_report_weights_headroom_drift_keys():
    """GroupReplay's (methods.headroom_drift) means: headroom_mean over the replayed groups,
    drift_mean and drift_gated_frac over the drift pass's candidates."""
    def group(pid, version, rewards, shift):
        return [Rollout(prompt_id=pid, prompt_ids=[1], completion_ids=[2, 3], logprobs=[-1.0, -1.0],
                        reward=r, advantage=r - sum(rewards) / len(rewards), version=version,
                        text=str(shift)) for r in rewards]

    def logprobs(rollouts):                   # D(g) = |shift| for every rollout of a group
        return [[lp + float(r.text) for lp in r.logprobs] for r in rollouts]

    a = GroupReplay(tau_max=9, groups=8, candidates=8, drift_max=0.5, logprobs=logprobs)
    a.add(group(0, 0, [1, 0], 0.0) + group(1, 0, [1, 0, 0, 0], 0.25) + group(2, 0, [1, 0], 1.0),
          step=0)
    assert len(a.sample(1, 0)) == 6                       # groups 0 and 1 pass, group 2 is gated
    b = GroupReplay(tau_max=9, groups=8, candidates=8, drift_max=0.5, logprobs=logprobs)
    b.add(group(3, 0, [1, 0, 0, 0], 0.5), step=0)
    assert len(b.sample(1, 0)) == 4
    m = Metrics()
    buffer.report(a, m)
    buffer.report(b, m)
    row = m.reduce(1)
    assert row["replay/groups"] == 3 and row["replay/drift_candidates"] == 4
    assert row["replay/headroom_mean"] == pytest.approx((0.25 + 0.1875 + 0.1875) / 3)
    assert row["replay/drift_mean"] == pytest.approx((0.0 + 0.25 + 1.0 + 0.5) / 4)
    assert row["replay/drift_gated_frac"] == pytest.approx(1 / 4)
    assert row["replay/age_mean"] == pytest.approx(1.0) and row["replay/sampled"] == 10


# ---- what the priority favours (buffer.py's docstring) -------------------------------------------
def binary_groups(rights: list[int], g: int = 8) -> list[Rollout]:
    """One group per entry of `rights` (k of g right, binary reward), advantages by
    grpo.grpo_advantages, every rollout a distinct prompt_id (its position), version 0."""
    import grpo
    import torch
    rewards = torch.tensor([float(i < k) for k in rights for i in range(g)])        # [B]
    ids = torch.tensor([j for j, _ in enumerate(rights) for _ in range(g)])         # [B]
    adv = grpo.grpo_advantages(rewards, ids).tolist()
    return [Rollout(prompt_id=i, prompt_ids=[1], completion_ids=[2], logprobs=[-0.5],
                    reward=rewards[i].item(), advantage=a, version=0)
            for i, a in enumerate(adv)]


@pytest.mark.parametrize("k", range(1, 8))
def test_a_groups_positives_and_negatives_hold_equal_priority(k):
    """Advantages sum to zero in a group, so at alpha = 1 the A > 0 and A < 0 rollouts carry the
    same total |A|; the total is 2 sqrt(G (G - 1)) sqrt(p (1 - p)) with Bessel's correction
    (2 G sqrt(p (1 - p)) without), p = k / G: by hand for G = 8."""
    adv = np.array([r.advantage for r in binary_groups([k])])
    p = k / 8
    assert adv[adv > 0].sum() == pytest.approx(-adv[adv < 0].sum(), rel=1e-6)
    assert np.abs(adv).sum() == pytest.approx(2 * np.sqrt(8 * 7) * np.sqrt(p * (1 - p)),
                                              rel=1e-5)       # eps = 1e-6 in the denominator
    assert adv[adv > 0] == pytest.approx((1 - p) / np.sqrt(8 / 7 * p * (1 - p)), rel=1e-5)


def test_the_priority_favours_mid_difficulty_groups_and_draws_signs_evenly():
    """Groups with 1, 2 and 4 of 8 right (and one all-wrong): the first draw of a prioritized
    buffer lands in each group in proportion to sqrt(p (1 - p)) (k = 4 gets 1.51x k = 1's share;
    the flat group never) and on A > 0 half the time; a nonzero draw weighs the three groups
    alike and draws positives k : G - k, 7 of 24. Counts over 6,000 single draws, within Z
    sigma."""
    rights = [1, 2, 4, 0]
    group_of = np.repeat(np.arange(len(rights)), 8)                    # [32] each rollout's group
    weight = np.array([np.sqrt(k / 8 * (1 - k / 8)) for k in rights])   # [4] sqrt(p (1 - p))
    n = 6000
    for nonzero, expect in ((False, weight / weight.sum()), (True, np.array([1, 1, 1, 0]) / 3)):
        replay = RolloutReplay(tau_max=4, alpha=0.0 if nonzero else 1.0, seed=3, ratio=1.0,
                               nonzero=nonzero)
        replay.add(binary_groups(rights), step=0)
        counts = single_draw_counts(replay, n, step=1)                   # [32]
        per_group = np.bincount(group_of, weights=counts, minlength=4)
        assert per_group[3] == 0                                         # the flat group
        assert within_binomial_bound(per_group[:3], expect[:3], n), (nonzero, per_group)
        positive = counts[[r.advantage > 0 for r in binary_groups(rights)]].sum()
        share = 0.5 if not nonzero else 7 / 24              # (1 + 2 + 4) of the 24 with A != 0
        assert within_binomial_bound(np.array([positive]), np.array([share]), n)
    assert weight[2] / weight[0] == pytest.approx(1.51, abs=0.01)


def test_the_draw_logs_its_positives_and_its_effective_size():
    """replay/sampled_positive counts the replayed A > 0; replay/ess is (Σw)² / Σw² over the
    candidates: for a uniform draw their count, for the prioritized one fewer."""
    for alpha, nonzero, ess in ((0.0, False, 32.0), (0.0, True, 24.0), (1.0, False, None)):
        replay = RolloutReplay(tau_max=4, alpha=alpha, seed=0, ratio=0.25, nonzero=nonzero)
        rollouts = binary_groups([1, 4, 7, 0])
        replay.add(rollouts, step=0)
        got = replay.sample(1, 32)
        stats = replay.stats()
        assert stats["replay/sampled_positive"] == sum(r.advantage > 0 for r in got)
        w = np.abs([r.advantage for r in rollouts if r.advantage != 0])
        want = ess if ess is not None else w.sum() ** 2 / (w ** 2).sum()
        assert stats["replay/ess"] == pytest.approx(want)
        replay.sample(2, 0)                         # nothing drawn (k = 0): 0, not the pool's
        assert replay.stats()["replay/ess"] == 0.0 and replay.stats()["replay/sampled"] == 0
    assert buffer.effective_size(np.array([]), 1.0) == 0.0
