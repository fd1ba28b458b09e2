"""SparQ's claims verdicts (``harness.experiments.sparq_verdicts``) on stand-in measurements:
below, at and above each criterion, and with a failed precondition, each of the three outcomes;
and the claims row built from a verdict carries the same outcome."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.experiments import sparq_verdicts as V
from harness.experiments.claims import _CLAIMS, NOT_MEASURABLE, NOT_SUPPORTED, SUPPORTED, claim

SIDE = st.sampled_from(["below", "at", "above"])
BYTES = st.floats(1e3, 1e10)
FRACTION = st.floats(0.01, 0.99)


def _around(threshold: float, side: str, gap: float) -> float:
    """A value below, at or above ``threshold`` by the relative ``gap``."""
    return {"below": threshold * (1 - gap), "at": threshold, "above": threshold * (1 + gap)}[side]


def _row(v: V.Verdict) -> str:
    """The outcome of the claims row built from ``v`` (what reproduce prints)."""
    c = claim("t.verdict", "T", "q", "s", "c", "p", v.value, v.holds, "how", precondition=v.precondition)
    _CLAIMS.remove(c)
    return c.outcome


# ---------------------------------------------------------------- SparQ / uncompressed ZO pipeline
@given(zo=BYTES, side=SIDE, gap=st.floats(0.01, 0.5), kind=st.sampled_from(sorted(V.FIG2_NNZ_LIMIT)),
       nnz_frac=FRACTION)
def test_comm_vs_zo_pipeline_is_decided_only_on_sparse_activations(zo, side, gap, kind, nnz_frac):
    paper = 0.20
    sq = _around(paper, side, gap) * zo
    limit = V.FIG2_NNZ_LIMIT[kind]
    v = V.comm_vs_zo_pipeline(sq, zo, limit * nnz_frac, kind, 4, paper)
    assert v.value == pytest.approx(sq / zo)
    expected = NOT_SUPPORTED if side == "above" else SUPPORTED  # criterion: ratio <= the paper's
    if side == "at":
        expected = SUPPORTED if sq / zo <= paper else NOT_SUPPORTED  # float rounding at the boundary
    assert v.outcome == _row(v) == expected
    dense = V.comm_vs_zo_pipeline(sq, zo, limit / nnz_frac, kind, 4, paper)  # as dense as random init
    assert dense.outcome == _row(dense) == NOT_MEASURABLE
    assert not dense.precondition.held and f"{limit:.0%}" in dense.precondition.condition


def test_comm_vs_zo_pipeline_without_a_measured_sparsity_is_not_measurable():
    v = V.comm_vs_zo_pipeline(1.0, 10.0, None, "relu", 4, 0.2)
    assert v.outcome == NOT_MEASURABLE and v.precondition.measured == "not measured"


def test_fig2_limits_follow_the_activation():
    assert V.activation_kind("relu", "opt") == "relu"
    assert V.activation_kind("gelu_new", "gpt2") == V.activation_kind("gelu", "bert") == "gelu"
    assert V.activation_kind("silu", "llama") == "swiglu"
    assert V.FIG2_NNZ_LIMIT == {"relu": 0.05, "gelu": 0.05, "swiglu": 0.20}


# ---------------------------------------------------------------- whole-run savings vs FO / AQ-SGD
@given(side=SIDE, gap=st.floats(0.01, 0.4), base=st.sampled_from(["fo", "aq"]))
def test_whole_run_saving_needs_known_step_counts(side, gap, base):
    thr = V.COMM_SAVING[base]
    saved = _around(thr, side, gap)
    known = V.whole_run_saving(saved, thr, steps_known=True)
    assert known.outcome == _row(known) == (SUPPORTED if side == "above" else NOT_SUPPORTED)  # strictly more
    unknown = V.whole_run_saving(saved, thr)
    assert unknown.outcome == _row(unknown) == NOT_MEASURABLE  # never "not supported" on per-step bytes
    assert unknown.value == saved and "unstated" in unknown.precondition.measured


# ---------------------------------------------------------------- memory vs FO-SGD (30 ~ 70 %)
@given(fo=BYTES, side=SIDE, gap=st.floats(0.01, 0.5))
def test_memory_saving_vs_fo(fo, side, gap):
    saved = _around(V.MEM_SAVING_VS_FO, side, gap)
    v = V.memory_saving_vs_fo(fo, fo * (1 - saved))
    expected = {"below": NOT_SUPPORTED, "above": SUPPORTED}.get(side)
    if side == "at":  # ">= 30 %", up to the rounding of fo * (1 - saved)
        expected = SUPPORTED if v.value >= V.MEM_SAVING_VS_FO else NOT_SUPPORTED
    assert v.outcome == _row(v) == expected
    missing = V.memory_saving_vs_fo(fo, None)
    assert missing.outcome == _row(missing) == NOT_MEASURABLE


# ---------------------------------------------------------------- AQ-SGD with its storage (> 3x)
@given(sq=BYTES, gpu=st.floats(0.5, 2.0), per_sample=st.floats(1e2, 1e6), side=SIDE,
       gap=st.floats(0.01, 0.5))
def test_memory_vs_aq_and_its_flip_point(sq, gpu, per_sample, side, gap):
    aq, buffers = gpu * sq, 0.1 * gpu * sq  # AQ-SGD's GPU peak, its run's buffers inside it
    n_star = V.aq_flip_n(aq, buffers, per_sample, sq)
    assert n_star > 0  # (0.9 x gpu) < 3: N decides
    assert V.aq_memory_ratio(aq, buffers, per_sample, n_star, sq) == pytest.approx(V.MEM_RATIO)
    n = max(1, round(_around(n_star, side, gap)))
    v = V.memory_vs_aq(aq, buffers, per_sample, n, "stand-in", sq)
    expected = {"below": NOT_SUPPORTED, "above": SUPPORTED}.get(side)
    if side == "at":  # "> 3", at N* up to rounding N to a whole sample
        expected = SUPPORTED if v.value > V.MEM_RATIO else NOT_SUPPORTED
    elif abs(n - n_star) < 1:  # a tiny N* rounds onto itself
        expected = SUPPORTED if v.value > V.MEM_RATIO else NOT_SUPPORTED
    assert v.outcome == _row(v) == expected
    for no_n in (None, 0):
        unknown = V.memory_vs_aq(aq, buffers, per_sample, no_n, "a stream", sq)
        assert unknown.outcome == _row(unknown) == NOT_MEASURABLE and "N" in unknown.precondition.condition
    unmeasured = V.memory_vs_aq(None, buffers, per_sample, n, "stand-in", sq)
    assert unmeasured.outcome == _row(unmeasured) == NOT_MEASURABLE


def test_memory_vs_aq_flip_point_is_zero_when_any_n_holds():
    assert V.aq_flip_n(aq_total=10.0, aq_window_buffers=1.0, per_sample=1.0, sparq_total=1.0) == 0.0
    assert V.aq_flip_n(10.0, 1.0, 0.0, 1.0) is None  # no per-sample buffers: no N flips it


# ---------------------------------------------------------------- App. B.2: FO > 3x ZO at >= 1.3B
@given(sq=BYTES, side=SIDE, gap=st.floats(0.01, 0.5), params=st.integers(1, 10**12))
def test_fo_vs_zo_memory_needs_a_billion_scale_model(sq, side, gap, params):
    fo = _around(V.MEM_RATIO, side, gap) * sq
    v = V.fo_vs_zo_memory(fo, sq, params)
    if params < V.B2_MIN_PARAMS:
        assert v.outcome == _row(v) == NOT_MEASURABLE
        return
    expected = {"below": NOT_SUPPORTED, "above": SUPPORTED}.get(side)
    if side == "at":
        expected = SUPPORTED if v.value > V.MEM_RATIO else NOT_SUPPORTED
    assert v.outcome == _row(v) == expected


def test_fo_vs_zo_memory_at_the_scales_here_and_in_appendix_b2():
    assert V.fo_vs_zo_memory(4.0, 1.0, 1_300_000_000).outcome == SUPPORTED  # OPT-1.3B
    assert V.fo_vs_zo_memory(2.0, 1.0, 1_300_000_000).outcome == NOT_SUPPORTED
    small = V.fo_vs_zo_memory(4.0, 1.0, 125_000_000)  # OPT-125M: Table 2's 2.0x, not B.2's regime
    assert small.outcome == NOT_MEASURABLE and small.precondition.measured == "125M parameters"


# ---------------------------------------------------------------- accuracy vs the ZO pipeline
@given(start=st.floats(0.3, 0.9), moved=st.booleans(), gap_pts=st.floats(0.5, 10.0), side=SIDE)
def test_accuracy_vs_zo_is_decided_only_once_zo_moved_accuracy(start, moved, gap_pts, side):
    n = 512
    se = (start * (1 - start) / n) ** 0.5
    zo = start + (3 * se if moved else 1.5 * se) if start < 0.8 else start - (3 * se if moved else 1.5 * se)
    tol = 2 * (2 * zo * (1 - zo) / n) ** 0.5  # 2 standard errors of a difference of two accuracies
    edge = V.ACC_VS_ZO_WORST - tol
    diff = {"below": edge - gap_pts / 100, "at": edge, "above": edge + gap_pts / 100}[side]
    v = V.accuracy_vs_zo(zo + diff, zo, start, n)
    assert v.value == pytest.approx(diff)
    assert v.precondition.held is moved
    if not moved:
        assert _row(v) == NOT_MEASURABLE
    elif side == "below":
        assert _row(v) == NOT_SUPPORTED
    elif side == "above":
        assert _row(v) == SUPPORTED


def test_accuracy_vs_zo_without_labels_is_not_measurable():
    v = V.accuracy_vs_zo(None, None, None, 512)
    assert v.value is None and not v.precondition.held and _row(v) == NOT_MEASURABLE
    # a hand-worked case: start 0.5 at 512 rows, 2 SE = 0.0442; ZO at 0.60 moved; SparQ 0.55 is
    # 5 points below, beyond -0.9 - 2 * sqrt(2 * 0.6 * 0.4 / 512) * 100 = -6.0 points: supported
    v = V.accuracy_vs_zo(0.55, 0.60, 0.5, 512)
    assert v.precondition.held and v.holds is True
    assert V.accuracy_vs_zo(0.52, 0.60, 0.5, 512).holds is False
