"""The statistics bench/compare.py and bench/experiments.py both report: one definition, imported
by each (so neither imports the other).

    from stats import mean_std     # with bench/ on sys.path, as each bench script runs
"""
import statistics


def mean_std(xs: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with Bessel's n - 1) of xs; the std of one value is 0.0."""
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0
