"""VIGOR's variance-guided allocation (methods.vigor.vigor_generate): the budget, who gets the
extra completions, and variable-size groups through the advantages, the loss's normaliser and the
replay buffer; the readings (a Beta prior, marginal-gain ranking, prompt weighting) on hand-built
groups; the variance of the reward's credit (train.credit) under --reward partial."""
import functools

import pytest
import torch

import buffer
import flags
import grpo
import train
import verify
from data import Prompt
from methods import vigor
from methods.vigor import vigor_generate
from rollout import Rollout, Sampling
from tiny import run_of

# the credit under --reward correct, c = v (train.credit, the spine step VIGOR calls: methods.Steps)
VERDICTS = functools.partial(train.credit, f=flags.RewardFlags())

# prompt -> the verdicts of its successive completions, cycled: 0 always right, 1 half right, 2
# right 1 in 4, 3 always wrong. Variances after 2 completions: 0, 0.25, 0 or 0.25 (...) , 0.
PATTERNS = {0: [1], 1: [1, 0], 2: [0, 1, 0, 0], 3: [0]}


class PatternEngine:
    def __init__(self):
        self.calls, self.made = [], {p: 0 for p in PATTERNS}

    def generate(self, prompts, n, sampling, version=0):
        self.calls.append((len(prompts), n, sampling.seed))
        out = []
        for p in prompts:
            for _ in range(n):
                pattern = PATTERNS[p.prompt_id]
                text = str(pattern[self.made[p.prompt_id] % len(pattern)])
                out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=[1], completion_ids=[2, 3],
                                   logprobs=[-1.0, -1.0], text=text, version=version))
                self.made[p.prompt_id] += 1
        return out


def grade(rollouts):
    """vigor_generate's callback: the verdict r.correct, as train.grade sets it."""
    for r in rollouts:
        r.correct = float(r.text == "1")


def run(budget, n_init=2, n_step=2, top=2):
    engine, prompts = PatternEngine(), [Prompt(i, [1]) for i in PATTERNS]
    out, stats = vigor_generate(engine, prompts, lambda k: Sampling(seed=100 + k), 0, grade,
                                credit=VERDICTS, n_init=n_init, n_step=n_step, top=top,
                                budget=budget)
    sizes = {p: sum(r.prompt_id == p for r in out) for p in PATTERNS}
    return out, stats, sizes, engine


@pytest.mark.parametrize("budget", [8, 13, 16, 17, 21])
def test_budget_spent_exactly_and_only_on_prompts_with_variance(budget):
    out, stats, sizes, engine = run(budget)
    assert len(out) == budget          # also when budget - 8 is not a multiple of n_step
    assert sizes[0] == sizes[3] == 2   # zero variance after n_init: nothing more
    assert sizes[1] + sizes[2] == budget - 4
    assert stats["vigor/group_size_min"] == 2
    assert stats["vigor/group_size_max"] == max(sizes.values())
    assert stats["vigor/group_size_mean"] == pytest.approx(budget / 4)
    # each round: one engine call, with its own seed
    assert [n for _, n, _ in engine.calls] == [2] + [1] * stats["vigor/rounds"]
    assert len({seed for _, _, seed in engine.calls}) == len(engine.calls)
    assert [r.prompt_id for r in out] == sorted(r.prompt_id for r in out)   # grouped by prompt


def test_highest_variance_first():
    """n_init = 4: prompt 1 has (1, 0, 1, 0), variance 0.25; prompt 2 has (0, 1, 0, 0), variance
    0.1875; prompts 0 and 3 have 0. With top = 1 every round goes to prompt 1 (its variance stays
    0.25); with top = 2 and a budget of 16 + 3 the one round is cut to fit: 2 to prompt 1 (the
    higher), the last 1 to prompt 2."""
    _, stats, sizes, _ = run(budget=20, n_init=4, top=1)
    assert sizes == {0: 4, 1: 8, 2: 4, 3: 4} and stats["vigor/rounds"] == 2
    _, stats, sizes, _ = run(budget=19, n_init=4, top=2)
    assert sizes == {0: 4, 1: 6, 2: 5, 3: 4} and stats["vigor/rounds"] == 1
    assert stats["vigor/zero_std_frac_before"] == 0.5


