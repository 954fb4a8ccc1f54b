"""The verdict rule and the numbers it reads, from a setting's reported runs (the curves and
aggregates bench/protocol.py's load gives): a run's final accuracy, time to a target (censored),
accuracy at a budget, Δ paired or Welch (bench/stats.py), the mechanism diagnostics (predicates on
metrics keys), the learning gate, the verdict word and its Holm-adjusted form; analyse() gives
every number of a setting's tables, JSON-ready. No running, no writing: pure functions of runs.
"""
import operator
import statistics
from typing import NamedTuple

from design import ACTED, Arm, Claim, Setting
from stats import Comparison, holm, mean_std, p_value, paired, welch

# ---- the statistics, the verdicts and the tables ----------------------------------------------

TARGET_FRAC = 0.9
BUDGETS = (0.25, 0.5, 0.75, 1.0)   # accuracy at these fractions of the baseline's x-range
PAR_MARGIN = 0.02                  # "on par": not worse than the reference by more than this
X_COL = {"fresh": 1, "updates": 2, "wall": 3}   # a curve point's column of each x
VERDICT_RULE = (
    "**Verdict** (bench/experiments.py `verdict`, one rule for every claim, fixed before the "
    "runs, as the seeds are: every arm on all of its setting's seeds): Δ = the arm's metric minus"
    " its reference's, with its 95% CI (paired over the seeds both ran where the two share the "
    "prompt stream, equal --prompts-per-step and --seed; else Welch's). First, \"not testable "
    "here: the baseline does not learn\" for every claim of a setting whose baseline's gain "
    "(final minus step-0 accuracy, paired over its seeds; a stress setting: the baseline of its "
    "dev-lr setting, Setting.learns_in) has a 95% CI that does not lie above 0. Then, for a claim "
    "that the arm is better (worse) than its reference: \"not testable here: the mechanism did "
    "not act\" when its diagnostic (a metrics key's mean over every step of every reported seed "
    "of the arm above the bound stated with it; the stabilisers' shares of tokens or groups and "
    f"R²PO's head KL: ACTED = {ACTED:g}) says it "
    "did not, \"not testable here: its diagnostic was not logged\" when the code that made "
    "the runs did not log its key; else \"reproduced\" when the CI lies above (below) 0, "
    "\"contradicted\" when it lies below (above) 0. For a claim that the arm matches or "
    "exceeds its reference (on par, "
    f"one-sided: non-inferiority at the margin {100 * PAR_MARGIN:g} points, PAR_MARGIN): "
    f"\"reproduced\" when the CI's lower end is at or above -{100 * PAR_MARGIN:g} points, "
    f"\"contradicted\" when its upper end is below -{100 * PAR_MARGIN:g}; the mechanism's "
    "diagnostic is reported beside it, not a gate (the claim is the method's as a whole). "
    "Otherwise \"inconclusive (95% CI [lo, hi])\", in points. A CI with an end on 0 does not "
    "exclude 0. Beside each verdict, its Holm-adjusted form (holm_verdicts): the same words from "
    "the two-sided p-value of Δ = 0 (on par: Δ = -margin), Holm's step-down adjustment over the "
    "testable claims of the setting, reproduced/contradicted where the adjusted p < 0.05.")


def final_accuracy(curve: list) -> float:
    """A run's final accuracy: the mean of its last two evaluations after step 0 (the last one
    alone where there is one; the step-0 one where there is no other)."""
    after = [p[4] for p in curve if p[0] > 0]
    return statistics.mean(after[-2:]) if after else curve[-1][4]


def run_final(curve: list, final_at: tuple[float, ...] = (), x: str = "fresh") -> float:
    """A run's final accuracy: final_accuracy (the mean of its last two evaluations) or, with
    `final_at`, the mean of value_at each of those fractions of its own x-range (Setting.final_at:
    arms with other eval schedules then end at the same points of training)."""
    if not final_at:
        return final_accuracy(curve)
    col = X_COL[x]
    return statistics.mean(value_at(curve, col, f * curve[-1][col]) for f in final_at)


