"""bench/stats.py and the verdicts of bench/experiments.py on hand-computed numbers: the Student-t
quantile, the paired and Welch comparisons, final accuracy, censored time to target, accuracy at
a budget, the pairing read from the runs' flags, the mechanism diagnostic, the verdict rule, the
results table and summary.json, and the README's headline table from hand-made summary.json
files. No runs: everything here is hand-made curves."""
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import curves  # noqa: E402
import headline  # noqa: E402
import report  # noqa: E402  (where plots is called: patched there)
import stats  # noqa: E402
import verdicts  # noqa: E402
from curves import (ToTarget, final_accuracy, ratio_bound, run_final,  # noqa: E402
                    time_to_target, value_at)
from design import Arm, Claim, Experiment, Setting  # noqa: E402


# ---- the Student-t quantile -------------------------------------------------------------------

@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262),
                                   (10, 2.228), (30, 2.042), (120, 1.980), (math.inf, 1.960)])
def test_t_quantile_matches_the_table(df, t):
    assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
from verdicts import DEGRADATION, NO_ARM_LEARNS, analyse  # noqa: E402


def test_t_quantile_at_fractional_df_and_other_levels():
    # Welch's df is fractional: the quantile lies between its integer neighbours'
    assert stats.t_quantile(0.975, 4) < stats.t_quantile(0.975, 3.5) < stats.t_quantile(0.975, 3)
    assert stats.t_quantile(0.975, 3.234718826405868) == pytest.approx(3.0557127, abs=1e-6)
    assert stats.t_quantile(0.95, 5) == pytest.approx(2.015, abs=1e-3)        # table, one-sided
    assert stats.t_quantile(0.025, 4) == pytest.approx(-2.776, abs=1e-3)      # symmetry
    assert stats.t_cdf(stats.t_quantile(0.9, 7.5), 7.5) == pytest.approx(0.9, abs=1e-12)
    assert stats.t_cdf(0.0, 3) == pytest.approx(0.5)
    assert stats.betainc(1, 1, 0.3) == pytest.approx(0.3)                     # I_x(1, 1) = x
    assert stats.betainc(2, 1, 0.5) == pytest.approx(0.25)                    # I_x(2, 1) = x^2
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


# ---- paired and Welch -------------------------------------------------------------------------

def test_paired_is_the_mean_difference_with_sd_over_root_n():
    # d = 0.01, 0.02, 0.03: Δ = 0.02, sd = 0.01, SE = 0.01 / sqrt(3), df = 2, t = 4.303
    c = stats.paired([0.41, 0.52, 0.63], [0.40, 0.50, 0.60])
    assert c.paired and c.n == 3 and c.df == 2
    assert c.delta == pytest.approx(0.02) and c.se == pytest.approx(0.01 / math.sqrt(3))
    half = 4.302653 * 0.01 / math.sqrt(3)                                     # 0.024841
    assert (c.lo, c.hi) == (pytest.approx(0.02 - half, abs=1e-6),
                            pytest.approx(0.02 + half, abs=1e-6))


def test_welch_is_the_unpooled_se_with_satterthwaite_df():
    # va/na = (5/3)/4 = 5/12, vb/nb = 4/3: SE = sqrt(7/4);
    # df = (7/4)^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 21168/6544 = 3.2347; t(0.975, 3.2347) = 3.0557
    c = stats.welch([1, 2, 3, 4], [2, 4, 6])
    assert not c.paired and c.n == 7
    assert c.delta == pytest.approx(-1.5) and c.se == pytest.approx(math.sqrt(7 / 4))
    assert c.df == pytest.approx(21168 / 6544)
    assert (c.lo, c.hi) == (pytest.approx(-5.542328, abs=1e-5), pytest.approx(2.542328, abs=1e-5))


def test_degenerate_comparisons():
    one = stats.paired([0.5], [0.4])                       # one pair: no variance, no CI
    assert one.delta == pytest.approx(0.1) and one.se is one.lo is one.hi is None
    same = stats.paired([0.5, 0.6], [0.4, 0.5])            # equal differences: SE 0, CI a point
    assert same.se == 0 and same.lo == same.hi == pytest.approx(0.1)
    flat = stats.welch([0.5, 0.5], [0.4, 0.4, 0.4])        # both variances 0: df na + nb - 2
    assert flat.df == 3 and flat.lo == flat.hi == pytest.approx(0.1)
    assert stats.welch([0.5], [0.4, 0.5]).se is None
    with pytest.raises(ValueError):
        stats.paired([0.5, 0.6], [0.4])


# ---- curves: final accuracy, time to target, accuracy at a budget -----------------------------

def curve(accs, dx=100):
    """Evaluations at steps 0, 1, ...: (step, fresh = step x dx, updates = step, wall, acc)."""
    return [(i, i * dx, i, float(i), a) for i, a in enumerate(accs)]


