"""The verdict rule and the numbers it reads, from a setting's reported runs (the curves and
aggregates bench/protocol.py's load gives): a run's final accuracy, time to a target (censored),
accuracy at a budget, Δ paired or Welch (bench/stats.py), the mechanism diagnostics (predicates on
metrics keys), the learning gate, the verdict word and its Holm-adjusted form; analyse() gives
every number of a setting's tables, JSON-ready. No running, no writing: pure functions of runs.
"""
import operator
import statistics

from curves import (X_COL, ToTarget, final_accuracy, peak_accuracy, ratio_bound, run_final,
                    spend_to_baseline, to_target, value_at)
from design import ACTED, Arm, Claim, Pooled, Setting
import sequential
from stats import Comparison, holm, mean_std, p_value, paired, welch

# ---- the statistics, the verdicts and the tables ----------------------------------------------

TARGET_FRAC = 0.9
BUDGETS = (0.25, 0.5, 0.75, 1.0)   # accuracy at these fractions of the baseline's x-range
PAR_MARGIN = 0.02                  # "on par": not worse than the reference by more than this
VERDICT_RULE = (
    "**Verdict** (bench/verdicts.py `verdict`, one rule for every claim, fixed before the "
    "runs, as the seeds are: every arm on all of its setting's seeds): Δ = the arm's metric minus"
    " its reference's, with its 95% CI (paired over the seeds both ran where the two share the "
    "prompt stream, equal --prompts-per-step and --seed; else Welch's). First, what the setting "
    "can show (`reading`), from each arm's own gain over the setting's seeds (final minus step-0 "
    "accuracy, paired; it learns where the gain's 95% CI lies above 0, degrades where below): "
    "where the reference learns, the paper's claim as stated; where the reference does not learn "
    "and the arm does, the same words with \"(only the arm learns)\"; where neither learns and "
    "one degrades, a claim that the arm is better (worse) is judged as degrading less (more), "
    "and its word says so: \"not testable here: no arm learns (finding: the arm degrades "
    "less)\" (more, as much), a finding counted neither as a reproduction nor as a "
    "contradiction; where neither moves, \"not testable here: the baseline does not learn\". Each "
    "setting reads its own arms, a stress setting too. Then, for a claim "
    "that the arm is better (worse) than its reference: \"not testable here: the mechanism did "
    "not act\" when its diagnostic (a predicate on a metrics key's mean over every step of every "
    "reported seed of the arm, or on the ratio of two keys' means, against a bound stated with "
    f"it; the stabilisers' shares of tokens or groups and R²PO's head KL: ACTED = {ACTED:g}) says "
    "it did not, \"not testable here: its diagnostic was not logged\" when the code that made "
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
    if metric == "peak":
        return peak_accuracy(run["curve"])
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


def _band(text: str) -> tuple[float, float] | None:
    """(LO, HI) of a band "LO..HI" (the right-hand side of the op "in"), else None."""
    lo, sep, hi = text.partition("..")
    if not sep or _number(lo) is None or _number(hi) is None:
        return None
    return float(lo), float(hi)


def _terms(predicate: str) -> tuple[str, str | None, str, str]:
    """(AGG, the second key or None, OP, RHS) of "AGG OP RHS", "AGG / KEY OP RHS" or "AGG * KEY
    OP RHS" (the product form: _product)."""
    words = predicate.split()
    if len(words) == 5 and words[1] in ("/", "*"):
        agg, _, denominator, op, rhs = words
        return agg, denominator, op, rhs
    agg, op, rhs = words
    return agg, None, op, rhs


def _product(predicate: str) -> bool:
    """Whether a predicate is the product form "AGG * KEY OP RHS" (e.g. a per-token KL times the
    mean completion length: nats a completion)."""
    return predicate.split()[1:2] == ["*"]


AGAINST = "against:"     # a denominator read on the claim's reference arm's runs


def predicate_keys(key: str, predicate: str) -> tuple[str, ...]:
    """The metrics keys a diagnostic reads: key, the denominator's key in the ratio form (less its
    AGAINST prefix), and the right-hand side where it is a key."""
    _, denominator, _, rhs = _terms(predicate)
    keys = (key,) + ((denominator.removeprefix(AGAINST),) if denominator else ())
    return keys if _number(rhs) is not None or _band(rhs) else keys + (rhs,)


def aggregate(runs: list[dict], agg: str, key: str) -> float | None:
    """Over an arm's runs: max (the largest value at any step of any run), min (the smallest),
    mean (the mean over runs of each run's mean over steps), last (the mean over runs of each
    run's last value); None where the key was never logged."""
    vals = [v for r in runs if (v := r.get(AGGREGATES[agg], {}).get(key)) is not None]
    if not vals:
        return None
    return max(vals) if agg == "max" else min(vals) if agg == "min" else statistics.mean(vals)


def diagnostic_value(runs: list[dict], key: str, predicate: str,
                     ref: list[dict] | None = None) -> float | None:
    """The left-hand side of a diagnostic on the arm's runs: AGG of key, in the product form "AGG
    * KEY2 OP RHS" AGG(key) x AGG(KEY2), or in the ratio form
    "AGG / KEY2 OP RHS" the ratio AGG(key) / AGG(KEY2) (e.g. the mean |A| of the replayed
    rollouts over that of the stored ones: what a priority draw lifts), KEY2 read on the
    reference arm's runs `ref` where it reads "against:KEY2" (e.g. the mean |A| an arm replays
    over what the arm it is compared with replays); None where a key was never logged or the
    denominator is 0."""
    agg, denominator, _, _ = _terms(predicate)
    left = aggregate(runs, agg, key)
    if denominator is None or left is None:
        return left
    if denominator.startswith(AGAINST):
        below = aggregate(ref or [], agg, denominator.removeprefix(AGAINST))
    else:
        below = aggregate(runs, agg, denominator)
    if _product(predicate):
        return None if below is None else left * below
    return left / below if below else None


def mechanism_acted(runs: list[dict], key: str, predicate: str,
                    ref: list[dict] | None = None) -> bool:
    """Whether predicate "AGG OP RHS" or "AGG / KEY2 OP RHS" holds for metrics key on the arm's
    runs: AGG one of max, min, mean, last (aggregate), the ratio form dividing by KEY2's AGG
    (diagnostic_value; "against:KEY2" on the reference arm's runs `ref`), OP one of > >= < <= ==
    !=, RHS a number or another metrics key (aggregated the same way), or OP "in" with RHS a band
    "LO..HI" (both ends included); e.g. ("loss/veto_frac",
    "max > 0"), ("replay/headroom_mean", "mean != replay/headroom_stored_mean"),
    ("replay/abs_adv_sampled", "mean / replay/abs_adv_stored >= 1.05"). False where a key was
    never logged."""
    agg, _, op, rhs = _terms(predicate)
    left = diagnostic_value(runs, key, predicate, ref)
    if op == "in":                                    # "AGG [/ KEY2] in LO..HI": LO <= x <= HI
        lo, hi = _band(rhs)
        return left is not None and lo <= left <= hi
    right = _number(rhs)
    right = aggregate(runs, agg, rhs) if right is None else right
    return left is not None and right is not None and OPS[op](left, right)


NOT_LEARNING = "not testable here: the baseline does not learn"
NOT_ACTED = "not testable here: the mechanism did not act"
NOT_LOGGED = "not testable here: its diagnostic was not logged"     # runs older than the key
NO_ARM_LEARNS = "not testable here: no arm learns"    # DEGRADATION: a finding, not the claim


LEARNS, FLAT, DEGRADES = "learns", "flat", "degrades"       # an arm's course over its seeds
ACCURACY = "accuracy"                  # what a claim can show (reading): the paper's claim
ONLY_ARM = "only the arm learns"       # its reference does not learn, the arm does
DEGRADATION = "degradation"            # neither learns, one degrades: less or more, not accuracy
NOTHING = "nothing"                    # neither moves: not testable


def course(gain: dict | None) -> str:
    """An arm's course from its gain (comparison_json of arm_gain): LEARNS where the 95% CI lies
    above 0, DEGRADES where it lies below, else FLAT (an undefined CI too)."""
    if gain is None or gain["ci"][0] is None:
        return FLAT
    return LEARNS if gain["ci"][0] > 0 else DEGRADES if gain["ci"][1] < 0 else FLAT


def reading(arm: str, ref: str) -> str:
    """What a claim of an arm against its reference can show, from their courses: ACCURACY where
    the reference learns; ONLY_ARM where it does not and the arm does; DEGRADATION where neither
    learns and one degrades (a stress lr past where the arms learn: "better" can only mean
    degrades less); NOTHING where neither moves."""
    if ref == LEARNS:
        return ACCURACY
    if arm == LEARNS:
        return ONLY_ARM
    return DEGRADATION if DEGRADES in (arm, ref) else NOTHING


def qualify(word: str, shows: str, lo: float | None, hi: float | None) -> str:
    """A judged word (reproduced, contradicted, inconclusive (...)) with what it shows: as it is
    under ACCURACY; under ONLY_ARM "(only the arm learns)"; under DEGRADATION the accuracy claim
    is not testable, whatever the word: NO_ARM_LEARNS with the finding beside it, "the arm
    degrades less" where the CI [lo, hi] lies above 0, "more" below, "as much (95% CI ...)"
    across it: a finding, counted neither as a reproduction nor as a contradiction."""
    if shows == ACCURACY or not word.split()[0] in ("reproduced", "contradicted", "inconclusive"):
        return word
    if shows == DEGRADATION:
        how = ("degrades less" if lo is not None and lo > 0 else
               "degrades more" if hi is not None and hi < 0 else "degrades as much" + (
                   "" if lo is None else f", 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}]"))
        return f"{NO_ARM_LEARNS} (finding: the arm {how})"
    return f"{word[:-1]}; {ONLY_ARM})" if word.endswith(")") else f"{word} ({ONLY_ARM})"


def verdict(direction: int | None, c: Comparison | None, acted: bool | None = True,
            learns: bool = True, shows: str = ACCURACY) -> str:
    """VERDICT_RULE: "—" where there is no claim (direction None); NOT_LEARNING where the
    setting can show nothing (learns False, or shows NOTHING); for direction +1 / -1: NOT_LOGGED
    where the diagnostic's key is in none of the runs (acted None), NOT_ACTED where the mechanism
    did not act, "reproduced" where the CI [lo, hi] excludes 0 on the claimed side
    (direction x lo > 0 and direction x hi > 0), "contradicted" where it excludes it on the
    other; for direction 0 (matches or exceeds; `acted` is not a gate): "reproduced" where lo >=
    -PAR_MARGIN, "contradicted" where hi < -PAR_MARGIN; else "inconclusive (95% CI [lo, hi])" in
    points (x 100); each judged word qualified by what it shows (qualify)."""
    if direction is None:
        return "—"
    if not learns or shows == NOTHING:
        return NOT_LEARNING
    if direction != 0 and acted is None:
        return NOT_LOGGED
    if direction != 0 and not acted:
        return NOT_ACTED
    if c is None or c.lo is None:
        return "inconclusive (95% CI undefined: fewer than 2 seeds)"
    lo, hi = c.lo, c.hi
    word = f"inconclusive (95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}])"
    if direction == 0:
        if lo >= -PAR_MARGIN:
            word = "reproduced"
        elif hi < -PAR_MARGIN:
            word = "contradicted"
    elif direction * lo > 0 and direction * hi > 0:
        word = "reproduced"
    elif direction * lo < 0 and direction * hi < 0:
        word = "contradicted"
    return qualify(word, shows, lo, hi)


def holm_verdicts(claims: list[dict]) -> list[str]:
    """The Holm-adjusted verdict of each judged claim (analyse's comparison dicts, one setting):
    the claims whose raw verdict is reproduced, contradicted or inconclusive form the family;
    each one's p = stats.p_value of Δ = 0 (direction 0: Δ = -PAR_MARGIN), adjusted by stats.holm;
    "reproduced" where the adjusted p < 0.05 and Δ lies on the claimed side of the null (direction
    0: above -PAR_MARGIN), "contradicted" where it is < 0.05 on the other, else "inconclusive
    (Holm p = ...)", each qualified by what the claim shows (qualify); the other claims keep
    their raw word ("—", "not testable here: ...")."""
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
            word = "reproduced" if side * (c["delta"] - null) > 0 else "contradicted"
        else:
            word = f"inconclusive (Holm p = {p:.2g})"
        out.append(qualify(word, c.get("shows", ACCURACY), *c["ci"]))
    return out


def arm_gain(s: Setting, runs: list[dict]) -> Comparison:
    """An arm's gain over seeds: paired(final accuracy, step-0 accuracy) of each run."""
    return paired([run_final(r["curve"], s.final_at, s.x) for r in runs],
                  [r["curve"][0][4] for r in runs])


baseline_gain = arm_gain       # the learning gate's: the setting's own baseline


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


def target_json(t: ToTarget, base: ToTarget) -> dict:
    """A time to target as the tables show it: its mean, the seeds that reached it of n, whether
    the mean is a lower bound (censored seeds), and its ratio bound to the baseline's."""
    ratio, bound = ratio_bound(t, base)
    return {"mean": t.mean, "reached": t.reached, "n": t.n, "lower_bound": t.reached < t.n,
            "ratio": ratio, "bound": bound}


def analyse(summary: dict) -> dict:
    """Every number of a setting's tables, from its reported runs: start (the mean step-0
    accuracy), target (start + TARGET_FRAC x the baseline's gain in final accuracy; None where it
    did not gain), the budgets (BUDGETS x x_range, x_range = the smallest last x of the
    baseline's runs), per arm its final accuracy, Δ to the baseline (compare_runs), x and wall
    time to target with reached k/n and the ratio bound, accuracy at each budget with its Δ; and
    per arm its gain over its step-0 accuracy (arm_gain) and its course; per claim (claims_of) its
    Δ, CI, pairing, diagnostic, what it can show (reading), verdict and Holm-adjusted verdict, and
    where the claim names one, the Δ of the arm beside it against the same reference; the
    learning gate: this setting's own baseline's gain. JSON-ready."""
    s, runs = summary["setting"], summary["runs"]
    col = X_COL[s.x]

    def final(curve):
        return run_final(curve, s.final_at, s.x)

    gain = comparison_json(baseline_gain(s, runs[s.baseline]))
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
                 "gain": comparison_json(arm_gain(s, rs)),
                 "delta": None if name == s.baseline else
                 comparison_json(compare_runs(s, runs, name, s.baseline))}
        for x, field_name in ((s.x, "to_target"), ("wall", "wall_to_target")):
            if target is None:
                entry[field_name] = None
                continue
            entry[field_name] = target_json(to_target(rs, target, x), base_t[x])
        entry["at"] = {}
        for b in budgets:
            vals = [v for r in rs if (v := value_at(r["curve"], col, b["x"])) is not None]
            entry["at"][b["label"]] = {
                "mean": statistics.mean(vals) if vals else None, "n": len(vals),
                "delta": None if name == s.baseline else comparison_json(
                    compare_runs(s, runs, name, s.baseline, b["label"], x_range))}
        entry["aes"] = arm_aes(rs, runs[s.baseline], final)
        entry["course"] = course(entry["gain"])
        arms[name] = entry
    comparisons = []
    also = set(summary.get("also", {}).values())     # reported beside the pick: no headline
    for c in claims_of(s, runs):
        ref = c.against or s.baseline
        cmp = compare_runs(s, runs, c.arm, ref, c.metric, x_range)
        acted = mechanism_acted(runs[c.arm], *c.acted, runs[ref]) if c.acted else True
        value = c.acted and diagnostic_value(runs[c.arm], *c.acted, runs[ref])
        post_hoc = c.post_hoc and {"key": c.post_hoc[0], "predicate": c.post_hoc[1],
                                   "label": c.post_hoc_label,
                                   "acted": mechanism_acted(runs[c.arm], *c.post_hoc, runs[ref]),
                                   "value": diagnostic_value(runs[c.arm], *c.post_hoc, runs[ref])}
        shows = reading(arms[c.arm]["course"], arms[ref]["course"])
        beside = c.beside and c.beside in runs and compare_runs(s, runs, c.beside, ref, c.metric,
                                                                x_range)
        comparisons.append({
            "arm": c.arm, "against": ref, "metric": c.metric, "direction": c.direction,
            "headline": c.headline and c.arm not in also, "note": c.note,
            "beside": beside and {"arm": c.beside, **comparison_json(beside)},
            "courses": {c.arm: arms[c.arm]["course"], ref: arms[ref]["course"]},
            "shows": shows,
            "diagnostic": c.acted and {"key": c.acted[0], "predicate": c.acted[1],
                                       "acted": acted, "value": value,
                                       "gates": c.direction not in (0, None)},
            **(comparison_json(cmp) or {"delta": None, "se": None, "df": None,
                                        "ci": [None, None], "n": 0, "paired": None}),
            "verdict": verdict(c.direction, cmp, None if c.acted and value is None else acted,
                               shows=shows),
            "post_hoc": post_hoc and {**post_hoc, "verdict": verdict(
                c.direction, cmp, None if post_hoc["value"] is None else post_hoc["acted"],
                shows=shows)}})
    for c, word in zip(comparisons, holm_verdicts(comparisons)):
        c["holm"] = word
    if s.arm_gates:
        for name, rs in runs.items():
            arms[name]["gates"] = [{"check": check, "value": value, "holds": holds}
                                   for check, value, holds in s.arm_gates(name, rs)]
    out = {"start": start, "target": target, "x": s.x, "x_range": x_range, "budgets": budgets,
           "arms": arms, "comparisons": comparisons, "baseline_gain": gain,
           "gate": {"setting": s.label, "gain": gain, "learned": learned(gain)}}
    if s.spend:                  # descriptive: what each arm spent to the baseline's final
        spend = spend_to_baseline(runs, s.baseline)
        out["spend"] = {"baseline": s.baseline, "arms": {
            arm: {x: target_json(t, spend[s.baseline][x]) for x, t in by_x.items()}
            for arm, by_x in spend.items()}}
    n = min(len(rs) for rs in runs.values())
    if s.looks and n in s.looks:
        out["sequential"] = sequential_read(s, n, comparisons)
    return out