def test_all_zero_variance_stops_early():
    engine, prompts = PatternEngine(), [Prompt(0, [1]), Prompt(3, [1])]
    out, stats = vigor_generate(engine, prompts, lambda k: Sampling(seed=k), 0, grade,
                                credit=VERDICTS, n_init=2, n_step=2, top=2, budget=12)
    assert len(out) == 4 and stats["vigor/rounds"] == 0
    assert stats["vigor/zero_std_frac_before"] == 1.0


def test_variable_size_groups_advantages_normaliser_and_replay():
    """Groups of 2 and 6: GRPO's advantage per group by hand; the token-mean normaliser counts every
    token; the rollout-level buffer stores and replays them with their advantages."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    group = torch.tensor([7, 7, 9, 9, 9, 9, 9, 9])
    adv = grpo.grpo_advantages(rewards, group)
    # group 7: mean 0.5, Bessel std sqrt(0.5); group 9: mean 4/6,
    # std sqrt((4 (1/3)^2 + 2 (2/3)^2) / 5) = sqrt(4/15)
    s7, s9 = 0.5 ** 0.5, (4 / 15) ** 0.5
    expected = ([0.5 / (s7 + 1e-6), -0.5 / (s7 + 1e-6)]
                + [(r - 2 / 3) / (s9 + 1e-6) for r in (1, 0, 1, 1, 1, 0)])
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    mask = torch.ones(8, 3)
    assert grpo.loss_normaliser(mask, "token-mean") == 24.0
    assert grpo.loss_normaliser(mask, "seq-mean-token-mean") == 8
    replay = buffer.make(buffer.Flags(replay="prioritized", tau_max=2, priority_alpha=1.0), seed=0)
    rs = [Rollout(prompt_id=int(g), prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
                  advantage=float(a), version=0) for g, a in zip(group, adv)]
    replay.add(rs, step=0)
    drawn = replay.sample(1, 16)                     # replay ratio 0.5: 8 of 16
    # all 8 have |A| > 0
    assert sorted(r.advantage for r in drawn) == sorted(float(a) for a in adv)
    assert {r.prompt_id for r in drawn} == {7, 9}


def beta_posterior_variance(rollouts, prior):
    """{prompt_id: p_q (1 - p_q)} of the 0/1 verdicts, p_q = (s_q + prior) / (n_q + 2 prior): the
    variance VIGOR ranked by before it read the reward's credit, computed as that code did."""
    import collections
    n, s = collections.Counter(), collections.Counter()
    for r in rollouts:
        n[r.prompt_id] += 1
        s[r.prompt_id] += r.correct
    p = {q: (s[q] + prior) / (n[q] + 2 * prior) for q in n}
    return {q: p[q] * (1 - p[q]) for q in n}


@pytest.mark.parametrize("reading", [(), ("--vigor-rank", "variance", "--vigor-prior", "0")])
def test_vigor_preset_trains_through_the_loop(tmp_path, cpu_only, monkeypatch, reading):
    """`--preset vigor` on the built-in task: 8 prompts x 4 = a budget of 32 completions per step,
    2 each first, the rest by the preset's reading (arith dev's: top-k with a Beta(0.25, 0.25)
    prior) or the first reading (the highest variance: some group gets more than 4); the metrics
    say so. Under --reward correct the credit VIGOR is handed is the verdict, and every variance it
    ranks by is the Beta posterior's p (1 - p) of the verdicts to the last bit
    (beta_posterior_variance), so its group sizes are those of the verdict reading."""
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout

    import train
    smoothed_variance, calls = vigor.smoothed_variance, []

    def checked(rollouts, credits, prior):
        n, var = smoothed_variance(rollouts, credits, prior)
        assert credits == [r.correct for r in rollouts]
        assert var == beta_posterior_variance(rollouts, prior)                    # ==, not approx
        calls.append(prior)
        return n, var
    monkeypatch.setattr(vigor, "smoothed_variance", checked)
    out = tmp_path / "run"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        rc = train.main(["--preset", "vigor", "--steps", "2", "--prompts-per-step", "8",
                         "--group-size", "4", "--vigor-top", "2", "--max-new-tokens", "6",
                         "--eval-size", "8", "--eval-every", "0", "--threads", "1",
                         "--out-dir", str(out), *reading])
    assert rc == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    for m in steps:
        assert m["rollout/generated"] == 32 and m["batch/fresh"] == 32 and m["vigor/rounds"] >= 1
        assert m["vigor/group_size_min"] >= 2 and m["vigor/group_size_max"] >= 4
        assert m["vigor/group_size_max"] > 4 or not reading
        assert m["vigor/group_size_mean"] == pytest.approx(4.0)
        assert m["replay/sampled"] == 0          # the preset: VIGOR on plain GRPO, no replay
    # per step: vigor/zero_std_frac_before's (prior 0), then each round's (the reading's prior)
    prior = 0.0 if reading else 0.25
    assert len(calls) >= 2 * 2 and set(calls) == {0.0, prior}