def value_at(curve: list, col: int, x: float) -> float | None:
    """A run's accuracy at x (curve column col): linearly interpolated between the evaluations
    around it, a = a_{j-1} + (x - x_{j-1}) / (x_j - x_{j-1}) (a_j - a_{j-1}) for
    x_{j-1} < x <= x_j (a_j where x_j = x_{j-1}); None past the run's last evaluation."""
    pts = [(p[col], p[4]) for p in curve]
    if x > pts[-1][0] + 1e-9 * max(1.0, abs(pts[-1][0])):
        return None
    for j, (xj, aj) in enumerate(pts):
        if xj >= x:
            if j == 0 or xj == pts[j - 1][0]:
                return aj
            x0, a0 = pts[j - 1]
            return a0 + (x - x0) / (xj - x0) * (aj - a0)
    return pts[-1][1]


def time_to_target(curve: list, col: int, target: float) -> tuple[float, bool]:
    """(x, reached): the x (curve column col) at which the run first reaches target, linearly
    interpolated between the two evaluations that bracket the crossing, a_{j-1} < target <= a_j:
    x = x_{j-1} + (target - a_{j-1}) / (a_j - a_{j-1}) (x_j - x_{j-1}); a run that never reaches
    it is censored at its budget: (x of its last evaluation, False), a lower bound on its time."""
    pts = [(p[col], p[4]) for p in curve]
    for j, (xj, aj) in enumerate(pts):
        if aj >= target:
            if j == 0:
                return xj, True
            x0, a0 = pts[j - 1]
            return x0 + (target - a0) / (aj - a0) * (xj - x0), True
    return pts[-1][0], False


class ToTarget(NamedTuple):
    """The mean over seeds of the time to target, censored seeds at their budget (so a lower
    bound on the true mean when reached < n); reached of n seeds reached it."""
    mean: float
    reached: int
    n: int


def to_target(runs: list[dict], target: float, x: str) -> ToTarget:
    """time_to_target of every run on x (fresh | updates | wall), averaged over the runs."""
    times = [time_to_target(r["curve"], X_COL[x], target) for r in runs]
    return ToTarget(statistics.mean(t for t, _ in times), sum(ok for _, ok in times), len(times))


def ratio_bound(arm: ToTarget, base: ToTarget) -> tuple[float | None, str]:
    """(arm.mean / base.mean, relation to the true ratio). A censored time is a lower bound on
    the true one, so the ratio is exact ("=") where no seed is censored, a lower bound (">=")
    where only the arm's are, an upper bound ("<=") where only the baseline's are, and no bound
    ("?", ratio None) where both have censored seeds."""
    arm_cut, base_cut = arm.reached < arm.n, base.reached < base.n
    if (arm_cut and base_cut) or not base.mean:
        return None, "?"
    return arm.mean / base.mean, ">=" if arm_cut else "<=" if base_cut else "="


def stream(argv: list[str]) -> list:
    """The prompt stream a run saw: [--prompts-per-step, --seed], each the last value in argv
    (argparse's rule; None where absent: train.py's default). Runs with equal streams draw the
    same prompts in the same order with the same sampling seeds: paired."""
    def last(name):
        return next((argv[i + 1] for i in range(len(argv) - 2, -1, -1) if argv[i] == name), None)
    return [last("--prompts-per-step"), last("--seed")]


def _seed_streams(s: Setting, name: str, runs: list[dict]) -> list[tuple[object, list]]:
    """(seed, stream) of each run: as recorded by run_setting (the run's argv.json); for runs
    without them (hand-made), the position and the stream of the setting's and arm's flags."""
    arm = next((a for a in s.arms if a.name == name), Arm(name, ()))
    out = []
    for i, r in enumerate(runs):
        seed = r.get("seed", i)
        out.append((seed, r.get("stream") or stream([*s.flags, *arm.flags, "--seed", str(seed)])))
    return out


def metric_value(run: dict, metric: str, col: int, x_range: float,
                 final_at: tuple[float, ...] = (), x: str = "fresh") -> float | None:
    """A run's value of a claim's metric: "final" (run_final), "at P%" (value_at P% of x_range)
    or a metrics key (its last value, Setting.finals)."""
    if metric == "final":
        return run_final(run["curve"], final_at, x)
    if metric.startswith("at ") and metric.endswith("%"):
        return value_at(run["curve"], col, float(metric[3:-1]) / 100 * x_range)
    return run.get("last", {}).get(metric)