def sequential_read(s: Setting, n: int, comparisons: list[dict]) -> dict:
    """A group-sequential setting (Setting.looks) read at its look of n complete seeds
    (bench/sequential.py `read`): each claim's verdict and Holm word become the rule's word (the
    fixed-sample words kept as "unadjusted"), with its p and Holm-adjusted p; the primary is
    s.claims[0]."""
    first = s.claims[0]
    key = (first.arm, first.against or s.baseline, first.metric)
    primary = next(i for i, c in enumerate(comparisons)
                   if (c["arm"], c["against"], c["metric"]) == key)
    seq = sequential.read(s.looks, n, comparisons, primary)
    for c, word, p, q in zip(comparisons, seq["words"], seq["p"], seq["holm_p"]):
        c.update({"unadjusted": c["verdict"], "verdict": word, "holm": word, "p": p, "holm_p": q,
                  "primary": c is comparisons[primary]})
    return seq



def pooled(p: Pooled, summaries: dict[str, dict]) -> dict:
    """The comparison of p.claim (final accuracy) over the paired seeds of p.settings, from each
    setting's summary.json (`summaries`, by label; written by report.write_setting): Δ paired over
    every (setting, seed) pair where both arms ran the seed on the same prompt stream; each arm's
    course from its gain over all those runs; the diagnostic over the arm's runs of every setting;
    the verdict by the same rule (a family of one: its Holm word is its p's). A comparison dict
    as analyse's, with settings and the pairs per setting, the note (p.post_hoc where it was
    defined after results), and per_setting: the same claim's test in each setting, p and Holm
    over them, shown beside the pooled row."""
    c = p.claim
    arm, ref = c.arm, c.against
    values = {arm: [], ref: []}           # final accuracies, pair by pair
    runs = {arm: [], ref: []}             # the runs, in the same order
    per_setting = {}
    for label in p.settings:
        data = summaries[label]
        by_seed = {name: {r["seed"]: r for r in data["runs"][name]} for name in (arm, ref)}
        common = [sd for sd in by_seed[arm] if sd in by_seed[ref]
                  and by_seed[arm][sd].get("stream") == by_seed[ref][sd].get("stream")]
        per_setting[label] = len(common)
        for name in (arm, ref):
            finals = dict(zip(data["arms"][name]["seeds"], data["arms"][name]["final"]["per_seed"]))
            values[name] += [finals[sd] for sd in common]
            runs[name] += [by_seed[name][sd] for sd in common]
    cmp = paired(values[arm], values[ref])
    courses = {name: course(comparison_json(paired(values[name],
                                                   [r["curve"][0][4] for r in runs[name]])))
               for name in (arm, ref)}
    shows = reading(courses[arm], courses[ref])
    acted = mechanism_acted(runs[arm], *c.acted, runs[ref]) if c.acted else True
    value = c.acted and diagnostic_value(runs[arm], *c.acted, runs[ref])
    per_setting_tests = []
    for label in p.settings:
        mine = next((d for d in summaries[label].get("comparisons", []) if d["arm"] == arm
                     and d["against"] == ref and d["metric"] == "final"), None)
        if mine and mine["se"] is not None:
            per_setting_tests.append({"setting": label, "delta": mine["delta"],
                                      "ci": mine["ci"], "p": p_value(Comparison(
                                          mine["delta"], mine["se"], mine["df"], *mine["ci"],
                                          mine["n"], mine["paired"]))})
    for t, q in zip(per_setting_tests, holm([t["p"] for t in per_setting_tests])):
        t["holm_p"] = q
    note = "; ".join(filter(None, (c.note, p.post_hoc)))
    out = {"arm": arm, "against": ref, "metric": "final", "direction": c.direction,
           "headline": c.headline, "note": note, "post_hoc": bool(p.post_hoc),
           "per_setting": per_setting_tests, "beside": None, "courses": courses,
           "shows": shows, "settings": per_setting,
           "diagnostic": c.acted and {"key": c.acted[0], "predicate": c.acted[1], "acted": acted,
                                      "value": value, "gates": c.direction not in (0, None)},
           **comparison_json(cmp),
           "verdict": verdict(c.direction, cmp, None if c.acted and value is None else acted,
                              shows=shows)}
    out["holm"] = holm_verdicts([out])[0]
    return out