# ---- the readings: --vigor-prior, --vigor-rank marginal, --vigor-weight prompt ------------------

def run_reading(budget, rank="marginal", prior=1.0, n_init=2, n_step=2, top=2, full=0):
    engine, prompts = PatternEngine(), [Prompt(i, [1]) for i in PATTERNS]
    out, stats = vigor_generate(engine, prompts, lambda k: Sampling(seed=100 + k), 0, grade,
                                credit=VERDICTS, n_init=n_init, n_step=n_step, top=top,
                                budget=budget, rank=rank, prior=prior, full=full)
    return out, stats, {p: sum(r.prompt_id == p for r in out) for p in PATTERNS}


def test_beta_prior_by_hand():
    """Beta(1, 1): 0 right of 2 -> p = 1/4, sigma^2 = 3/16; 1 of 2 -> 1/2, 1/4; 2 of 2 -> 3/4,
    3/16. Without a prior the first and last are 0."""
    rs = [Rollout(prompt_id=q, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], correct=c)
          for q, c in [(0, 0), (0, 0), (1, 1), (1, 0), (2, 1), (2, 1)]]
    n, var = vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), 1.0)
    assert n == {0: 2, 1: 2, 2: 2} and var == {0: 3 / 16, 1: 1 / 4, 2: 3 / 16}
    assert vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), 0.0)[1] == {0: 0.0, 1: 0.25, 2: 0.0}


def test_marginal_gain_by_hand_a_zero_variance_prompt_still_gets_rollouts():
    """After 2 each (prompt 0: 1, 1; 1: 1, 0; 2: 0, 1; 3: 0, 0) with prior 1: sigma^2 = 3/16, 1/4,
    1/4, 3/16, gain sigma^2 / (2 x 3) = 1/32, 1/24, 1/24, 1/32. The round's 4 go to 1 and 2 (1/24),
    then at n = 3 theirs is 1/4 / 12 = 1/48 < 1/32: to 0 and 3. So the two prompts whose 2
    completions agreed get one more each; without the prior they get none."""
    out, stats, sizes = run_reading(budget=12)
    assert sizes == {0: 3, 1: 3, 2: 3, 3: 3} and stats["vigor/rounds"] == 1 and len(out) == 12
    _, _, sizes = run_reading(budget=12, prior=0.0)
    assert sizes[0] == sizes[3] == 2 and sizes[1] + sizes[2] == 8


def test_marginal_gain_goes_where_the_variance_is():
    """sigma^2 = 1/4 and 1/100 after 2 each: gains 1/24 and 1/600; the first prompt's next gains
    1/48, 1/80, 1/120 all exceed 1/600, so a round of 4 gives it all 4."""
    prompts = [Prompt(0, [1]), Prompt(1, [1])]
    extra = vigor.by_marginal_gain(prompts, {0: 2, 1: 2}, {0: 0.25, 1: 0.01}, 2, 2, 99)
    assert [p.prompt_id for p in extra] == [0, 0, 0, 0]
    cut = vigor.by_marginal_gain(prompts, {0: 2, 1: 2}, {0: 0.25, 1: 0.01}, 2, 2, 3)
    assert cut == [prompts[0]] * 3