def compare_runs(s: Setting, runs: dict, arm: str, ref: str, metric: str = "final",
                 x_range: float = 0.0) -> Comparison | None:
    """Δ = arm - ref on metric: stats.paired over the seeds both ran where every such seed's
    prompt stream is the same in both (stream), else stats.welch over each one's values; None
    where either has no value."""
    col = X_COL[s.x]

    def values(name):
        pairs = zip(_seed_streams(s, name, runs[name]), runs[name])
        return {seed: (v, st) for (seed, st), r in pairs
                if (v := metric_value(r, metric, col, x_range, s.final_at, s.x)) is not None}
    a, b = values(arm), values(ref)
    if not a or not b:
        return None
    common = [k for k in a if k in b]
    if common and all(a[k][1] == b[k][1] for k in common):
        return paired([a[k][0] for k in common], [b[k][0] for k in common])
    return welch([v for v, _ in a.values()], [v for v, _ in b.values()])


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "!=": operator.ne}
AGGREGATES = {"max": "maxima", "min": "minima", "mean": "means", "last": "last"}   # load()'s


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def predicate_keys(key: str, predicate: str) -> tuple[str, ...]:
    """The metrics keys a diagnostic reads: key, and the right-hand side where it is a key."""
    rhs = predicate.split()[-1]
    return (key,) if _number(rhs) is not None else (key, rhs)


def aggregate(runs: list[dict], agg: str, key: str) -> float | None:
    """Over an arm's runs: max (the largest value at any step of any run), min (the smallest),
    mean (the mean over runs of each run's mean over steps), last (the mean over runs of each
    run's last value); None where the key was never logged."""
    vals = [v for r in runs if (v := r.get(AGGREGATES[agg], {}).get(key)) is not None]
    if not vals:
        return None
    return max(vals) if agg == "max" else min(vals) if agg == "min" else statistics.mean(vals)


def mechanism_acted(runs: list[dict], key: str, predicate: str) -> bool:
    """Whether predicate "AGG OP RHS" holds for metrics key on the arm's runs: AGG one of max,
    min, mean, last (aggregate), OP one of > >= < <= == !=, RHS a number or another metrics key
    (aggregated the same way); e.g. ("loss/veto_frac", "max > 0"), ("replay/headroom_mean",
    "mean != replay/headroom_stored_mean"). False where a key was never logged."""
    agg, op, rhs = predicate.split()
    left = aggregate(runs, agg, key)
    right = _number(rhs)
    right = aggregate(runs, agg, rhs) if right is None else right
    return left is not None and right is not None and OPS[op](left, right)


NOT_LEARNING = "not testable here: the baseline does not learn"
NOT_ACTED = "not testable here: the mechanism did not act"
NOT_LOGGED = "not testable here: its diagnostic was not logged"     # runs older than the key


def verdict(direction: int | None, c: Comparison | None, acted: bool | None = True,
            learns: bool = True) -> str:
    """VERDICT_RULE: "—" where there is no claim (direction None); NOT_LEARNING where the
    setting's baseline does not learn (learns False); for direction +1 / -1: NOT_LOGGED where
    the diagnostic's key is in none of the runs (acted None), NOT_ACTED where the mechanism did
    not act, "reproduced" where the CI [lo, hi] excludes 0 on the claimed side
    (direction x lo > 0 and direction x hi > 0), "contradicted" where it excludes it on the
    other; for direction 0 (matches or exceeds; `acted` is not a gate): "reproduced" where lo >=
    -PAR_MARGIN, "contradicted" where hi < -PAR_MARGIN; else "inconclusive (95% CI [lo, hi])" in
    points (x 100)."""
    if direction is None:
        return "—"
    if not learns:
        return NOT_LEARNING
    if direction != 0 and acted is None:
        return NOT_LOGGED
    if direction != 0 and not acted:
        return NOT_ACTED
    if c is None or c.lo is None:
        return "inconclusive (95% CI undefined: fewer than 2 seeds)"
    lo, hi = c.lo, c.hi
    if direction == 0:
        if lo >= -PAR_MARGIN:
            return "reproduced"
        if hi < -PAR_MARGIN:
            return "contradicted"
    elif direction * lo > 0 and direction * hi > 0:
        return "reproduced"
    elif direction * lo < 0 and direction * hi < 0:
        return "contradicted"
    return f"inconclusive (95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}])"