def test_final_accuracy_is_the_mean_of_the_last_two_evaluations():
    assert final_accuracy(curve([0.2, 0.4, 0.5, 0.7])) == pytest.approx(0.6)
    assert final_accuracy(curve([0.2, 0.4])) == pytest.approx(0.4)   # not step 0
    assert final_accuracy(curve([0.2])) == pytest.approx(0.2)


def test_final_at_fractions_of_the_x_range_interpolates_between_evaluations():
    """mu-GRPO's stage arms evaluate at 25/50/75/100% of the updates, GRPO mu = 4 every 5 of 64
    steps: final_at (0.75, 1.0) takes both at the same points. Evaluations at 0, 1, 2, 3, 4 of x
    0..400: at 75% (x 300) the evaluation there, 0.5; with evaluations at 0, 100, 250, 400 the 75%
    point lies 50/150 of the way from 0.4 (at 250) to 0.7 (at 400): 0.5."""
    assert run_final(curve([0.2, 0.3, 0.4, 0.5, 0.7]), (0.75, 1.0)) == \
        pytest.approx(0.6)
    sparse = [(0, 0, 0, 0.0, 0.2), (1, 100, 1, 1.0, 0.3), (2, 250, 2, 2.0, 0.4),
              (3, 400, 3, 3.0, 0.7)]
    assert run_final(sparse, (0.75, 1.0)) == pytest.approx((0.5 + 0.7) / 2)
    assert run_final(sparse) == final_accuracy(sparse) == \
        pytest.approx(0.55)
    assert run_final(sparse, (0.75,), "updates") == pytest.approx(0.4 + 0.25 * 0.3)


def test_budget_cells_say_how_many_seeds_they_hold():
    """A run that ends before a budget has no value there: the cell says [k/n seeds]."""
    summary = verdict_summary()
    summary["runs"]["noisy"][0] = run([0.2, 0.3], seed=100, stream=["4", "100"])   # ends at 100
    text = report.table(summary)
    row = next(line for line in text.splitlines() if line.startswith("| noisy |"))
    assert "[4/5 seeds]" in row


def test_aes_of_an_arm_against_the_baseline_by_hand():
    """eval.aes of the mean final accuracies and mean last-step lengths: the arm 0.55 at length
    20 against the baseline 0.5 at 25: 1 x (25 - 20) / 25 + 3 x (0.55 - 0.5) / 0.5 = 0.2 + 0.3;
    a less accurate arm pays 5 x the relative drop."""
    def run(acc, length):
        return {"curve": curve([0.2, acc, acc]), "len_end": length}
    base = [run(0.4, 20.0), run(0.6, 30.0)]
    assert verdicts.arm_aes([run(0.5, 18.0), run(0.6, 22.0)], base) == pytest.approx(0.5)
    assert verdicts.arm_aes(base, base) == pytest.approx(0.0)
    # 0.45 at 25: -5 x 0.1 = -0.5
    assert verdicts.arm_aes([run(0.45, 25.0)], base) == pytest.approx(-0.5)
    assert verdicts.arm_aes([{"curve": curve([0.2, 0.5]), "len_end": None}], base) is None


def test_time_to_target_interpolates_and_censors():
    c = curve([0.2, 0.3, 0.5, 0.6])
    # crossing 0.4 between (100, 0.3) and (200, 0.5): 100 + 0.1 / 0.2 x 100 = 150
    assert time_to_target(c, 1, 0.4) == (pytest.approx(150), True)
    assert time_to_target(c, 1, 0.5) == (pytest.approx(200), True)   # on an eval
    assert time_to_target(c, 2, 0.4) == (pytest.approx(1.5), True)   # in updates
    assert time_to_target(c, 1, 0.9) == (300, False)       # censored at the budget
    # a dip after the crossing does not matter: the first crossing counts
    assert time_to_target(curve([0.2, 0.6, 0.1]), 1, 0.4) == (pytest.approx(50), True)