def test_marginal_gain_is_neyman_allocation():
    """sigma = 1/2 and 1/4 (sigma^2 1/4, 1/16) from 1 each, 28 more: greedy stops where
    n0 (n0 + 1) / (n1 (n1 + 1)) is about 4, i.e. n_q ∝ sigma_q: 20 and 10 (420 / 110 against the
    next 462 / 132)."""
    prompts = [Prompt(0, [1]), Prompt(1, [1])]
    extra = vigor.by_marginal_gain(prompts, {0: 1, 1: 1}, {0: 0.25, 1: 0.0625}, 28, 1, 28)
    assert sum(p.prompt_id == 0 for p in extra) + 1 == 20
    assert sum(p.prompt_id == 1 for p in extra) + 1 == 10


@pytest.mark.parametrize("rank", ["variance", "marginal"])
@pytest.mark.parametrize("budget", [8, 13, 16, 17, 21, 40])
def test_budget_spent_exactly_with_the_prior(rank, budget):
    out, stats, sizes = run_reading(budget, rank=rank)
    assert len(out) == budget and min(sizes.values()) >= 2
    assert [r.prompt_id for r in out] == sorted(r.prompt_id for r in out)


def test_prompt_weights_make_each_prompts_total_weight_equal():
    """Groups of 2, 6 and 4 (mean 4): weights 2, 2/3 and 1; every prompt's weights sum to 4, and all
    of them to the 12 rollouts."""
    sizes = {7: 2, 9: 6, 3: 4}
    rs = [Rollout(prompt_id=q, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0])
          for q, n in sizes.items() for _ in range(n)]
    w = vigor.prompt_weights(rs)
    assert w == [2.0] * 2 + [4 / 6] * 6 + [1.0] * 4
    for q in sizes:
        assert sum(x for x, r in zip(w, rs) if r.prompt_id == q) == pytest.approx(4.0)
    assert sum(w) == pytest.approx(12.0)


def test_score_scales_advantages_by_prompt_weight(monkeypatch):
    """Through the allocate slot (Vigor.allocate, on the run the door builds): the spine scores
    VIGOR's groups, then --vigor-weight prompt scales their advantages."""
    rs = [Rollout(prompt_id=q, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], correct=c)
          for q, c in [(7, 1), (7, 0)] + [(9, c) for c in (1, 0, 1, 1, 1, 0)]]
    monkeypatch.setattr(vigor, "vigor_generate", lambda *a, **kw: (rs, {}))

    def score(args):
        run = run_of(args)
        fresh, _, _, _ = train.generate_and_score(run, 0, 0)
        assert fresh == rs
    score(flags.Args(allocation="vigor"))
    plain = [r.advantage for r in rs]
    score(flags.Args(allocation="vigor", vigor_weight="prompt"))
    assert [r.advantage for r in rs] == pytest.approx([a * 2.0 for a in plain[:2]]
                                                      + [a * 4 / 6 for a in plain[2:]])


# ---- the readings that concentrate: a weak --vigor-prior, --vigor-rank topk ---------------------

@pytest.mark.parametrize("prior", [0.0, 0.1, 0.25, 0.5, 1.0, 3.0])
def test_smoothed_variance_of_verdicts_is_the_beta_posteriors_to_the_last_bit(prior):
    """On 0/1 credits c^2 = c, so m2_q = m_q and sigma_q^2 = m_q (1 - m_q) - 0.0: the Beta(a, a)
    posterior's p (1 - p) bit for bit (==), for every s right of n up to 40, the rollouts of all
    the prompts interleaved."""
    import random
    cases = [(n, s) for n in range(1, 41) for s in range(n + 1)]
    rs = [Rollout(prompt_id=q, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
                  correct=float(i < s)) for q, (n, s) in enumerate(cases) for i in range(n)]
    random.Random(0).shuffle(rs)
    n, var = vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), prior)
    assert n == {q: nq for q, (nq, _) in enumerate(cases)}
    assert var == beta_posterior_variance(rs, prior)