def holm_verdicts(claims: list[dict]) -> list[str]:
    """The Holm-adjusted verdict of each judged claim (analyse's comparison dicts, one setting):
    the claims whose raw verdict is reproduced, contradicted or inconclusive form the family;
    each one's p = stats.p_value of Δ = 0 (direction 0: Δ = -PAR_MARGIN), adjusted by stats.holm;
    "reproduced" where the adjusted p < 0.05 and Δ lies on the claimed side of the null (direction
    0: above -PAR_MARGIN), "contradicted" where it is < 0.05 on the other, else "inconclusive
    (Holm p = ...)"; the other claims keep their raw word ("—", "not testable here: ...")."""
    def p_of(c):
        if c["direction"] is None or c["verdict"].startswith("not testable") or c["se"] is None:
            return None
        null = -PAR_MARGIN if c["direction"] == 0 else 0.0
        return p_value(Comparison(c["delta"], c["se"], c["df"], *c["ci"], c["n"], c["paired"]),
                       null)
    adjusted = holm([p_of(c) for c in claims])
    out = []
    for c, p in zip(claims, adjusted):
        if p is None:
            out.append(c["verdict"])
            continue
        side = 1 if c["direction"] == 0 else c["direction"]
        null = -PAR_MARGIN if c["direction"] == 0 else 0.0
        if p < 0.05:
            out.append("reproduced" if side * (c["delta"] - null) > 0 else "contradicted")
        else:
            out.append(f"inconclusive (Holm p = {p:.2g})")
    return out


def baseline_gain(s: Setting, runs: list[dict]) -> Comparison:
    """The baseline's gain over seeds: paired(final accuracy, step-0 accuracy) of each run."""
    return paired([run_final(r["curve"], s.final_at, s.x) for r in runs],
                  [r["curve"][0][4] for r in runs])


def learned(gain: dict | None) -> bool:
    """Whether a baseline learned: its gain's 95% CI (comparison_json) lies above 0."""
    return gain is not None and gain["ci"][0] is not None and gain["ci"][0] > 0


def claims_of(s: Setting, runs: dict) -> list[Claim]:
    """The claims to judge: Setting.claims whose arm and reference were reported and differ (a
    claim on a reading not chosen is dropped), and Claim(arm) for every other reported arm with no
    claim against the baseline, with the mechanism diagnostic of the arm's own claims (the mechanism
    acted or not whatever it is compared with); in the order of s.arms."""
    explicit = [c for c in s.claims if c.arm in runs and (c.against or s.baseline) in runs
                and c.arm != (c.against or s.baseline)]      # a stress setting's own baseline
    default = [Claim(a.name, acted=next((c.acted for c in s.claims
                                         if c.arm == a.name and c.acted), None))
               for a in s.arms if a.name in runs and a.name != s.baseline
               and not any(c.arm == a.name and (c.against or s.baseline) == s.baseline
                           for c in s.claims)]
    order = {a.name: i for i, a in enumerate(s.arms)}
    return sorted(default + explicit, key=lambda c: order.get(c.arm, len(order)))


def comparison_json(c: Comparison | None) -> dict | None:
    return None if c is None else {"delta": c.delta, "se": c.se, "df": c.df, "ci": [c.lo, c.hi],
                                   "n": c.n, "paired": c.paired}


def arm_aes(rs: list[dict], base: list[dict], final=final_accuracy) -> float | None:
    """O1-Pruner's accuracy-efficiency score (eval.aes) of an arm against the baseline: the mean
    final accuracies and the mean response lengths of the last training step (response/len_mean,
    sampled rollouts: the evaluation logs no length); None without lengths."""
    from eval import aes
    lengths = [r["len_end"] for r in rs if r.get("len_end")]
    base_lengths = [r["len_end"] for r in base if r.get("len_end")]
    base_acc = statistics.mean(final(r["curve"]) for r in base)
    if not lengths or not base_lengths or base_acc <= 0:
        return None
    return aes(statistics.mean(final(r["curve"]) for r in rs),
               statistics.mean(lengths), base_acc, statistics.mean(base_lengths))


