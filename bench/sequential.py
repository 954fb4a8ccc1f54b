"""A group-sequential rule for a pre-registered setting (Setting.looks): the reported seeds are
read at looks (10 complete seeds, then 20), the primary claim is tested at each look against an
O'Brien-Fleming boundary, and the runs stop at the first look where it crosses. Pure functions:
bench/protocol.py asks `crosses` between looks, bench/verdicts.py's analyse reads a look (`read`)
and bench/report.py writes its table.

The boundary (O'Brien & Fleming 1979; Jennison & Turnbull 2000, ch. 2): with K looks at
information fractions t_k = n_k / n_K (n_k complete seeds at look k), reject H0: Δ = 0 at look k
where |Z_k| >= c / sqrt(t_k), with the one constant c chosen so that, under H0,

    P(|Z_k| >= c / sqrt(t_k) for some k) = alpha        (two-sided, alpha = 0.05)

where (Z_1, ..., Z_K) are the standardized partial sums of a Brownian motion:
corr(Z_j, Z_k) = sqrt(t_j / t_k) for j < k. obrien_fleming computes c by the
Armitage-McPherson-Rowe recursion on a grid (the density of the unstopped partial sum carried
from look to look), then bisection; for two equal looks c = 1.977, so the boundaries are
z = 2.796 at 10 seeds and 1.977 at 20: nominal two-sided p 0.0052 and 0.0480 (nominal_p).

How a look is read (`read`): each claim's Δ is paired over the complete seeds (every arm of the
setting finished on that seed), with its t-based SE, df = n - 1, 95% CI and two-sided p
(bench/stats.py); the paired t-test's p is compared with the look's nominal p, the usual way to
apply z-derived nominal levels to a t statistic (with df 9 at the interim it is the stricter of
the two readings' alternatives by the t tail; said, not corrected). The runs stop at the first
look where the primary claim's unadjusted p is below that look's nominal p; at the last look
they stop in any case. Where they stop, every claim (the primary and the secondaries) is read
once: Holm's step-down adjustment over the claims' p-values (those whose mechanism acted), and a
claim is decided (reproduced when Δ has the sign the claim states, contradicted when the
opposite) where its Holm-adjusted p is below the look's nominal p; otherwise inconclusive, with
its 95% CI. A claim whose diagnostic says its mechanism did not act is "not testable here" and
leaves the Holm family. The secondaries are never read at a look where the primary did not stop.
"""
import functools
import math

import numpy as np

from stats import Comparison, holm, p_value

ALPHA = 0.05


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def nominal_p(z: float) -> float:
    """The two-sided nominal p of a boundary z: 2 P(Z > z)."""
    return 2 * normal_sf(z)


def _continue_probability(bounds: list[float], fractions: list[float], points: int = 801) -> float:
    """P(|Z_k| < bounds[k] for every k) under H0 for the Brownian motion's standardized partial
    sums at `fractions` (Armitage-McPherson-Rowe): the density of S_k = sqrt(t_k) Z_k on the
    continuation interval, carried to the next look by a normal increment of variance
    t_{k+1} - t_k (trapezoid rule on a grid)."""
    edge = bounds[0] * math.sqrt(fractions[0])
    s = np.linspace(-edge, edge, points)                          # [P] S_1 on its interval
    density = np.exp(-s ** 2 / (2 * fractions[0])) / math.sqrt(2 * math.pi * fractions[0])
    for k in range(1, len(bounds)):
        var = fractions[k] - fractions[k - 1]
        edge = bounds[k] * math.sqrt(fractions[k])
        nxt = np.linspace(-edge, edge, points)                    # [P] S_k on its interval
        kernel = np.exp(-(nxt[:, None] - s[None, :]) ** 2 / (2 * var)) / math.sqrt(
            2 * math.pi * var)                                    # [P, P]
        density = np.trapezoid(kernel * density[None, :], s, axis=1)
        s = nxt
    return float(np.trapezoid(density, s))


def obrien_fleming(looks: tuple[int, ...], alpha: float = ALPHA) -> list[float]:
    """The two-sided z boundaries c / sqrt(t_k) at each look (looks: complete seeds at each),
    with c such that the whole rule rejects a true H0 with probability alpha (c to about 1e-4:
    a grid of 801 points, 40 bisections)."""
    fractions = [n / looks[-1] for n in looks]
    lo, hi = 1.0, 5.0
    for _ in range(40):                        # bisection on c: the crossing probability falls
        c = (lo + hi) / 2
        bounds = [c / math.sqrt(t) for t in fractions]
        if 1 - _continue_probability(bounds, fractions) > alpha:
            lo = c
        else:
            hi = c
    c = (lo + hi) / 2
    return [c / math.sqrt(t) for t in fractions]


@functools.cache
def thresholds(looks: tuple[int, ...], alpha: float = ALPHA) -> list[float]:
    """The nominal two-sided p at each look (the primary crosses where its p is below)."""
    return [nominal_p(z) for z in obrien_fleming(looks, alpha)]


def crosses(p: float | None, look: int, looks: tuple[int, ...]) -> bool:
    """Whether the primary claim's p at look index `look` is below that look's nominal p."""
    return p is not None and p < thresholds(looks)[look]


def _testable(c: dict) -> bool:
    """A claim in the Holm family: a claim with a direction, its mechanism acted (its raw verdict
    is not "not testable"), and a defined SE."""
    return (c["direction"] not in (None, 0) and not c["verdict"].startswith("not testable")
            and c["se"] is not None)


def read(looks: tuple[int, ...], n: int, comparisons: list[dict], primary: int = 0) -> dict:
    """The rule at the look with `n` complete seeds, on analyse()'s claim dicts (delta, se, df,
    ci, direction, verdict); comparisons[primary] is the primary claim. Returns {look, n, seeds
    at each look, nominal p at each look, the primary's p, whether the runs stop here, words:
    the verdict of each claim by this rule} (the module docstring): before a stopping look the
    primary "continues" and the secondaries are "not decided"; at it, Holm over the testable claims
    against the look's nominal p."""
    if n not in looks:
        raise ValueError(f"{n} complete seeds is not a look of {looks}")
    k = looks.index(n)
    nominal = thresholds(tuple(looks))
    threshold = nominal[k]

    def p_of(c):
        if not _testable(c):
            return None
        return p_value(Comparison(c["delta"], c["se"], c["df"], *c["ci"], c["n"], c["paired"]))
    ps = [p_of(c) for c in comparisons]
    p = ps[primary]
    stops = k == len(looks) - 1 or (p is not None and p < threshold)
    adjusted = holm(ps)
    words = []
    for i, (c, q) in enumerate(zip(comparisons, adjusted)):
        if not stops:
            words.append(f"continues to {looks[k + 1]} seeds (p = {p:.2g} ≥ {threshold:.2g})"
                         if i == primary and p is not None else
                         c["verdict"] if i == primary else
                         "not decided: the primary did not stop here")
        elif q is None:
            words.append(c["verdict"])
        elif q < threshold:
            words.append("reproduced" if c["direction"] * c["delta"] > 0 else "contradicted")
        else:
            lo, hi = c["ci"]
            words.append(f"inconclusive (Holm p = {q:.2g} ≥ {threshold:.2g}; 95% CI "
                         f"[{100 * lo:+.1f}, {100 * hi:+.1f}])")
    return {"look": k + 1, "n": n, "looks": list(looks), "nominal_p": nominal,
            "threshold": threshold, "primary_p": p, "stops": stops, "p": ps,
            "holm_p": adjusted, "words": words}