def test_weak_prior_by_hand():
    """Beta(1/2, 1/2): 0 right of 2 -> p = (0 + 1/2) / 3 = 1/6, sigma^2 = 5/36; 1 of 2 -> 1/2, 1/4;
    2 of 2 -> 5/6, 5/36. The hopeless prompt trails by (n + 2a)^2 / (4 a (n + a)) = 9/5, against
    4/3 with Beta(1, 1) (3/16 against 1/4)."""
    rs = [Rollout(prompt_id=q, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], correct=c)
          for q, c in [(0, 0), (0, 0), (1, 1), (1, 0), (2, 1), (2, 1)]]
    _, var = vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), 0.5)
    assert var == pytest.approx({0: 5 / 36, 1: 1 / 4, 2: 5 / 36})
    assert var[1] / var[0] == pytest.approx(9 / 5)
    _, var = vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), 1.0)
    assert var[1] / var[0] == pytest.approx(4 / 3)


def test_top_k_by_hand():
    """After 2 each (prompt 0: 1, 1; 1: 1, 0; 2: 0, 1; 3: 0, 0), prior 1: sigma^2 = 3/16, 1/4, 1/4,
    3/16, ranked 1, 2, 0, 3 (ties in prompt order). Budget 20: N = max(2 x 20 // 4, 5) = 10, the
    12 left go 8 to prompt 1 (to 10), 4 to prompt 2 (cut to fit); 21: 8 and 5. --vigor-full 4 at
    budget 16: N = 4, every prompt to 4 (the fixed allocation); --vigor-full 3 is raised to
    ceil(16 / 4) = 4, so the budget can be spent. One round each; prompts 0 and 3 keep their 2."""
    out, stats, sizes = run_reading(20, rank="topk")
    assert sizes == {0: 2, 1: 10, 2: 6, 3: 2} and stats["vigor/rounds"] == 1 and len(out) == 20
    _, _, sizes = run_reading(21, rank="topk")
    assert sizes == {0: 2, 1: 10, 2: 7, 3: 2}
    for full in (4, 3):
        assert run_reading(16, rank="topk", full=full)[2] == {0: 4, 1: 4, 2: 4, 3: 4}
    # the ranking alone, on made-up counts (N = 6, 7 left): prompt 1 (sigma^2 0.25) already has 5,
    # so it takes 1; prompt 2 (0.2) takes 4, to 6; prompt 0 (0.1) the last 2
    prompts = [Prompt(q, [1]) for q in range(3)]
    extra = vigor.by_top_k(prompts, {0: 2, 1: 5, 2: 2}, {0: 0.1, 1: 0.25, 2: 0.2}, 6, 7)
    assert [p.prompt_id for p in extra] == [0, 0, 1, 2, 2, 2, 2]


def test_top_k_spends_the_budget_even_when_no_prompt_has_variance():
    """Prior 0, prompts 0 (always right) and 3 (always wrong): both sigma^2 = 0, where variance and
    marginal stop at 4 (test_all_zero_variance_stops_early); topk ranks them anyway (prompt order):
    N = max(2 x 12 // 2, 6) = 12, prompt 0 gets the 8 left."""
    engine, prompts = PatternEngine(), [Prompt(0, [1]), Prompt(3, [1])]
    out, stats = vigor_generate(engine, prompts, lambda k: Sampling(seed=k), 0, grade,
                                credit=VERDICTS, n_init=2, n_step=2, top=2, budget=12,
                                rank="topk")
    assert len(out) == 12 and stats["vigor/group_size_min"] == 2
    assert sum(r.prompt_id == 0 for r in out) == 10