def test_spend_to_the_baseline_reads_each_seeds_own_target_in_wall_and_tokens():
    def run(seed, accs, wall_per_step, tokens_per_step):
        return {"seed": seed, "curve": [(i, 64 * i, i, wall_per_step * i, a, tokens_per_step * i)
                                        for i, a in enumerate(accs)]}
    # seed 1: the baseline's final is (0.4 + 0.6) / 2 = 0.5, reached at its step 2.5 (0.4 -> 0.6
    # between steps 2 and 3); seed 2: (0.3 + 0.3) / 2 = 0.3, reached at step 2 exactly
    runs = {"base": [run(1, [0.1, 0.2, 0.4, 0.6], 10.0, 100.0),
                     run(2, [0.1, 0.2, 0.3, 0.3], 10.0, 100.0)],
            # seed 1: 0.5 at step 1.5 (0.3 -> 0.7); seed 2: target 0.3 never reached (censored at
            # step 3)
            "arm": [run(1, [0.1, 0.3, 0.7, 0.7], 20.0, 150.0),
                    run(2, [0.1, 0.2, 0.2, 0.25], 20.0, 150.0)]}
    spend = curves.spend_to_baseline(runs, "base")
    assert spend["base"]["wall"] == (pytest.approx((25 + 20) / 2), 2, 2)
    assert spend["base"]["tokens"] == (pytest.approx((250 + 200) / 2), 2, 2)
    assert spend["arm"]["wall"] == (pytest.approx((30 + 60) / 2), 1, 2)     # ≥: one censored
    assert spend["arm"]["tokens"] == (pytest.approx((225 + 450) / 2), 1, 2)
    assert ratio_bound(spend["arm"]["tokens"], spend["base"]["tokens"]) == (
        pytest.approx(337.5 / 225), ">=")
    table = report.spend_table({"spend": {"baseline": "base", "arms": {
        arm: {x: verdicts.target_json(t, spend["base"][x]) for x, t in by_x.items()}
        for arm, by_x in spend.items()}}})
    assert "| arm | 1/2 | ≥ 0.8 | ≥ 2.00 | ≥ 338 | ≥ 1.50 |" in table
    assert "| base | 2/2 | 0.4 | 1.00 | 225 | 1.00 |" in table
    assert report.spend_table({}) == ""


def test_value_at_interpolates_and_stops_at_the_run_end():
    c = curve([0.2, 0.3, 0.5, 0.6])
    assert value_at(c, 1, 0) == pytest.approx(0.2)
    assert value_at(c, 1, 75) == pytest.approx(0.275)       # 0.2 + 0.75 x 0.1
    assert value_at(c, 1, 250) == pytest.approx(0.55)
    assert value_at(c, 1, 300) == pytest.approx(0.6)
    assert value_at(c, 1, 301) is None


def test_ratio_to_the_baseline_is_a_bound_where_seeds_are_censored():
    T = ToTarget
    assert ratio_bound(T(50, 3, 3), T(100, 3, 3)) == (0.5, "=")
    assert ratio_bound(T(150, 2, 3), T(100, 3, 3)) == (1.5, ">=")   # arm censored
    assert ratio_bound(T(50, 3, 3), T(100, 2, 3)) == (0.5, "<=")    # base censored
    assert ratio_bound(T(50, 2, 3), T(100, 2, 3)) == (None, "?")    # both


# ---- pairing, diagnostics, verdicts -----------------------------------------------------------

def test_stream_is_the_last_prompts_per_step_and_seed():
    argv = ["--prompts-per-step", "4", "--steps", "2", "--prompts-per-step", "8", "--seed", "3"]
    assert verdicts.stream(argv) == ["8", "3"]
    assert verdicts.stream(["--steps", "2"]) == [None, None]


def run(accs, seed=None, dx=100, **extra):
    """A hand-made reported run: its curve and the aggregates table() reads."""
    r = {"curve": curve(accs, dx), "len_start": 3.0, "len_end": 3.0, "refreshes": 2,
         "updates": 2, "gen": 1.0, "upd": 1.0, "means": {}, "maxima": {}, "minima": {},
         "last": {}, **extra}
    if seed is not None:
        r["seed"] = seed
    return r


def test_compare_runs_pairs_arms_that_share_the_prompt_stream():
    s = Setting("t", ("--prompts-per-step", "4"),
                (Arm("base", ()), Arm("same", ()), Arm("wide", ("--prompts-per-step", "8"))),
                "base")
    runs = {"base": [run([0.2, 0.4, 0.4]), run([0.2, 0.5, 0.5])],
            "same": [run([0.2, 0.5, 0.5]), run([0.2, 0.6, 0.6])],
            "wide": [run([0.2, 0.5, 0.5]), run([0.2, 0.6, 0.6])]}
    same = verdicts.compare_runs(s, runs, "same", "base")        # from the flags: paired
    assert same.paired and same.delta == pytest.approx(0.1) and same.se == 0
    wide = verdicts.compare_runs(s, runs, "wide", "base")        # 4 vs 8 prompts: Welch
    assert not wide.paired and wide.delta == pytest.approx(0.1)
    # the streams run_setting records (argv.json) win over the flags; seeds matched by seed
    runs["wide"] = [run([0.2, 0.6, 0.6], seed=1, stream=["4", "1"]),
                    run([0.2, 0.5, 0.5], seed=0, stream=["4", "0"])]
    runs["base"] = [run([0.2, 0.4, 0.4], seed=0, stream=["4", "0"]),
                    run([0.2, 0.5, 0.5], seed=1, stream=["4", "1"])]
    c = verdicts.compare_runs(s, runs, "wide", "base")
    assert c.paired and c.n == 2 and c.se == 0 and c.delta == pytest.approx(0.1)


