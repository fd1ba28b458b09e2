"""The spread a benchmark prints with its ratios (``benchmarks.spread``)."""

from __future__ import annotations

import math

from benchmarks.spread import MEDIAN_INTERVAL_MIN, median_interval


def test_median_interval_covers_the_median_95_percent_of_the_time_by_the_binomial_law():
    # n values 1..n, so the interval's ends are its ranks; the true median lies between the
    # lo-th and hi-th order statistics exactly when lo <= B < hi, B ~ Binomial(n, 1/2) the count
    # of values below it (the closed form, written here)
    for n in [*range(MEDIAN_INTERVAL_MIN, 400), 1000, 2999]:
        lo, hi = (int(float(x)) for x in median_interval(range(1, n + 1), digits=0).strip("[]").split(","))
        coverage = sum(math.comb(n, b) for b in range(lo, hi)) / 2**n
        assert 0.945 <= coverage <= 0.98, (n, lo, hi, coverage)
    assert "fewer than" in median_interval([1.0] * (MEDIAN_INTERVAL_MIN - 1))