@pytest.mark.parametrize("prior", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("full", [0, 3, 5, 40])
@pytest.mark.parametrize("budget", [8, 13, 16, 17, 21, 40])
def test_top_k_spends_the_budget_exactly_and_keeps_the_floor(prior, full, budget):
    """Whatever the prior and --vigor-full (0, below the floor, above the mean, above the budget):
    exactly the budget, in one round after the first (none when the first 2 each spend it), and
    every prompt keeps its 2."""
    out, stats, sizes = run_reading(budget, rank="topk", prior=prior, full=full)
    assert len(out) == budget and min(sizes.values()) >= 2
    assert stats["vigor/rounds"] == (1 if budget > 8 else 0)
    assert [r.prompt_id for r in out] == sorted(r.prompt_id for r in out)


def test_top_k_flags_and_their_rule():
    a = flags.parse(["--allocation", "vigor", "--vigor-rank", "topk", "--vigor-full", "12"])
    assert (a.vigor_rank, a.vigor_full) == ("topk", 12)
    assert flags.Args().vigor_full == 0 and flags.Args().vigor_rank == "marginal"   # unchanged
    bad = vigor.Flags(allocation="vigor", vigor_rank="topk", vigor_full=2)
    assert [message for broken, message in bad.rules() if broken] == [
        "--vigor-full must exceed --vigor-n-init (or be 0): a chosen prompt must get more than "
        "every prompt's first completions"]
    assert not any(broken for broken, _ in vigor.Flags(allocation="vigor", vigor_full=2).rules())


class HopelessEngine:
    """10 prompts: 0-6 hopeless (always wrong, p = 0 on their whole history), 7-9 alternately right
    and wrong (1, 0, 1, 0, ...)."""
    patterns = {q: [0] if q < 7 else [1, 0] for q in range(10)}

    def __init__(self):
        self.calls, self.made = [], {p: 0 for p in self.patterns}

    def generate(self, prompts, n, sampling, version=0):
        out = []
        for p in prompts:
            for _ in range(n):
                pattern = self.patterns[p.prompt_id]
                text = str(pattern[self.made[p.prompt_id] % len(pattern)])
                out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=[1], completion_ids=[2],
                                   logprobs=[-1.0], text=text, version=version))
                self.made[p.prompt_id] += 1
        return out


def hopeless_sizes(rank, prior, full=0):
    prompts = [Prompt(q, [1]) for q in range(10)]
    out, stats = vigor_generate(HopelessEngine(), prompts, lambda k: Sampling(seed=k), 0, grade,
                                credit=VERDICTS, n_init=2, n_step=2, top=16, budget=80,
                                rank=rank, prior=prior, full=full)
    assert len(out) == 80
    return [sum(r.prompt_id == q for r in out) for q in range(10)], stats


def test_with_70_percent_hopeless_prompts_the_concentrating_readings_spend_less_on_them():
    """10 prompts, 7 hopeless, 3 at p = 1/2 (HopelessEngine), 2 each first, a budget of 80 (8 a
    prompt), rounds of 16 x 2 = 32. By hand, from gain = sigma^2 / (n (n + 1)):

    marginal, Beta(1, 1): round 1 (sigma^2 3/16 hopeless, 1/4 signal): the gains in order are
    signal n=2 (1/24), hopeless n=2 (1/32), signal n=3, hopeless n=3 (1/64), signal n=4 (1/80),
    hopeless n=4 (3/320), then 2 of signal n=5 (1/120): hopeless at 5, signal 6, 6, 5. Round 2
    (28; hopeless 0 of 5: sigma^2 = 6/49; signal 3 of 6: 1/4, 3 of 5: 12/49): the hopeless get 2
    more each (their gains 6/49/30 and 6/49/42 beat the signal's from n = 10 on), the signal 5, 4
    and 5. Sizes 7 x 7, 11, 10, 10: 49 of 80 (61%) on the hopeless prompts.
    marginal, Beta(0.1, 0.1): round 1 (hopeless sigma^2 0.21/4.84 = 0.0434, gain 0.00723 at n=2,
    0.00362 at n=3): signal n = 2..7 (18), hopeless n = 2, 3 (14): hopeless 4, signal 8. Round 2
    (hopeless 0 of 4: 0.41/17.64 = 0.0232, gain 0.00116 at n=4): signal n = 8..14 (21, gains down
    to 1/840 = 0.00119), then the hopeless 1 each (7). Sizes 7 x 5, 15 x 3: 35 of 80 (44%).
    topk, Beta(1, 1): N = 2 x 80 // 10 = 16; the signal prompts rank first and are brought to 16
    (14 each, 42 of the 60 left), then prompt 0 to 16 (14) and prompt 1 the last 4: 32 of 80
    (40%). topk with --vigor-full 24: 22, 22 and 16 to the signal prompts, the hopeless keep their
    floor of 2: 14 of 80 (17.5%), the least any reading can give them."""
    sizes, stats = hopeless_sizes("marginal", 1.0)
    assert sizes == [7] * 7 + [11, 10, 10] and stats["vigor/rounds"] == 2
    assert sum(sizes[:7]) == 49
    sizes, stats = hopeless_sizes("marginal", 0.1)
    assert sizes == [5] * 7 + [15] * 3 and stats["vigor/rounds"] == 2
    assert sum(sizes[:7]) == 35
    sizes, stats = hopeless_sizes("topk", 1.0)
    assert sizes == [16, 6, 2, 2, 2, 2, 2, 16, 16, 16] and stats["vigor/rounds"] == 1
    assert sum(sizes[:7]) == 32
    sizes, _ = hopeless_sizes("topk", 1.0, full=24)
    assert sizes == [2] * 7 + [24, 24, 18] and sum(sizes[:7]) == 14
    # the floor: no prompt ever has fewer than its first 2, whatever the reading
    for rank, prior in (("marginal", 0.1), ("topk", 0.1), ("topk", 0.0), ("marginal", 0.5)):
        assert min(hopeless_sizes(rank, prior)[0]) >= 2