def test_mechanism_acted_reads_a_predicate_over_the_arm_runs():
    rs = [run([0.2], maxima={"loss/veto_frac": 0.0}, means={"h": 0.3, "h_stored": 0.3}),
          run([0.2], maxima={"loss/veto_frac": 0.0}, means={"h": 0.5, "h_stored": 0.3})]
    assert not verdicts.mechanism_acted(rs, "loss/veto_frac", "max > 0")
    assert verdicts.mechanism_acted(rs, "loss/veto_frac", "max >= 0")
    assert verdicts.mechanism_acted(rs, "h", "mean != h_stored")          # 0.4 vs 0.3
    assert not verdicts.mechanism_acted(rs, "h", "min != h_stored")       # 0.3 vs 0.3
    assert not verdicts.mechanism_acted(rs, "never/logged", "max > 0")
    assert verdicts.predicate_keys("h", "mean != h_stored") == ("h", "h_stored")
    assert verdicts.predicate_keys("loss/veto_frac", "max > 0") == ("loss/veto_frac",)


def C(lo, hi):
    return stats.Comparison((lo + hi) / 2, 0.01, 4, lo, hi, 5, True)


def test_the_verdict_rule_gives_each_word():
    v = verdicts.verdict
    assert v(1, C(0.01, 0.05)) == "reproduced"
    assert v(1, C(-0.05, -0.01)) == "contradicted"
    assert v(1, C(-0.01, 0.05)) == "inconclusive (95% CI [-1.0, +5.0])"
    assert v(1, C(0.0, 0.05)).startswith("inconclusive")               # touching 0: not excluded
    assert v(-1, C(-0.05, -0.01)) == "reproduced"
    assert v(-1, C(0.01, 0.05)) == "contradicted"
    m = verdicts.PAR_MARGIN          # on par: matches or exceeds, one-sided at -margin
    assert v(0, C(-m / 2, m)) == "reproduced"
    assert v(0, C(m + 0.001, m + 0.03)) == "reproduced"               # much better: not against
    assert v(0, C(-m, 0.01)) == "reproduced"                           # an end on the margin
    assert v(0, C(-m - 0.03, -m - 0.001)) == "contradicted"            # worse by more than m
    assert v(0, C(-1.5 * m, 2 * m)) == "inconclusive (95% CI [-3.0, +4.0])"
    not_acted = "not testable here: the mechanism did not act"
    assert v(1, C(0.01, 0.05), acted=False) == not_acted == verdicts.NOT_ACTED
    # runs made before their diagnostic's key was logged: not "did not act", not judged either
    assert v(1, C(0.01, 0.05), acted=None) == verdicts.NOT_LOGGED
    assert v(0, C(0.01, 0.05), acted=None) == "reproduced"            # on par: not a gate
    assert v(-1, C(-0.05, -0.01), acted=False) == not_acted
    assert v(0, C(-m / 2, m), acted=False) == "reproduced"             # on par: not a gate
    assert v(0, C(-m - 0.03, -m - 0.001), acted=False) == "contradicted"   # a loss is a loss
    no_gain = "not testable here: the baseline does not learn"
    for d, c in ((1, C(0.01, 0.05)), (0, C(-m / 2, m)), (-1, C(-0.05, -0.01))):
        assert v(d, c, learns=False) == no_gain == verdicts.NOT_LEARNING   # checked first
    assert v(1, C(0.01, 0.05), acted=False, learns=False) == no_gain
    assert v(1, stats.paired([0.5], [0.4])).startswith("inconclusive (95% CI undefined")
    assert v(None, C(0.01, 0.05)) == "—"
    assert v(None, C(0.01, 0.05), learns=False) == "—"


def test_the_learning_gate_reads_the_baselines_gain_ci():
    """learned: the baseline's gain (final - step-0 accuracy, paired over seeds) has a 95% CI above
    0. Gains +1, +2, +3 points: mean 2, sd 1, SE 1/sqrt 3, CI 2 +- 4.303 x 0.577 = [-0.48, +4.48]
    points: includes 0, does not learn; +2, +3, +4: [0.52, 5.48]: learns; a collapse (all -5): its
    CI below 0: does not learn either."""
    s = verdict_setting()

    def gain(points):
        runs = [run([0.2, 0.2 + p / 100, 0.2 + p / 100], seed=i) for i, p in enumerate(points)]
        return verdicts.comparison_json(verdicts.baseline_gain(s, runs))
    g = gain([1, 2, 3])
    assert g["ci"] == [pytest.approx(0.02 - 0.04303 / 3 ** 0.5, abs=1e-5),
                       pytest.approx(0.02 + 0.04303 / 3 ** 0.5, abs=1e-5)]
    assert not verdicts.learned(g)
    assert verdicts.learned(gain([2, 3, 4]))
    assert not verdicts.learned(gain([-5, -5.1, -4.9]))
    assert not verdicts.learned(None)


