"""Clapping's claim verdicts as pure functions of their measurements (no run, no torch), so that
``checks/test_clapping_verdicts.py`` can drive each one below, across and above its criterion
and with a failed precondition.

The language-model rows (§5, Table 3) are decided on the **validation loss**, paired by seed
(95 % t interval of the per-seed difference); accuracy is shown beside it only.  Every
comparison needs its precondition: the no-compression reference has settled and every compared
run finished with a finite loss; otherwise the row is "not measurable here"."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .claims import NOT_MEASURABLE, NOT_SUPPORTED, SUPPORTED, Precondition, mean_interval

SETTLE_PCT = 0.5  # the reference may move at most this much (relative, %) over the last quarter
GAP_PCT = 0.5  # §5: "Clapping-FC achieves 95% communication saving with less than 0.5% error"


@dataclass(frozen=True)
class Verdict:
    """A claim's outcome and the number behind it (mean and 95 % interval over seeds)."""

    outcome: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    holds: bool | None = None  # the criterion alone, before the precondition


def outcome(holds: bool | None, pre: Precondition | None) -> str:
    """A failed precondition is "not measurable here" whatever the criterion says."""
    if pre is not None and not pre.held:
        return NOT_MEASURABLE
    return {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds]


def _side(lo: float, hi: float, threshold: float) -> bool | None:
    """True: the interval lies above ``threshold``; False: below; None: it covers it (or NaN)."""
    return True if lo > threshold else False if hi < threshold else None


# --------------------------------------------------------------------------- preconditions
def last_quarter_change(curve: list[float]) -> float:
    """Relative change (%) of a validation curve (points evenly spaced, the last at the end of
    training) over its last quarter: |v(T) - v(3T/4)| / v(T)."""
    if len(curve) < 4 or len(curve) % 4:
        raise ValueError(f"a settling curve needs a multiple of 4 points, got {len(curve)}")
    end, before = curve[-1], curve[-1 - len(curve) // 4]
    return 100 * abs(end - before) / abs(end)


def settled(curves: list[list[float]], label: str = "no compression",
            pct: float = SETTLE_PCT) -> Precondition:
    """The reference's validation loss has settled: on every seed it moved less than ``pct`` %
    over the last quarter of fine-tuning (the resolution the 0.5 % claim needs)."""
    changes = [last_quarter_change(c) for c in curves]
    worst = max((c if math.isfinite(c) else math.inf for c in changes), default=math.inf)
    return Precondition(f"{label} val loss settled: relative change over the last quarter of "
                        f"fine-tuning < {pct:g} % on every seed",
                        f"{worst:.3f} % on the worst seed" if math.isfinite(worst) else "a diverged (NaN) curve",
                        bool(worst < pct))


def finite(losses: dict[str, list[float]]) -> Precondition:
    """Every compared run finished with a finite validation loss (none diverged)."""
    bad = [f"{k} seed {i}" for k, v in losses.items() for i, x in enumerate(v) if not math.isfinite(x)]
    return Precondition("every compared run ends with a finite val loss",
                        "diverged: " + ", ".join(bad) if bad else "all finite", not bad)


def both(a: Precondition, b: Precondition) -> Precondition:
    return Precondition(f"{a.condition}; {b.condition}", f"{a.measured}; {b.measured}", a.held and b.held)


# --------------------------------------------------------------------------- Table 3 rows
def best_fc(fc_losses: dict[str, list[float]]) -> str:
    """The FC setting of lowest mean validation loss (the paper tunes p, §5); NaN ranks last."""
    def mean(v):
        m = sum(v) / len(v)
        return m if math.isfinite(m) else math.inf
    return min(fc_losses, key=lambda k: mean(fc_losses[k]))


def beats(fc: list[float], base: list[float], pre: Precondition | None) -> Verdict:
    """"Clapping outperforms <base>": base val loss - FC val loss, paired by seed, interval above 0."""
    mu, lo, hi = mean_interval([b - f for f, b in zip(fc, base, strict=True)])
    holds = _side(lo, hi, 0.0)
    return Verdict(outcome(holds, pre), mu, lo, hi, holds)


def gap(fc: list[float], none: list[float], pre: Precondition | None, limit: float = GAP_PCT) -> Verdict:
    """"less than 0.5 % error": the relative val-loss gap 100 (FC - none) / none, paired by seed,
    interval below ``limit``; above it: not supported."""
    mu, lo, hi = mean_interval([100 * (f - u) / u for f, u in zip(fc, none, strict=True)])
    side = _side(lo, hi, limit)
    holds = None if side is None else not side
    return Verdict(outcome(holds, pre), mu, lo, hi, holds)


# --------------------------------------------------------------------------- Fig. 5 row
def toy_reference_converges(gap3: float, gap4: float) -> Precondition:
    """Fig. 5's mechanism shows only where the uncompressed run still improves as the step decays."""
    return Precondition("the uncompressed run keeps improving in the last quarter (gap 4/4 < gap 3/4)",
                        f"gap 4/4 / gap 3/4 = {gap4 / gap3:.3f}", bool(gap4 < gap3))


def direct_fails(direct_gap: float, fc_gap: float, pre: Precondition | None) -> Verdict:
    """Fig. 5: direct compression stalls where FC converges: direct's final gap / FC's > 1."""
    rel = direct_gap / fc_gap
    holds = bool(rel > 1)
    return Verdict(outcome(holds, pre), rel, holds=holds)