def analyse(summary: dict) -> dict:
    """Every number of a setting's tables, from its reported runs: start (the mean step-0
    accuracy), target (start + TARGET_FRAC x the baseline's gain in final accuracy; None where it
    did not gain), the budgets (BUDGETS x x_range, x_range = the smallest last x of the
    baseline's runs), per arm its final accuracy, Δ to the baseline (compare_runs), x and wall
    time to target with reached k/n and the ratio bound, accuracy at each budget with its Δ; and
    per claim (claims_of) its Δ, CI, pairing, diagnostic, verdict and Holm-adjusted verdict; the
    baseline's gain (baseline_gain) and the gain the learning gate reads (summary["gate"]: the
    learns_in setting's, else this one's). JSON-ready."""
    s, runs = summary["setting"], summary["runs"]
    col = X_COL[s.x]

    def final(curve):
        return run_final(curve, s.final_at, s.x)

    gain = comparison_json(baseline_gain(s, runs[s.baseline]))
    gate = summary.get("gate") if s.learns_in else gain
    start = statistics.mean(r["curve"][0][4] for rs in runs.values() for r in rs)
    base = statistics.mean(final(r["curve"]) for r in runs[s.baseline])
    target = start + TARGET_FRAC * (base - start) if base > start else None
    x_range = min(r["curve"][-1][col] for r in runs[s.baseline])
    budgets = [{"label": f"at {100 * q:g}%", "x": q * x_range} for q in BUDGETS]
    base_t = {x: to_target(runs[s.baseline], target, x) for x in (s.x, "wall")} if target else {}
    arms = {}
    for name, rs in runs.items():
        finals = [final(r["curve"]) for r in rs]
        acc, std = mean_std(finals)
        entry = {"seeds": [seed for seed, _ in _seed_streams(s, name, rs)],
                 "final": {"mean": acc, "std": std, "per_seed": finals},
                 "delta": None if name == s.baseline else
                 comparison_json(compare_runs(s, runs, name, s.baseline))}
        for x, field_name in ((s.x, "to_target"), ("wall", "wall_to_target")):
            if target is None:
                entry[field_name] = None
                continue
            t = to_target(rs, target, x)
            ratio, bound = ratio_bound(t, base_t[x])
            entry[field_name] = {"mean": t.mean, "reached": t.reached, "n": t.n,
                                 "lower_bound": t.reached < t.n, "ratio": ratio, "bound": bound}
        entry["at"] = {}
        for b in budgets:
            vals = [v for r in rs if (v := value_at(r["curve"], col, b["x"])) is not None]
            entry["at"][b["label"]] = {
                "mean": statistics.mean(vals) if vals else None, "n": len(vals),
                "delta": None if name == s.baseline else comparison_json(
                    compare_runs(s, runs, name, s.baseline, b["label"], x_range))}
        entry["aes"] = arm_aes(rs, runs[s.baseline], final)
        arms[name] = entry
    comparisons = []
    also = set(summary.get("also", {}).values())     # reported beside the pick: no headline
    for c in claims_of(s, runs):
        ref = c.against or s.baseline
        cmp = compare_runs(s, runs, c.arm, ref, c.metric, x_range)
        acted = mechanism_acted(runs[c.arm], *c.acted) if c.acted else True
        value = c.acted and aggregate(runs[c.arm], c.acted[1].split()[0], c.acted[0])
        comparisons.append({
            "arm": c.arm, "against": ref, "metric": c.metric, "direction": c.direction,
            "headline": c.headline and c.arm not in also,
            "diagnostic": c.acted and {"key": c.acted[0], "predicate": c.acted[1],
                                       "acted": acted, "value": value,
                                       "gates": c.direction not in (0, None)},
            **(comparison_json(cmp) or {"delta": None, "se": None, "df": None,
                                        "ci": [None, None], "n": 0, "paired": None}),
            "verdict": verdict(c.direction, cmp, None if c.acted and value is None else acted,
                               learned(gate))})
    for c, word in zip(comparisons, holm_verdicts(comparisons)):
        c["holm"] = word
    return {"start": start, "target": target, "x": s.x, "x_range": x_range, "budgets": budgets,
            "arms": arms, "comparisons": comparisons, "baseline_gain": gain,
            "gate": {"setting": s.learns_in or s.label, "gain": gate, "learned": learned(gate)}}

