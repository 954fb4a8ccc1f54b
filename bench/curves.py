"""A run's accuracy curve read as numbers: its final accuracy (the mean of its last two
evaluations, or its accuracy at fractions of its x-range), its peak, its accuracy at any x
(interpolated), the x at which it first reaches a target (censored at its budget), and the ratio
of two arms' times as a bound. A curve is [(step, fresh, updates, wall, accuracy, tokens)]
(runs.load; tokens: the completion tokens generated so far).
"""
import statistics
from typing import NamedTuple

X_COL = {"fresh": 1, "updates": 2, "wall": 3, "tokens": 5}   # a curve point's column of each x


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


def peak_accuracy(curve: list) -> float:
    """A run's peak accuracy: its best evaluation after step 0 (PNPO's abstract compares peaks;
    the step-0 one where there is no other)."""
    return max((p[4] for p in curve if p[0] > 0), default=curve[-1][4])


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


def to_target(runs: list[dict], target: float | dict, x: str) -> ToTarget:
    """time_to_target of every run on x (fresh | updates | wall | tokens), averaged over the runs;
    target: one for every run, or {seed: target} (each run's own seed's)."""
    times = [time_to_target(r["curve"], X_COL[x],
                            target[r["seed"]] if isinstance(target, dict) else target)
             for r in runs]
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


def spend_to_baseline(runs: dict, baseline: str) -> dict:
    """{arm: {"wall": ToTarget, "tokens": ToTarget}}: what each arm spent to reach the baseline's
    final accuracy, seed by seed: a seed's target is its own baseline run's final accuracy
    (final_accuracy), so every arm of that seed is measured on one prompt stream and, where a
    setting keeps a seed's arms on one machine, one CPU kind. Wall: the run's seconds of training
    steps (the sum of time/step; evaluations not counted); tokens: the completion tokens it
    generated (the curve's last column). The baseline reaches its own target by construction (the
    better of its last two evaluations is at least their mean), usually before its end."""
    targets = {r["seed"]: final_accuracy(r["curve"]) for r in runs[baseline]}
    return {arm: {x: to_target([r for r in rs if r["seed"] in targets], targets, x)
                  for x in ("wall", "tokens")}
            for arm, rs in runs.items() if any(r["seed"] in targets for r in rs)}