def test_holm_adjusts_over_the_settings_testable_claims():
    """Three testable claims with p = 0.01, 0.04, 0.03 (two-sided, from Δ / SE at df 4): Holm's
    adjusted p 0.03, 0.06, 0.06: the first stays reproduced, the other two become inconclusive;
    a "not testable" claim and a claim with no direction are outside the family and keep their
    word. On par: the null is Δ = -margin."""
    t = stats.t_quantile

    def claim(p, direction=1, verdict="reproduced", null=0.0):
        se = 0.01
        delta = null + t(1 - p / 2, 4) * se               # two-sided p of Δ = null is exactly p
        return {"direction": direction, "verdict": verdict, "delta": delta, "se": se, "df": 4,
                "ci": [delta - t(0.975, 4) * se, delta + t(0.975, 4) * se], "n": 5,
                "paired": True}
    m = verdicts.PAR_MARGIN
    claims = [claim(0.01), claim(0.04), claim(0.03, direction=0, null=-m),
              claim(0.001, verdict=verdicts.NOT_ACTED), claim(0.001, direction=None,
                                                                 verdict="—")]
    words = verdicts.holm_verdicts(claims)
    assert words[0] == "reproduced"
    assert words[1] == "inconclusive (Holm p = 0.06)"
    assert words[2] == "inconclusive (Holm p = 0.06)"
    assert words[3:] == [verdicts.NOT_ACTED, "—"]
    assert stats.holm([0.01, 0.04, None, 0.03]) == [pytest.approx(0.03), pytest.approx(0.06),
                                                    None, pytest.approx(0.06)]
    worse = claim(0.001, direction=1)
    worse["delta"] = -worse["delta"]                        # significant, on the other side
    assert verdicts.holm_verdicts([worse]) == ["contradicted"]


def verdict_setting():
    arms = (Arm("base", ()), Arm("better", ()), Arm("worse", ()), Arm("noisy", ()),
            Arm("par", ()), Arm("veto", ()))
    claims = (Claim("worse", 1), Claim("par", 0),
              Claim("veto", 1, acted=("loss/veto_frac", "max > 0")),
              Claim("better", 1, against="worse", metric="at 50%"))
    return Setting("arith", ("--prompts-per-step", "4"), arms, "base", claims=claims)


def verdict_summary():
    """Five seeds; base ends at 0.40 + 0.01 i. better: +5 points every seed (reproduced); worse:
    -3 (contradicted); noisy: +5, -5, ... (inconclusive); par: +0.5 (on par: reproduced); veto:
    +5 but its veto never fired (not testable here)."""
    def arm(shift, veto=0.0, wobble=0.0):
        return [run([0.2, 0.3, 0.4 + 0.01 * i + shift + wobble * (-1) ** i,
                     0.4 + 0.01 * i + shift + wobble * (-1) ** i], seed=100 + i,
                    stream=["4", str(100 + i)], maxima={"loss/veto_frac": veto})
                for i in range(5)]
    runs = {"base": arm(0), "better": arm(0.05), "worse": arm(-0.03), "noisy": arm(0, wobble=0.05),
            "par": arm(0.005), "veto": arm(0.05)}
    s = verdict_setting()
    return {"setting": s, "runs": runs, "chosen": {a.name: 1e-4 for a in s.arms},
            "sweep": {a.name: {1e-4: [0.4], 3e-5: [0.3]} for a in s.arms},
            "grid": (1e-4, 3e-5), "sweep_seeds": (0,), "picked": {}, "band": {}}


def test_an_arm_without_a_claim_against_the_baseline_keeps_its_mechanism_diagnostic():
    """Claim(arm) against the baseline, added for a reported arm whose claims are against other
    arms, carries that arm's diagnostic: a mechanism that never acted is not testable against
    any reference. An arm with a no-claim entry against the baseline gets no verdict there."""
    moved = ("head/kl", "max > 0.01")
    s = Setting("x", (), (Arm("base", ()), Arm("ref", ()), Arm("m", ()), Arm("n", ())), "base",
                claims=(Claim("m", 1, against="ref", acted=moved), Claim("n", None),
                        Claim("n", 1, against="ref")))
    claims = verdicts.claims_of(s, {"base": [], "ref": [], "m": [], "n": []})
    assert Claim("m", 1, acted=moved) in claims
    assert Claim("m", 1, against="ref", acted=moved) in claims
    assert [c for c in claims if c.arm == "n" and not c.against] == [Claim("n", None)]
    # an arm never judged against itself (a stress setting whose baseline is another's arm)
    s = Setting("x", (), (Arm("base", ()), Arm("m", ())), "base",
                claims=(Claim("base", None, against="base"), Claim("m", 1)))
    assert verdicts.claims_of(s, {"base": [], "m": []}) == [Claim("m", 1)]


