"""Protocol Models' claim verdicts as pure functions of their measurements: stand-in measurements
below, across and above each criterion, and with a failed precondition, give each of the three
outcomes; the link rate and the lr schedule they rest on, in closed form."""

from __future__ import annotations

import pytest

from algorithms.pipeline.optim import lr_factor
from harness.experiments.claims import (
    _CLAIMS,
    NOT_MEASURABLE,
    NOT_SUPPORTED,
    SUPPORTED,
    load_guard,
    outcome,
    timed_claim,
)
from harness.experiments.protocol import (
    COMM_BOUND,
    LEARNED,
    NO_DEGRADATION,
    THROUGHPUT,
    no_degradation_verdict,
    paper_ratio_k,
    similarity_rate,
    throughput_verdict,
    wire_ratio,
)
from harness.stats import Interval

LEARNT = [(5.6, 2.5)] * 3  # centralised's (first, final) loss per seed: it learned
IDLE, CORES = (0.5, 0.7), 2
COMM_BOUND_OK = Interval(12.0, 10.0, 14.0)  # shaped / unshaped uncompressed step


def _no_degradation(ratios, start_end=LEARNT) -> str:
    holds, _, pre = no_degradation_verdict(ratios, start_end)
    return outcome(holds, pre)


def test_no_degradation_below_across_and_above_its_criterion():
    assert _no_degradation([0.99, 1.0, 0.995]) == SUPPORTED
    assert _no_degradation([0.98, 1.01, 1.04]) == NOT_MEASURABLE  # the t interval covers 1.01
    assert _no_degradation([1.05, 1.06, 1.07]) == NOT_SUPPORTED


def test_no_degradation_at_its_criterion_edges():
    eps = 1e-4
    assert _no_degradation([NO_DEGRADATION - eps] * 3) == SUPPORTED  # zero spread: the point is the interval
    assert _no_degradation([NO_DEGRADATION + eps] * 3) == NOT_SUPPORTED


def test_no_degradation_is_not_measurable_when_the_reference_did_not_learn():
    flat = [(5.6, 5.6 * (LEARNED + 0.05))] * 3
    for ratios in ([0.99, 1.0, 0.995], [1.05, 1.06, 1.07]):
        holds, _, pre = no_degradation_verdict(ratios, flat)
        assert not pre.held and outcome(holds, pre) == NOT_MEASURABLE
    one_seed_flat = LEARNT[:2] + flat[:1]  # every seed must have learned
    assert _no_degradation([1.05, 1.06, 1.07], one_seed_flat) == NOT_MEASURABLE


def _throughput(ratio, slowdown=COMM_BOUND_OK, load=IDLE, cores=CORES) -> str:
    holds, _, pre = throughput_verdict(ratio, slowdown, load, cores)
    return outcome(holds, pre)


def test_throughput_below_across_and_above_its_criterion():
    assert _throughput(Interval(0.9, 0.85, 0.95)) == SUPPORTED
    assert _throughput(Interval(0.8, 0.75, 0.85)) == NOT_MEASURABLE  # within noise
    assert _throughput(Interval(0.5, 0.45, 0.55)) == NOT_SUPPORTED
    assert _throughput(Interval(THROUGHPUT + 0.01, THROUGHPUT + 0.005, THROUGHPUT + 0.02)) == SUPPORTED
    assert _throughput(Interval(THROUGHPUT - 0.01, THROUGHPUT - 0.02, THROUGHPUT - 0.005)) == NOT_SUPPORTED


def test_throughput_is_not_measurable_unless_communication_bound():
    for ratio in (Interval(0.9, 0.85, 0.95), Interval(0.5, 0.45, 0.55)):
        assert _throughput(ratio, slowdown=Interval(1.1, 1.0, 1.2)) == NOT_MEASURABLE
        # the whole interval must clear the bound
        assert _throughput(ratio, slowdown=Interval(2.5, COMM_BOUND - 0.1, 3.0)) == NOT_MEASURABLE
    assert _throughput(Interval(0.9, 0.85, 0.95), slowdown=Interval(2.5, COMM_BOUND + 0.1, 3.0)) == SUPPORTED


def test_throughput_is_not_measurable_under_load():
    for ratio in (Interval(0.9, 0.85, 0.95), Interval(0.5, 0.45, 0.55)):
        assert _throughput(ratio, load=(CORES, 0.5)) == NOT_MEASURABLE
        assert _throughput(ratio, load=(0.5, CORES + 3.0)) == NOT_MEASURABLE
    assert _throughput(Interval(0.9, 0.85, 0.95), load=(CORES - 0.1, CORES - 0.1)) == SUPPORTED


@pytest.mark.parametrize("ratio,slowdown,load", [
    (Interval(0.9, 0.85, 0.95), COMM_BOUND_OK, IDLE),
    (Interval(0.5, 0.45, 0.55), COMM_BOUND_OK, IDLE),
    (Interval(0.8, 0.75, 0.85), COMM_BOUND_OK, IDLE),
    (Interval(0.9, 0.85, 0.95), Interval(1.1, 1.0, 1.2), IDLE),
    (Interval(0.9, 0.85, 0.95), COMM_BOUND_OK, (5.0, 5.0)),
])
def test_the_recorded_row_has_the_verdicts_outcome(ratio, slowdown, load):
    holds, how, pre = throughput_verdict(ratio, slowdown, load, CORES)
    _CLAIMS.clear()
    try:
        row = timed_claim("p.t", "P", "q", "s", "c", "1", ratio, THROUGHPUT, "how",
                          undecided=load_guard(load, CORES), precondition=pre)
    finally:
        _CLAIMS.clear()
    assert row.outcome == outcome(holds, pre)
    if not pre.held:
        assert row.how.startswith("not measurable here")


def test_similarity_rate_makes_transfer_the_papers_multiple_of_compute():
    step_s, nbytes = 0.1, 1_000_000
    rate = similarity_rate(step_s, nbytes, slowdown=13.0)
    transfer = 8 * nbytes / rate
    assert transfer == pytest.approx(12 * step_s)
    assert (step_s + transfer) / step_s == pytest.approx(13.0)


def test_throughput_claims_k_is_nearest_the_papers_bytes_ratio():
    k = paper_ratio_k("llama-2x128")
    paper = 4096 / 40
    near = abs(wire_ratio("llama-2x128", k) / paper - 1)
    for other in (k - 1, k + 1):
        if other >= 1:
            assert abs(wire_ratio("llama-2x128", other) / paper - 1) >= near - 1e-12


def test_warmup_then_linear_decay():
    steps, warm = 200, 0.02
    f = [lr_factor("warmup-linear", s, steps, warm) for s in range(steps)]
    w = round(warm * steps)
    assert f[:w] == sorted(f[:w]) and f[w - 1] == 1.0  # rises to the peak
    assert all(a > b for a, b in zip(f[w - 1:], f[w:], strict=False))  # then falls every step
    assert 0 < f[-1] < 0.01
    assert all(lr_factor("constant", s, steps, warm) == 1.0 for s in range(steps))
    with pytest.raises(ValueError):
        lr_factor("cosine", 0, steps, warm)
