"""The statistics bench/compare.py and bench/experiments.py report: one definition, imported by
each (so neither imports the other). The standard library only (no scipy).

    from stats import mean_std, paired, welch   # with bench/ on sys.path, as each bench script runs

A difference of means between two arms over seeds, with its 95% confidence interval:
- `paired(a, b)`: a_i and b_i from the same seed (the two arms saw the same prompt stream, so their
  accuracies move together over seeds): d_i = a_i - b_i, Δ = mean(d), SE = sd(d) / sqrt(n),
  df = n - 1;
- `welch(a, b)`: independent samples: Δ = mean(a) - mean(b), SE = sqrt(va/na + vb/nb), df by
  Welch-Satterthwaite;
and in both CI = Δ ± t_{0.975, df} SE, t from `t_quantile` (the Student-t quantile at any df, also
a fractional one).
"""
import math
import statistics
from functools import lru_cache
from typing import NamedTuple


def mean_std(xs: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with Bessel's n - 1) of xs; the std of one value is 0.0."""
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


# ---- the Student-t distribution ---------------------------------------------------------------

def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b) for a, b > 0,
    0 <= x <= 1: the continued fraction of Numerical Recipes (2nd ed., 6.4), evaluated by the
    modified Lentz method, at x or through I_x(a, b) = 1 - I_{1-x}(b, a) where it converges
    faster (x > (a + 1) / (a + b + 2))."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    # front factor x^a (1 - x)^b / (a B(a, b))
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),              # d_{2m}
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # d_{2m+1}
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df > 0 degrees of freedom (df = inf: the standard normal):
    for t >= 0, 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2; for t < 0, 1 - P(T <= -t)."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(t)
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=None)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with df > 0 degrees of freedom (fractional df
    too; df = inf: the standard normal's quantile): bisection on t_cdf, to about 1e-12.
    t_quantile(0.975, df): 12.706 (df 1), 4.303 (2), 2.776 (4), 2.262 (9), 2.042 (30), 1.960
    (inf)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:                      # bracket: double until the cdf passes p
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


# ---- differences of means ---------------------------------------------------------------------

class Comparison(NamedTuple):
    """Δ = mean(a) - mean(b) with its standard error, degrees of freedom and 95% CI [lo, hi];
    n: the pairs (paired) or na + nb (Welch); se, df, lo, hi are None where a variance is
    undefined (fewer than 2 values)."""
    delta: float
    se: float | None
    df: float | None
    lo: float | None
    hi: float | None
    n: int
    paired: bool


def _interval(delta: float, se: float | None, df: float | None, n: int,
              is_paired: bool, level: float = 0.95) -> Comparison:
    """CI = Δ ± t_{(1 + level) / 2, df} SE (the endpoints are Δ when SE = 0)."""
    if se is None:
        return Comparison(delta, None, None, None, None, n, is_paired)
    half = t_quantile((1 + level) / 2, df) * se if se > 0 else 0.0
    return Comparison(delta, se, df, delta - half, delta + half, n, is_paired)


def paired(a: list[float], b: list[float]) -> Comparison:
    """a and b aligned (a[i] and b[i] from the same seed): d_i = a_i - b_i, Δ = mean(d),
    SE = sd(d) / sqrt(n) (sd with n - 1), df = n - 1, CI = Δ ± t_{0.975, df} SE."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired needs two equal, non-empty lists, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    se = statistics.stdev(d) / math.sqrt(n) if n > 1 else None
    return _interval(statistics.mean(d), se, n - 1 if n > 1 else None, n, True)


def welch(a: list[float], b: list[float]) -> Comparison:
    """Independent samples: Δ = mean(a) - mean(b), SE = sqrt(va/na + vb/nb) (sample variances,
    n - 1), df = (va/na + vb/nb)^2 / ((va/na)^2 / (na - 1) + (vb/nb)^2 / (nb - 1))
    (Welch-Satterthwaite; na + nb - 2 where both variances are 0), CI = Δ ± t_{0.975, df} SE."""
    if not a or not b:
        raise ValueError(f"welch needs two non-empty lists, got {len(a)} and {len(b)}")
    na, nb = len(a), len(b)
    delta = statistics.mean(a) - statistics.mean(b)
    if na < 2 or nb < 2:
        return _interval(delta, None, None, na + nb, False)
    qa, qb = statistics.variance(a) / na, statistics.variance(b) / nb
    se = math.sqrt(qa + qb)
    df = ((qa + qb) ** 2 / (qa ** 2 / (na - 1) + qb ** 2 / (nb - 1)) if qa + qb > 0
          else float(na + nb - 2))
    return _interval(delta, se, df, na + nb, False)


# ---- tests of a claim, and Holm's adjustment over a family of them ----------------------------

def p_value(c: Comparison, null: float = 0.0) -> float | None:
    """The two-sided p-value of H0: Δ = null from a Comparison, p = 2 (1 - F_df(|Δ - null| / SE))
    with F_df the Student-t cdf (t_cdf), so p < 0.05 exactly where the 95% CI excludes null; SE
    = 0: 0 where Δ != null, else 1; None where SE is undefined (fewer than 2 values)."""
    if c.se is None:
        return None
    if c.se == 0:
        return 0.0 if c.delta != null else 1.0
    return min(1.0, 2 * (1 - t_cdf(abs(c.delta - null) / c.se, c.df)))


def holm(ps: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the family ps (None: not in the family, stays None):
    with the m p-values sorted p_(1) <= ... <= p_(m),
        p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)),
    so rejecting where p~ < alpha keeps the family-wise error rate at alpha (Holm 1979)."""
    family = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out: list[float | None] = [None] * len(ps)
    running, m = 0.0, len(family)
    for j, (p, i) in enumerate(family):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out