def test_analyse_gives_each_verdict_on_hand_made_runs():
    a = verdicts.analyse(verdict_summary())
    words = {(c["arm"], c["against"]): c["verdict"] for c in a["comparisons"]}
    assert words == {("better", "base"): "reproduced",       # the default claim: +1, final
                     ("better", "worse"): "reproduced",      # at 50% of the x-range: +0.05
                     ("worse", "base"): "contradicted",
                     ("noisy", "base"): words[("noisy", "base")],
                     ("par", "base"): "reproduced",
                     ("veto", "base"): verdicts.NOT_ACTED}
    assert words[("noisy", "base")].startswith("inconclusive (95% CI [")
    par = next(c for c in a["comparisons"] if c["arm"] == "par")
    assert par["paired"] and par["n"] == 5 and par["df"] == 4
    assert par["delta"] == pytest.approx(0.005) and par["ci"] == [pytest.approx(0.005)] * 2
    assert a["target"] == pytest.approx(0.2 + 0.9 * 0.22)     # start 0.2, baseline final 0.42
    assert a["arms"]["worse"]["to_target"]["reached"] == 2    # 0.37 + 0.01 i >= 0.398: i >= 3
    assert a["arms"]["worse"]["to_target"]["ratio"] and \
        a["arms"]["worse"]["to_target"]["bound"] == ">="
    assert [b["x"] for b in a["budgets"]] == [75, 150, 225, 300]
    at = a["arms"]["better"]["at"]["at 50%"]      # halfway from step 1 to 2: half of +5
    assert at["delta"]["delta"] == pytest.approx(0.025) and at["delta"]["paired"]
    assert a["gate"]["learned"] and a["baseline_gain"]["delta"] == pytest.approx(0.22)
    holm = {(c["arm"], c["against"]): c["holm"] for c in a["comparisons"]}
    assert holm[("veto", "base")] == verdicts.NOT_ACTED          # outside the family
    veto = next(c for c in a["comparisons"] if c["arm"] == "veto")
    assert veto["diagnostic"]["value"] == 0.0 and veto["diagnostic"]["gates"]


def test_runs_without_the_diagnostics_key_are_not_logged_not_did_not_act():
    """Runs a code made before it logged a claim's key (the archive's older runs): the claim says
    its diagnostic was not logged, not that the mechanism did not act."""
    summary = verdict_summary()
    for r in summary["runs"]["veto"]:
        r["maxima"] = {}
        r["means"] = {}
    a = verdicts.analyse(summary)
    veto = next(c for c in a["comparisons"] if c["arm"] == "veto")
    assert veto["diagnostic"]["value"] is None and veto["verdict"] == verdicts.NOT_LOGGED
    assert veto["holm"] == verdicts.NOT_LOGGED


def course_runs(start, end, wobble=0.0):
    """Five paired seeds going from `start` to `end` (+- wobble by seed)."""
    return [run([start, (start + end) / 2, end + wobble * (-1) ** i, end + wobble * (-1) ** i],
                seed=100 + i, stream=["4", str(100 + i)]) for i in range(5)]


def courses_summary(base, **arms):
    """verdict_setting's claims on hand-made courses: base and each named arm (start, end)."""
    summary = verdict_summary()
    summary["runs"] = {"base": course_runs(*base)}
    for name in ("better", "worse", "noisy", "par", "veto"):
        summary["runs"][name] = course_runs(*arms.get(name, base))
    return summary


def test_each_arm_has_a_course_and_the_gate_reads_the_settings_own_baseline():
    """An arm learns where its gain over step 0 (paired) has a CI above 0, degrades where below,
    else is flat; the learning gate is this setting's baseline's gain, whatever its lr."""
    a = verdicts.analyse(courses_summary((0.3, 0.2), better=(0.3, 0.4)))
    assert a["arms"]["base"]["course"] == verdicts.DEGRADES
    assert a["arms"]["better"]["course"] == verdicts.LEARNS
    assert a["gate"] == {"setting": "arith", "gain": a["baseline_gain"], "learned": False}
    flat = verdicts.analyse(courses_summary((0.3, 0.3, 0.01)))
    assert flat["arms"]["base"]["course"] == verdicts.FLAT
    r = verdicts.reading
    L, F, D = verdicts.LEARNS, verdicts.FLAT, verdicts.DEGRADES
    assert [r(L, L), r(D, L), r(L, D), r(L, F)] == [verdicts.ACCURACY, verdicts.ACCURACY,
                                                    verdicts.ONLY_ARM, verdicts.ONLY_ARM]
    assert r(F, D) == r(D, D) == r(D, F) == verdicts.DEGRADATION
    assert r(F, F) == verdicts.NOTHING


