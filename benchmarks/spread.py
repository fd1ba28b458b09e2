"""How a benchmark prints a ratio's (or a time's) spread: one way, so every table reads alike.

``quartiles`` for per-round values of many interleaved rounds (the middle half: a shared VM's
outliers do not widen it), ``extremes`` for a handful of repeats (all of them shown).
"""

from __future__ import annotations

import statistics


def quartiles(values, digits: int = 3) -> str:
    """``median [first quartile, third quartile]``."""
    q1, m, q3 = statistics.quantiles(list(values), n=4)
    return f"{m:.{digits}f} [{q1:.{digits}f}, {q3:.{digits}f}]"


def extremes(values, digits: int = 3) -> str:
    """``median [min, max]``."""
    v = list(values)
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}, {max(v):.{digits}f}]"