# ---- --reward partial: the variance of the partial credit, c = (v + share) / 2 ------------------

class ChainEngine:
    """3 prompts, gold 5, each answered by cycling through its chains (verify.step_share, the
    long task's grader verify.grade_integer): prompt 0 all wrong with different shares
    ("2+3=4=4=4": 1 of 4 steps keeps 5, c = (0 + 1/4) / 2 = 1/8; "2+3=5=5=4": 3 of 4, c = 3/8),
    1 all wrong with share 0 ("9": c = 0), 2 all right ("2+3=5": c = (1 + 1) / 2 = 1)."""
    chains = {0: ["2+3=4=4=4", "2+3=5=5=4"], 1: ["9"], 2: ["2+3=5"]}

    def __init__(self):
        self.made = {q: 0 for q in self.chains}

    def generate(self, prompts, n, sampling, version=0):
        out = []
        for p in prompts:
            for _ in range(n):
                chains = self.chains[p.prompt_id]
                text = chains[self.made[p.prompt_id] % len(chains)]
                out.append(Rollout(prompt_id=p.prompt_id, prompt_ids=[1], completion_ids=[2],
                                   logprobs=[-1.0], text=text, answer="5", version=version))
                self.made[p.prompt_id] += 1
        return out


@functools.cache
def long_task_run():
    """The run the door builds on the long task (tests/tiny.py): its grader verify.grade_integer,
    its form verify.integer_form."""
    return run_of(flags.Args(train_data="builtin_steps", prompt_template="builtin"))


def grade_integer(rollouts):
    """train.grade on the long task, as the spine hands it to VIGOR (methods.Steps)."""
    run = long_task_run()
    assert run.grader is verify.grade_integer
    train.grade(run, rollouts)


PARTIAL = functools.partial(train.credit, f=flags.RewardFlags(reward="partial"))