def test_where_nothing_moves_every_claim_is_not_testable():
    """Every arm flat (its final equal to its start up to noise): nothing to compare."""
    a = verdicts.analyse(courses_summary((0.3, 0.3, 0.001)))
    assert not a["gate"]["learned"]
    assert {c["verdict"] for c in a["comparisons"]} == {verdicts.NOT_LEARNING}


def test_where_the_baseline_collapses_but_the_arm_learns_the_word_says_so():
    """The baseline falls 30% → 20% on every seed, `better` climbs to 40%: reproduced, and the
    word says only the arm learns (not the paper's accuracy claim against a learning GRPO)."""
    a = verdicts.analyse(courses_summary((0.3, 0.2), better=(0.3, 0.4)))
    better = next(c for c in a["comparisons"] if (c["arm"], c["against"]) == ("better", "base"))
    assert better["shows"] == verdicts.ONLY_ARM
    assert better["verdict"] == "reproduced (only the arm learns)"
    assert better["holm"] == "reproduced (only the arm learns)"


def test_where_no_arm_learns_the_claim_is_not_testable_and_the_finding_is_said():
    """Every arm ends below its start: the baseline by 10 points, `better` by 5 (degrades less),
    `worse` by 15 (degrades more), `noisy` by 10 +- 5 (as much), `par` by 9.5 (on par): each
    accuracy claim is not testable here (its own word, counted neither as a reproduction nor as
    a contradiction), the finding beside it; the Holm word the same (out of the family)."""
    a = analyse(courses_summary((0.3, 0.2), better=(0.3, 0.25), worse=(0.3, 0.15),
                                            noisy=(0.3, 0.2, 0.05), par=(0.3, 0.205)))
    words = {c["arm"]: c["verdict"] for c in a["comparisons"] if c["against"] == "base"}
    no = NO_ARM_LEARNS
    assert words["better"] == f"{no} (finding: the arm degrades less)"
    assert words["worse"] == f"{no} (finding: the arm degrades more)"
    assert words["noisy"].startswith(f"{no} (finding: the arm degrades as much, 95% CI [")
    assert words["par"] == f"{no} (finding: the arm degrades less)"
    holm = {c["arm"]: c["holm"] for c in a["comparisons"] if c["against"] == "base"}
    assert holm == words
    assert not any(w.startswith(("reproduced", "contradicted")) for w in words.values())
    assert all(c["shows"] == DEGRADATION for c in a["comparisons"])


def test_a_stress_setting_reads_its_own_gate_and_shows_every_arm_at_every_dev_lr(
        tmp_path, monkeypatch):
    """A stress setting (shared_lr) judges on its own arms: its collapsing baseline does not
    learn (the gate can fail), and beside its rows each arm's mean final dev accuracy at every
    lr of its sweep_of setting's dev sweep, the shared lr marked."""
    monkeypatch.setattr(report, "plots", lambda summary, out: False)
    summary = courses_summary((0.3, 0.2), better=(0.3, 0.25))
    stress = dataclasses.replace(summary["setting"], label="stress", shared_lr=1e-4,
                                 sweep_of="arith")
    dev = {"base": {3e-5: [0.4, 0.42], 1e-4: [0.2, 0.22]}, "better": {3e-5: [0.3], 1e-4: [0.35]}}
    report.write_setting({**summary, "setting": stress, "dev_lrs": dev}, tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["gate"]["setting"] == "stress" and not data["gate"]["learned"]
    assert data["dev_lrs"]["base"] == {"3e-05": pytest.approx(0.41), "0.0001": pytest.approx(0.21)}
    results = (tmp_path / "results.md").read_text()
    assert "| base | **21.0** | 41.0 | 41.0 at 3e-05 |" in results
    assert "| better | **35.0** | 30.0 | 35.0 at 0.0001 |" in results
    assert "not testable here: no arm learns (finding: the arm degrades less)" in results


def test_table_and_summary_json_carry_the_statistics(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report, "plots", lambda summary, out: False)   # no matplotlib
    summary = verdict_summary()
    exp = Experiment("toy", "a toy paper", "it works", "everything",
                                 (summary["setting"],))
    text = report.write_setting(summary, tmp_path / "arith", exp)
    assert "no accuracy.png or sweep.png" in capsys.readouterr().err   # said, not silently lost
    results = (tmp_path / "arith" / "results.md").read_text()
    assert verdicts.VERDICT_RULE in results and verdicts.VERDICT_RULE not in text
    header = next(line for line in results.splitlines() if line.startswith("| arm |"))
    for col in ("Δ vs base [95% CI]", "SE", "df", "pairing", "fresh rollouts to target (reached)",
                "acc at 50% (150)", "verdict"):
        assert f"| {col} |" in header
    assert "| better | 0.0001 | 5 | 47.0 ± 1.6 | +5.0 [+5.0, +5.0] | 0.00 | 4 | paired |" \
        in results
    assert "| veto vs base | final | better |" in results and "not testable here" in results
    data = json.loads((tmp_path / "arith" / "summary.json").read_text())
    assert data["experiment"] == "toy" and data["paper"] == "a toy paper"
    assert data["verdict_rule"] == verdicts.VERDICT_RULE
    c = next(c for c in data["comparisons"] if c["arm"] == "worse")
    assert set(c) >= {"delta", "se", "df", "ci", "paired", "verdict", "n"}
    assert c["verdict"] == "contradicted" and c["paired"] is True
    t = data["arms"]["worse"]["to_target"]
    assert (t["reached"], t["n"], t["bound"]) == (2, 5, ">=")
    assert data["runs"]["base"][0]["seed"] == 100


# ---- the headline table -----------------------------------------------------------------------

def write_summary(path: Path, paper: str, setting: str, comparisons: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"paper": paper, "setting": setting, "comparisons": comparisons}))


