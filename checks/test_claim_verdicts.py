"""The claims' verdicts as pure functions of their measurements: stand-in measurements below,
across and above each criterion, and with a failed precondition, give each of the three
outcomes; the recorded claim carries the verdict's outcome.

Double quantisation (Table 1 left, §6.2): the update-count ratio N = U_base / U_alg against the
break-even 1/P (P: per-update bits ratio), N resolved to the evaluation grid; an interval that
covers the break-even (a same-evaluation tie of two methods with nearly equal bits per update
among them) is not measurable here.  DistZO2 (Table 1): the CPU-time speed-up's interval against the
paper's smallest ratio, under the achievable bound and the z-generation control."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.experiments import distzo2 as zo
from harness.experiments import double_quant as dq
from harness.experiments.claims import _CLAIMS, NOT_MEASURABLE, NOT_SUPPORTED, SUPPORTED
from harness.reporting import Column, Table
from harness.stats import Interval


# ---------------------------------------------------------------------------- double quantisation
def reach(updates: int, per_update: float, every: int) -> dq.Reach:
    """A run crossing at evaluation ``updates`` (the one before at ``updates - every``), its bits
    growing ``per_update`` a master update."""
    return dq.Reach(updates, updates * per_update, updates - every, (updates - every) * per_update, per_update)


draws = dict(e=st.integers(1, 20), ua=st.integers(2, 300), wa=st.floats(1.0, 1e7), p=st.floats(0.1, 10.0))


def pair(ua: int, ub: int, e: int, wa: float, p: float) -> dq.Verdict:
    """alg crosses at evaluation ua·e with ``wa`` bits an update, base at ub·e with p·wa."""
    return dq.pair_verdict(reach(ua * e, wa, e), reach(ub * e, p * wa, e), ("alg", "base"))


@given(**draws)
@settings(max_examples=200, deadline=None)
def test_dq_pair_above_the_break_even_is_supported(e, ua, wa, p):
    ub = max(math.floor(ua / p) + 2, ua + 1)  # N's low end (ub - 1) / ua lies above 1/p
    v = pair(ua, ub, e, wa, p)
    assert v.precondition.held and v.outcome == SUPPORTED, v


@given(**draws)
@settings(max_examples=200, deadline=None)
def test_dq_pair_below_the_break_even_is_not_supported(e, ua, wa, p):
    ub = math.ceil((ua - 1) / p) - 1  # N's high end ub / (ua - 1) lies below 1/p
    ub = ua - 1 if ub == ua else ub
    if ub < 1 or (ua - 1) / p - ub < 1e-6:
        return
    v = pair(ua, ub, e, wa, p)
    assert v.precondition.held and v.outcome == NOT_SUPPORTED, v


@given(**draws)
@settings(max_examples=200, deadline=None)
def test_dq_pair_across_the_break_even_is_not_measurable(e, ua, wa, p):
    ub = math.floor(ua / p) + 1  # N's interval [(ub - 1)/ua, ub/(ua - 1)] holds 1/p
    if ub == ua or abs(ua / p - round(ua / p)) < 1e-6:
        return
    v = pair(ua, ub, e, wa, p)
    assert not v.precondition.held and v.holds is None and v.outcome == NOT_MEASURABLE, v
    assert "excludes the break-even" in v.precondition.condition


@given(**draws)
@settings(max_examples=200, deadline=None)
def test_dq_pair_crossing_at_the_same_evaluation_is_decided_by_the_resolution(e, ua, wa, p):
    v = pair(ua, ua, e, wa, p)  # N in [(ua-1)/ua, ua/(ua-1)]: quantising cost no updates
    lo, hi = (ua - 1) / ua, ua / (ua - 1)
    if min(abs(lo - 1 / p), abs(hi - 1 / p)) < 1e-9:
        return
    expected = SUPPORTED if lo > 1 / p else NOT_SUPPORTED if hi < 1 / p else NOT_MEASURABLE
    assert v.outcome == expected and v.precondition.held == (expected != NOT_MEASURABLE), v


def test_dq_pair_when_one_or_both_never_reach():
    never = dq.Reach(None, 5e6, width=10.0)
    got = reach(100, 10.0, 10)
    assert dq.pair_verdict(never, got).outcome == NOT_SUPPORTED
    assert dq.pair_verdict(never, never).outcome == NOT_MEASURABLE
    assert dq.pair_verdict(got, never).outcome == SUPPORTED  # lower bound 5e6 / 1e3 > 1
    assert dq.pair_verdict(got, dq.Reach(None, 500.0, width=10.0)).outcome == NOT_MEASURABLE  # bound 0.5


def test_dq_pair_prints_the_width_only_ratio_beside_the_measured_one():
    v = dq.pair_verdict(reach(100, 12.0, 10), reach(200, 64.0, 10))
    assert "width only 5.33x" in v.ours and v.value == pytest.approx(200 * 64 / (100 * 12))


@given(e=draws["e"], ua=draws["ua"], wa=draws["wa"], p=draws["p"],
       regime=st.sampled_from(["above", "below", "same"]))
@settings(max_examples=100, deadline=None)
def test_dq_fewest_is_the_pair_verdict_against_the_runner_up(e, ua, wa, p, regime):
    ub = {"above": max(math.floor(ua / p) + 2, ua + 1), "same": ua,
          "below": max(1, math.ceil((ua - 1) / p) - 1)}[regime]
    if regime == "below" and (ub == ua or (ua - 1) / p - ub < 1e-6):
        return
    runner = reach(ub * e, p * wa, e)
    far = dq.Reach(runner.updates + e, runner.bits * 3, runner.updates, runner.bits * 2, 1.0)
    reaches = {"acc-asylpg": reach(ua * e, wa, e), "asylpg": runner, "asyfpg": far,
               "qsvrg": dq.Reach(None, 1.0, width=1.0)}
    v = dq.fewest_verdict("acc-asylpg", reaches)
    lo, hi = (ub - 1) / ua, ub / (ua - 1)
    if regime == "same" and min(abs(lo - 1 / p), abs(hi - 1 / p)) < 1e-9:
        return
    expected = {"above": SUPPORTED, "below": NOT_SUPPORTED,
                "same": SUPPORTED if lo > 1 / p else NOT_SUPPORTED if hi < 1 / p else NOT_MEASURABLE}[regime]
    assert v.outcome == expected and "vs asylpg" in v.ours, v


def test_dq_claims_record_the_verdicts():
    cfg = {**dq.settings("tiny"), "threshold": 0.1}
    sup, tie, unres = reach(100, 12.0, 10), reach(100, 64.0, 10), reach(50, 24.0, 10)
    paper = {"asyfpg": reach(200, 64.0, 10), "acc-asyfpg": tie, "qsvrg": unres, "asylpg": sup,
             "sparse-asylpg": reach(100, 11.0, 10), "acc-asylpg": reach(100, 12.0, 10),
             "qsgd": dq.Reach(None, 1.0, width=1.0)}
    extended = {**paper, "asylpg": reach(300, 12.0, 10)}
    _CLAIMS.clear()
    try:
        dq._claims({"paper": paper, "extended": extended}, cfg)
        got = {c.id: c for c in _CLAIMS}
        for _words, alg, base in dq.PAIRS:
            v = dq.pair_verdict(paper[alg], paper[base], (alg, base))
            assert got[f"double-quant.{alg}-vs-{base}"].outcome == v.outcome
        assert got["double-quant.asylpg-vs-asyfpg"].outcome == SUPPORTED
        # same evaluation, break-even 0.19 far below N's resolution [0.9, 1.11]: quantising cost no updates
        assert got["double-quant.acc-asylpg-vs-acc-asyfpg"].outcome == SUPPORTED
        assert got["double-quant.asylpg-vs-qsvrg"].outcome == NOT_MEASURABLE  # N's interval covers 1/P
        fewest = got["double-quant.acc-asylpg-fewest"]  # ties sparse at nearly equal bits per update
        assert fewest.outcome == NOT_MEASURABLE and fewest.precondition is not None
        # the extended grid is said only where it flips an outcome
        flipped = got["double-quant.sparse-asylpg-vs-asylpg"]
        assert "extended lrs" in flipped.how
        assert "extended lrs" in got["double-quant.asylpg-vs-qsvrg"].how  # not measurable -> not supported
        assert "extended lrs" not in got["double-quant.asylpg-vs-asyfpg"].how  # supported on both
    finally:
        _CLAIMS.clear()


# ---------------------------------------------------------------------------- DistZO2
def iv(value: float, lo: float, hi: float) -> Interval:
    return Interval(value, lo, hi)


crit_draw = st.floats(1.1, 3.0)
gap = st.floats(0.01, 1.0)


@given(c=st.floats(1.1, 1.8), d=st.floats(0.01, 0.1), w=st.floats(0.01, 0.5))
@settings(max_examples=200, deadline=None)
def test_zo_speedup_three_outcomes(c, d, w):
    bound = iv(c + 0.5, c + 0.2, c + 1.0)  # criteria below 2 - 0.1: "above" stays within the 2 ranks' split
    above = zo.speedup_verdict(iv(c + d + w, c + d, c + d + 2 * w), c, bound, 1.0)
    below = zo.speedup_verdict(iv(c - d - w, c - d - 2 * w, c - d), c, bound, 1.0)
    across = zo.speedup_verdict(iv(c, c - d, c + w), c, bound, 1.0)
    assert above.precondition.held and above.outcome == SUPPORTED
    assert below.precondition.held and below.outcome == NOT_SUPPORTED
    assert across.precondition.held and across.outcome == NOT_MEASURABLE and "within noise" in across.how


@given(c=crit_draw, d=gap, short=st.floats(0.01, 0.5), control=st.one_of(st.floats(0.1, 0.79), st.floats(1.26, 5.0)))
@settings(max_examples=200, deadline=None)
def test_zo_speedup_failed_precondition_is_not_measurable(c, d, short, control):
    above = iv(c + d + 0.1, c + d, c + d + 0.2)
    capped = zo.speedup_verdict(above, c, iv(c - short - 0.1, c - short - 0.2, c - short), 1.0)
    noisy = zo.speedup_verdict(above, c, iv(c + 0.5, c + 0.2, c + 1.0), control)
    # superlinear: the interval lies above the 2 ranks the work splits over (caches, not the mechanism)
    superlinear = zo.speedup_verdict(iv(2 + d + 0.1, 2 + d, 2 + d + 0.2), c, iv(c + 0.5, c + 0.2, c + 1.0), 1.0)
    for v in (capped, noisy, superlinear):
        assert not v.precondition.held and v.outcome == NOT_MEASURABLE, v


@pytest.mark.parametrize("cpu, bound, control, expected", [
    ((2.0, 1.9, 2.1), (1.95, 1.9, 2.0), 1.0, SUPPORTED),
    ((1.5, 1.4, 1.6), (1.95, 1.9, 2.0), 1.0, NOT_SUPPORTED),
    ((1.8, 1.6, 1.95), (1.95, 1.9, 2.0), 1.0, NOT_MEASURABLE),
    ((2.0, 1.9, 2.1), (1.6, 1.55, 1.65), 1.0, NOT_MEASURABLE),
    ((2.0, 1.9, 2.1), (1.95, 1.9, 2.0), 1.5, NOT_MEASURABLE),
    ((2.6, 2.4, 2.8), (1.95, 1.9, 2.0), 1.0, NOT_MEASURABLE),
])
def test_zo_claims_record_the_verdicts(cpu, bound, control, expected):
    cols = ["method", "speedup_cpu", "speedup", "bound", "ratio", "control"]
    row = dict(method="PertP", speedup_cpu=iv(*cpu), speedup=iv(1.0, 0.9, 1.1), bound=iv(*bound),
               ratio=iv(1.0, 0.9, 1.1), control=control)
    t = Table("t", [Column(k, k, spread=None if k in ("method", "control") else "CI") for k in cols],
              [row, {**row, "method": "DDP"}])
    _CLAIMS.clear()
    try:
        zo._claims(t, "setting")
        pertp = next(c for c in _CLAIMS if c.id == "distzo2.pertp-speedup")
        v = zo.speedup_verdict(iv(*cpu), 1.84, iv(*bound), control)
        assert pertp.outcome == v.outcome == expected
        assert "CPU time" in pertp.criterion and "wall-clock" in pertp.how
    finally:
        _CLAIMS.clear()