def test_partial_credit_variance_by_hand():
    """After 2 each, the credits (ChainEngine) and their variance (smoothed_variance), prior 0:

        prompt 0: 1/8, 3/8:  m = 1/4, m2 = (1/64 + 9/64) / 2 = 5/64,
                  sigma^2 = 1/4 x 3/4 - (1/4 - 5/64) = 12/64 - 11/64 = 1/64 (= 5/64 - 1/16)
        prompt 1: 0, 0:      m = m2 = 0, sigma^2 = 0
        prompt 2: 1, 1:      m = m2 = 1, sigma^2 = 0

    every one 0 on the verdicts (0, 0; 0, 0; 1, 1). With a prior the pseudo-credits at 0 and 1
    weigh more than prompt 0's spread: at a = 0.25 (--preset vigor's) prompt 0 has m = 0.75 / 2.5
    = 0.3, m2 = (10/64 + 0.25) / 2.5 = 0.1625, sigma^2 = 0.1625 - 0.09 = 0.0725, and prompt 1
    m = 0.1, sigma^2 = 0.1 x 0.9 = 0.09: a hopeless prompt still outranks one all wrong with
    spread; at a = 1, 19/128 against 3/16."""
    rs = ChainEngine().generate([Prompt(q, [1]) for q in range(3)], 2, Sampling())
    grade_integer(rs)
    credits = PARTIAL(rs).tolist()
    assert [r.correct for r in rs] == [0, 0, 0, 0, 1, 1]
    assert credits == [1 / 8, 3 / 8, 0, 0, 1, 1]
    assert vigor.smoothed_variance(rs, credits, 0.0)[1] == {0: 1 / 64, 1: 0.0, 2: 0.0}
    assert vigor.smoothed_variance(rs, VERDICTS(rs).tolist(), 0.0)[1] == {0: 0, 1: 0, 2: 0}
    _, var = vigor.smoothed_variance(rs, credits, 0.25)
    assert var == pytest.approx({0: 0.0725, 1: 0.09, 2: 0.09}, abs=1e-15)
    _, var = vigor.smoothed_variance(rs, credits, 1.0)
    assert var == pytest.approx({0: 19 / 128, 1: 3 / 16, 2: 3 / 16}, abs=1e-15)


@pytest.mark.parametrize("rank", ["variance", "marginal"])
def test_partial_credit_gives_the_budget_to_the_all_wrong_prompt_with_spread(rank):
    """n_init 2, prior 0, a budget of 8 (2 left after 3 x 2): under --reward partial only prompt
    0 has sigma^2 > 0 (1/64, test_partial_credit_variance_by_hand), so both extra completions go to
    it, prompt 1 (all wrong, share 0) gets none; vigor/zero_std_frac_before 2/3. On the verdicts
    (--reward correct) no prompt has variance: no round, 6 completions, zero_std_frac_before 1."""
    prompts = [Prompt(q, [1]) for q in range(3)]

    def sizes(credit):
        out, stats = vigor_generate(ChainEngine(), prompts, lambda k: Sampling(seed=k), 0,
                                    grade_integer, credit=credit, n_init=2, n_step=2, top=2,
                                    budget=8, rank=rank, prior=0.0)
        return [sum(r.prompt_id == q for r in out) for q in range(3)], stats

    got, stats = sizes(PARTIAL)
    assert got == [4, 2, 2] and stats["vigor/rounds"] == 1
    assert stats["vigor/zero_std_frac_before"] == pytest.approx(2 / 3)
    got, stats = sizes(VERDICTS)
    assert got == [2, 2, 2] and stats["vigor/rounds"] == 0
    assert stats["vigor/zero_std_frac_before"] == 1.0


@pytest.mark.parametrize("reward", ["correct", "partial", "partial+format"])
def test_the_allocation_hands_vigor_the_credit_it_trains_on(reward):
    """Through train.generate_and_score (the run the door builds, tests/tiny.py): VIGOR
    ranks by train.credit of the run's --reward, the reward's own term (with --reward-right
    1, --reward-wrong 0, r.reward is c, plus the form's term under +format): under partial prompt
    0 gets the 2 extra completions, under correct there is no round."""
    a = flags.Args(train_data="builtin_steps", reward=reward, allocation="vigor",
                   vigor_rank="variance", vigor_prior=0.0, vigor_n_init=2, vigor_n_step=2,
                   vigor_top=2, vigor_budget=8, prompts_per_step=3, group_size=2)
    run = run_of(a, engine=ChainEngine())
    run.prompts, run.mine = [Prompt(q, [1]) for q in range(3)], [0, 1, 2]
    _, generated, _, _ = train.generate_and_score(run, 0, 0)
    sizes = [sum(r.prompt_id == q for r in generated) for q in range(3)]
    assert sizes == ([2, 2, 2] if reward == "correct" else [4, 2, 2])
    form = [1.25 if verify.integer_form(r.text) else -1.0 for r in generated]
    expected = [c + (f if reward.endswith("+format") else 0.0)
                for c, f in zip(train.credit(generated, run.settings.reward).tolist(), form)]
    assert [r.reward for r in generated] == pytest.approx(expected)