def comparison(arm, against, verdict, delta, lo, hi, is_paired, direction=1, metric="final"):
    return {"arm": arm, "against": against, "metric": metric, "direction": direction,
            "delta": delta, "se": 0.01, "df": 4, "ci": [lo, hi], "n": 5, "paired": is_paired,
            "verdict": verdict, "diagnostic": None}


def test_headline_table_from_hand_made_summaries(tmp_path):
    write_summary(tmp_path / "replay" / "arith" / "summary.json", "replay paper", "arith",
                  [comparison("rollout-replay", "grpo", "reproduced", 0.012, 0.002, 0.022, True),
                   comparison("naive", "grpo", "—", 0.0, -0.01, 0.01, True, direction=None)])
    write_summary(tmp_path / "mu-grpo" / "steps" / "summary.json", "mu-GRPO", "steps",
                  [comparison("mu-grpo", "grpo mu=4", "inconclusive (95% CI [-2.6, +3.3])",
                              0.003, -0.026, 0.033, False, direction=0, metric="at 50%")])
    (tmp_path / "dapo" / "arith").mkdir(parents=True)
    (tmp_path / "dapo" / "arith" / "summary.json").write_text(json.dumps({"runs": {}}))  # old
    text = headline.headline_table(tmp_path)
    lines = text.splitlines()
    assert lines[0] == ("| paper | setting | arm vs baseline | the paper claims | Δ [95% CI] | "
                        "paired? | verdict | Holm (setting) |")
    assert lines[2:] == [       # EXPERIMENTS' order (replay before mu-grpo); no-claim rows left out
        "| replay paper | arith | rollout-replay vs grpo | better | +1.2 [+0.2, +2.2] | paired "
        "| reproduced | — |",
        "| mu-GRPO | steps | mu-grpo vs grpo mu=4 (at 50%) | on par (±2) | +0.3 [-2.6, +3.3] | "
        "unpaired (Welch) | inconclusive (95% CI [-2.6, +3.3]) | — |"]
    rows, skipped = headline.headline_rows(tmp_path)
    assert skipped == [tmp_path / "dapo" / "arith" / "summary.json"]
    proc = subprocess.run([sys.executable, "bench/experiments.py", "--headline", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text and "skipped" in proc.stderr


def test_headline_rows_are_the_headline_claims_and_every_claim_on_request(tmp_path):
    """README's table: the claims marked headline (a setting without one: its first claim with a
    direction); docs/results.md's (--every-claim): every claim with a direction."""
    head = {**comparison("rollout-replay", "grpo", "reproduced", 0.01, 0.0, 0.02, True),
            "headline": True}
    other = comparison("rollout-replay", "naive-replay", "inconclusive", 0.0, -0.01, 0.01, True)
    write_summary(tmp_path / "replay" / "arith" / "summary.json", "replay paper", "arith",
                  [other, head])
    write_summary(tmp_path / "dapo" / "arith" / "summary.json", "DAPO", "arith",
                  [comparison("dapo", "grpo", "reproduced", 0.04, 0.01, 0.07, True), other])
    rows, _ = headline.headline_rows(tmp_path)
    assert [r[2] for r in rows] == ["rollout-replay vs grpo", "dapo vs grpo"]
    rows, _ = headline.headline_rows(tmp_path, every=True)
    assert [r[2] for r in rows] == ["rollout-replay vs naive-replay", "rollout-replay vs grpo",
                                    "dapo vs grpo", "rollout-replay vs naive-replay"]
    proc = subprocess.run([sys.executable, "bench/experiments.py", "--headline", str(tmp_path),
                           "--every-claim"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == headline.headline_table(tmp_path, True)
