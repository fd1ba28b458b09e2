"""The spread of measured times: a value with its interval, quantiles, median and IQR, and a
seeded percentile bootstrap (of a ratio of medians, or of any statistic of independent series).

Every time a table or a claim shows is a value over repeats (steps, runs), never one number
alone ("timings with their spread"); this module is the one place the
interval is computed, :func:`harness.reporting.units.format_interval` the one place it is shown.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

IQR = "median [interquartile range]"
CI95 = "[95 % percentile-bootstrap interval]"
RANGE = "median [min, max]"


@dataclass(frozen=True)
class Interval:
    """A measured ``value`` and the interval ``[lo, hi]`` around it (what the interval is, IQR or
    a bootstrap CI, is said by whoever shows it: a table column's ``spread``)."""

    value: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        for name in ("value", "lo", "hi"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"interval {name} must be a finite number, not {v!r}")
        if self.lo > self.hi:
            raise ValueError(f"interval [{self.lo!r}, {self.hi!r}] has lo > hi")

    def covers(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def scaled(self, k: float) -> Interval:
        """``k`` times the value and the interval (a count of steps times a step time)."""
        a, b = k * self.lo, k * self.hi
        return Interval(k * self.value, min(a, b), max(a, b))

    def reciprocal(self, k: float = 1.0) -> Interval:
        """``k / x`` of a positive interval (a throughput from step times): the bounds swap."""
        if self.lo <= 0:
            raise ValueError(f"reciprocal of an interval reaching {self.lo!r} <= 0")
        return Interval(k / self.value, k / self.hi, k / self.lo)


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median_iqr(xs: Sequence[float]) -> Interval:
    """Median and interquartile range of ``xs`` (step times of a run, pooled over repeats)."""
    return Interval(statistics.median(xs), quantile(xs, 0.25), quantile(xs, 0.75))


def median_range(xs: Sequence[float]) -> Interval:
    """Median and [min, max]: the spread of a handful of repeats, too few for quartiles."""
    return Interval(statistics.median(xs), min(xs), max(xs))


def bootstrap(stat: Callable[..., float], *samples: Sequence[float], draws: int = 2000,
              level: float = 0.95, seed: int = 0) -> Interval:
    """``stat(*samples)`` with a percentile bootstrap interval, every sample resampled
    independently with replacement.  Seeded: the same samples give the same interval."""
    if any(len(s) == 0 for s in samples):
        raise ValueError("bootstrap of an empty sample")
    rng = random.Random(seed)
    boots = [stat(*[rng.choices(s, k=len(s)) for s in samples]) for _ in range(draws)]
    point = stat(*samples)
    return Interval(point, quantile(boots, (1 - level) / 2), quantile(boots, (1 + level) / 2))


def ratio_of_medians(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]], *, draws: int = 2000,
                     level: float = 0.95, seed: int = 0) -> Interval:
    """Median over repeats ``r`` of ``median(num[r]) / median(den[r])`` (a speed-up from step
    times: ``num`` the baseline's, ``den`` the method's), with a percentile bootstrap interval that
    resamples the repeats, then the steps within every run drawn.

    Repeats are separate launches, and a machine drifts between launches (clock, core placement,
    load) by more than the steps of one run vary; resampling only the steps would leave that drift
    out of the interval.  A repeat's two runs are drawn together: they ran back to back, on the
    same state of the machine.  One repeat each: a plain ratio of medians, the steps resampled."""
    if len(num) != len(den) or not num:
        raise ValueError(f"ratio of medians needs as many repeats on both sides, not {len(num)} and {len(den)}")
    if any(len(s) == 0 for s in (*num, *den)):
        raise ValueError("bootstrap of an empty sample")
    k = len(num)

    def ratio(a: Sequence[float], b: Sequence[float]) -> float:
        return statistics.median(a) / statistics.median(b)

    rng = random.Random(seed)
    boots = []
    for _ in range(draws):
        picks = range(k) if k == 1 else rng.choices(range(k), k=k)
        boots.append(statistics.median(ratio(rng.choices(num[r], k=len(num[r])), rng.choices(den[r], k=len(den[r])))
                                       for r in picks))
    point = statistics.median(ratio(a, b) for a, b in zip(num, den, strict=True))
    return Interval(point, quantile(boots, (1 - level) / 2), quantile(boots, (1 + level) / 2))
