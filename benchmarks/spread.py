"""How a benchmark prints a ratio's (or a time's) spread: one way, so every table reads alike.

``quartiles`` for per-round values of many interleaved rounds (the middle half: a shared VM's
outliers do not widen it), ``extremes`` for a handful of repeats (all of them shown), and
``median_interval`` for how well many rounds pin their median down: the quartiles say how much
one round varies, not whether a median of 1.02 is above 1.0.
"""

from __future__ import annotations

import math
import statistics

#: Fewer values than this give no interval: the normal approximation of the binomial that
#: ``median_interval`` uses needs a few dozen.
MEDIAN_INTERVAL_MIN = 30


def quartiles(values, digits: int = 3) -> str:
    """``median [first quartile, third quartile]``."""
    q1, m, q3 = statistics.quantiles(list(values), n=4)
    return f"{m:.{digits}f} [{q1:.{digits}f}, {q3:.{digits}f}]"


def extremes(values, digits: int = 3) -> str:
    """``median [min, max]``."""
    v = list(values)
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}, {max(v):.{digits}f}]"


def median_interval(values, digits: int = 3, z: float = 1.96) -> str:
    """The median's 95 % confidence interval, ``[lo, hi]``, distribution-free: order statistics
    ``n/2 -+ z sqrt(n)/2`` of the sorted values (the count of values below the true median is
    Binomial(n, 1/2)).  It assumes the rounds are independent draws; a VM whose speed drifts
    over minutes makes neighbouring rounds alike, so read it as a lower bound on the uncertainty
    (interleaving and per-round ratios are what keep the drift out of a ratio)."""
    v = sorted(values)
    n = len(v)
    if n < MEDIAN_INTERVAL_MIN:
        return f"(fewer than {MEDIAN_INTERVAL_MIN} rounds)"
    half = z * math.sqrt(n) / 2
    lo, hi = math.floor(n / 2 - half), math.ceil(n / 2 + half)  # 1-based ranks
    return f"[{v[lo - 1]:.{digits}f}, {v[hi - 1]:.{digits}f}]"  # both within 1..n from 30 values on
