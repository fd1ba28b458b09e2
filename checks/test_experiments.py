"""`commbench reproduce`: experiments are registered, and the claims summary
places each paper's value beside ours with a verdict."""

from __future__ import annotations

import re

import pytest

from harness.experiments import ORDER, Claim, all_experiments, claim, claims_table, get_experiment
from harness.experiments.claims import _CLAIMS
from harness.experiments.runner import _write_tables
from harness.reporting import render


def test_every_paper_has_an_experiment():
    for name in ("foundation", "sparq", "distzo2", "clapping", "protocol", "double-quant"):
        assert get_experiment(name).name == name
    # `reproduce all` runs the papers' experiments in the explicit ORDER, the bandwidth sweep last
    assert [e.name for e in all_experiments() if e.paper] == list(ORDER)
    assert ORDER[-1] == "bandwidth"


def test_claims_table_is_a_verdict_with_quote_criterion_and_three_outcomes(tmp_path):
    _CLAIMS.clear()
    claim("p.x", "P", '"x is 3x smaller"', "Table 2", "ratio > 3", "3.5x", 1.2, False, "how", unit="x")
    claim("p.y", "P", '"y is lossless"', "Table 1", "ratio = 1", "1x", 1.0, True, "how", unit="x")
    claim("p.z", "P", '"z"', "§5", "ratio > 2", "2x", float("nan"), True)  # a missing value cannot support anything
    claim("p.w", "P", '"w reaches the threshold"', "Table 1", "reaches < 0.1", "7x", "never < 0.1 in 3 epochs", False)
    table = claims_table(list(_CLAIMS))
    md = render(table, "md")
    for head in ("claim (the paper's words)", "stated for", "criterion", "paper", "ours", "outcome"):
        assert head in md
    rows = table.row_dicts()
    assert [r["outcome"] for r in rows] == ["not supported", "supported", "not measurable here", "not supported"]
    assert rows[0]["ours"] == "1.2x" and rows[2]["ours"] == "—" and rows[2]["how"]  # says why
    assert rows[3]["ours"] == "never < 0.1 in 3 epochs"
    written = _write_tables("claims", [table], tmp_path)
    assert (tmp_path / "claims.md").exists() and (tmp_path / "claims.csv").exists()
    assert written
    assert isinstance(_CLAIMS[0], Claim)
    _CLAIMS.clear()
    with pytest.raises(ValueError, match="must say why"):
        claim("p.q", "P", "q", "s", "c", "1", None, None)
    with pytest.raises(ValueError, match="outcome"):
        Claim("p.q", "P", "q", "s", "c", "1", "1", "yes")
    _CLAIMS.clear()


def test_interval_helpers_against_closed_forms():
    from harness.experiments.claims import (
        mean_interval,
        ratio_interval,
        separation_step,
        timed_verdict,
    )

    # t interval of (1, 2, 3): mean 2, sd 1, half-width 4.303 / sqrt(3)
    mu, lo, hi = mean_interval([1.0, 2.0, 3.0])
    assert mu == 2.0 and hi - mu == pytest.approx(4.303 / 3 ** 0.5)
    # constant series: the bootstrap has nothing to resample, the interval is the point
    assert ratio_interval([2.0] * 9, [4.0] * 9) == (0.5, 0.5, 0.5)
    assert timed_verdict(0.7, 0.9, 0.8)[0] is None and "within noise" in timed_verdict(0.7, 0.9, 0.8)[1]
    assert timed_verdict(0.85, 0.9, 0.8) == (True, "") and timed_verdict(0.6, 0.7, 0.8) == (False, "")
    # two sets of curves equal for 10 steps, then 1.0 apart: apart from step 11 with window 1
    a = [[0.0] * 10 + [1.0 + e] * 10 for e in (0.0, 0.01, -0.01)]
    b = [[0.0 + e] * 10 + [0.0 + e] * 10 for e in (0.0, 0.01, -0.01)]
    assert separation_step(a, b, 1) == 11
    assert separation_step(a, a, 1) is None


def test_all_runs_the_papers_and_each_paper_table_has_a_paper_column():
    from harness.experiments import Experiment, check_paper_tables
    from harness.reporting import Column, Table

    papers = {e.name for e in all_experiments() if e.paper}
    assert {"sparq", "distzo2", "clapping", "protocol", "double-quant"} <= papers
    assert "foundation" not in papers  # the harness reference has no paper to stand beside
    ours = Table("t", [Column("method", "method"), Column("x", "speed-up", "ratio", True)], [["a", 1.0]])
    both = Table("t", [*ours.columns, Column("x_paper", "speed-up (paper)", "ratio", True)], [["a", 1.0, 2.0]])
    exp = Experiment("e", "s", lambda *a: [], paper=True)
    check_paper_tables(exp, [both])
    for bad in ([ours], [both, ours], []):
        with pytest.raises(RuntimeError):
            check_paper_tables(exp, bad)
    check_paper_tables(Experiment("e", "s", lambda *a: [], paper=False), [ours])


def test_bandwidth_sweep_takes_the_papers_numbers_from_the_reference_tables():
    from harness.experiments.bandwidth import RATES, paper_numbers

    speedup, vs_fastest = paper_numbers()
    # Clapping Table 9: 100 MB/s = 800 Mbit/s -> 1.65x, 500 MB/s = 4 Gbit/s -> 1.19x
    assert speedup == {("clapping-fc", "800mbit"): 1.65, ("clapping-fc", "4gbit"): 1.19}
    assert all(rate in RATES for _, rate in speedup)
    assert vs_fastest == {("protocol", "80mbit"): pytest.approx(592.41 / 602.57)}


def _fake_record(peaks: list[int], payload: float, **extra: float):
    """A stand-in result record with known per-rank peak tensor bytes (what the sparq tables and
    claims read from a record), the record-level peak being the max over ranks as the harness has it."""
    from types import SimpleNamespace

    from harness.results.schema import Metric

    def m(v, unit="bytes"):
        return Metric(value=v, unit=unit, higher_is_better=False)

    metrics = {"peak_tensor_bytes": m(max(peaks)), "payload_bytes_per_step": m(payload),
               "peak_memory_bytes": m(10 * max(peaks)), "peak_memory_growth_bytes": m(max(peaks)),
               "final_loss": m(1.0, "nats/token"), "step_time_s": m(1.0, "s"),
               **{k: m(v) for k, v in extra.items()}}
    per_rank = [{"rank": i, "metrics": {"peak_tensor_bytes": m(p), "peak_memory_bytes": m(10 * p)}}
                for i, p in enumerate(peaks)]
    return SimpleNamespace(metrics=metrics, per_rank=per_rank, config={}, history={"step_time_s": [1.0, 1.0]})


def _sparq_recs(sparq_peaks=(100, 500)):
    return {"pipeline-sgd": _fake_record([500, 500], 1000.0),  # sum 1000, max 500
            "aq-sgd": _fake_record([600, 600], 400.0, ef_state_bytes_total=128, ef_state_bytes_rank_max=64),
            "mezo": _fake_record([450], 0.0),  # one process: sum = max
            "zo-pipeline": _fake_record([100, 500], 3000.0),
            "sparq": _fake_record(list(sparq_peaks), 100.0, act_nnz_ratio=0.47)}  # sum 600, max 500


@pytest.mark.parametrize("rows", [None, 512, 64])
def test_sparq_accuracy_claim_counts_the_held_out_rows_its_records_evaluated(rows):
    """The accuracy claim's standard errors are those of the rows the runs evaluated (their config's
    ``heldout_rows``; 512 for a record from before the field).  Start 0.5, ZO 0.60, SparQ 0.52: at
    512 rows ZO moved by 0.10 >= 2 x 0.0221 and SparQ is 8 points below, beyond -0.9 - 4.33 points:
    not supported; at 64 rows 0.10 < 2 x 0.0625, so ZO has not moved: not measurable."""
    from harness.experiments.sparq import Table2Setting, accuracy_claim

    acc = dict(val_accuracy_start=0.5, majority_accuracy=0.5)
    recs = {"zo-pipeline": _fake_record([1], 0.0, val_accuracy=0.60, **acc),
            "sparq": _fake_record([1], 0.0, val_accuracy=0.52, **acc)}
    for r in recs.values():
        r.config = {} if rows is None else {"heldout_rows": rows}
    _CLAIMS.clear()
    c = accuracy_claim(recs, Table2Setting("tiny-opt"), "here")
    _CLAIMS.clear()
    n = rows or 512
    assert f"; {n} fixed validation rows;" in c.how
    assert c.outcome == ("not measurable here" if n == 64 else "not supported")


def test_sparq_memory_claims_use_the_sum_over_nodes():
    """SparQ Table 2's memory is "total peak memory usage on two GPUs": the claims divide the SUM of
    the ranks' peaks; the per-node maximum is only reported beside it.  The numbers are chosen so
    that the two aggregates disagree on the verdict."""
    from harness.experiments.sparq import (
        Table2Setting,
        TrainSet,
        opt125m_rows,
        peak_tensor,
        table2_claims,
    )

    recs = _sparq_recs()
    assert peak_tensor(recs["sparq"]) == (600.0, 500.0) and peak_tensor(recs["mezo"]) == (450.0, 450.0)
    _CLAIMS.clear()
    s = Table2Setting("tiny-opt", steps=1, seq=64, aq_batches=2, aq_epochs=3)  # AQ-SGD: 64 samples
    vs_zo, comm_fo, comm_aq, mem, vs_aq, b2, acc = table2_claims(recs, s, TrainSet(1000, "a stand-in set"))
    assert acc.id == "sparq.accuracy-vs-zo" and acc.outcome == "not measurable here"  # no labels here
    _CLAIMS.clear()
    # 1 - 600/1000 = 40 % saved: supported (the max would give 1 - 500/500 = 0 %: not supported)
    assert mem.ours == "40.0% (1.67x)" and mem.outcome == "supported"
    assert "summed over the nodes" in mem.criterion and "0.0% (1.00x)" in mem.how
    # (1200 - 128 buffers + 128/64 bytes per sample x 1000 samples) / 600 = 3072 / 600
    assert vs_aq.ours == "5.12x" and vs_aq.outcome == "supported"
    assert "3.07x" in vs_aq.how  # the max variant, printed beside it: (600 - 64 + 1 x 1000) / 500
    # N* = (3 x 600 - 1072) / 2 = 364 samples
    assert "N* = 364" in vs_aq.how and "N = 1,000" in vs_aq.how
    # per step, not decided: whole-run totals with unstated step counts
    assert comm_fo.ours == "90.0% per step" and comm_aq.ours == "75.0% per step"
    assert comm_fo.outcome == comm_aq.outcome == "not measurable here"
    assert "unstated" in comm_fo.how
    # 100 / 3000 = 0.033, but the activation is 47 % non-zero: not measurable
    assert vs_zo.ours == "0.033" and vs_zo.outcome == "not measurable here" and "0.47" in vs_zo.how
    assert b2.ours == "1.67x" and b2.outcome == "not measurable here" and "0.0837M parameters" in b2.how
    rows = {r["method"]: r for r in opt125m_rows(recs)}
    assert rows["sparq"]["tensor_sum_vs_fo"] == pytest.approx(0.6)
    assert rows["sparq"]["tensor_max_vs_fo"] == pytest.approx(1.0)
    assert rows["mezo"]["tensor_sum_vs_fo"] == pytest.approx(0.45) and rows["mezo"]["nodes"] == 1
    # the paper's OPT-125M cells, as printed in SparQ Table 2
    assert rows["aq-sgd"]["paper_mem_SST-2"] == "2+11" and rows["sparq"]["paper_mem_vs_fo_SST-2"] == 0.5
    assert rows["sparq"]["paper_comm_vs_fo_RTE"] == pytest.approx(2.6 / 15.7)
    assert rows["sparq"]["paper_mem_vs_fo_WIC"] == pytest.approx(2 / 3)
    assert rows["zo-pipeline"]["paper_comm_SST-2"] == 3.1


def test_sparq_opt125m_is_a_supporting_experiment():
    from harness.experiments import SUPPORTING

    exp = get_experiment("sparq-opt125m")
    assert "sparq-opt125m" in SUPPORTING and "sparq-opt125m" not in ORDER and not exp.paper


# ---------------------------------------------------------------------------- timed claims

def _step_times(seed: int, n: int, scale: float = 0.05):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (scale * torch.exp(0.3 * torch.randn(n, generator=g, dtype=torch.float64))).tolist()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 40))
def test_a_timed_claim_whose_interval_covers_the_criterion_is_not_a_verdict(seed, n):
    """A run timed against itself: the bootstrap interval of the ratio of medians covers 1 (its
    resamples are symmetric about it), so "ratio >= 1" is within noise, never supported."""
    from harness.experiments.claims import NOT_MEASURABLE, timed_claim
    from harness.stats import ratio_of_medians

    times = _step_times(seed, n)
    iv = ratio_of_medians([times], [times], draws=400, seed=seed)
    assert iv.value == 1.0 and iv.covers(1.0)
    c = timed_claim("p.t", "P", "q", "s", "speed-up >= 1", "1", iv, 1.0, "measured")
    _CLAIMS.clear()
    assert c.outcome == NOT_MEASURABLE and c.how.startswith("within noise") and c.how.endswith("measured")
    assert c.ours.startswith("1 [") or c.ours.startswith("1.00 [")


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(2, 3), n=st.integers(1, 20))
def test_the_interval_of_a_ratio_over_repeats_holds_the_drift_between_repeats(seed, k, n):
    """Repeats are separate launches: runs whose steps are all alike but whose levels drift from
    repeat to repeat have an interval from the smallest repeat's ratio to the largest (a draw of
    k repeats out of k <= 3 has the smallest or the largest as its median with probability
    >= 7/27, far beyond the 2.5 % tails), never the one point a bootstrap over steps would give."""
    import random

    from harness.stats import ratio_of_medians

    rng = random.Random(seed)
    levels = [(rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0)) for _ in range(k)]
    iv = ratio_of_medians([[a] * n for a, _ in levels], [[b] * n for _, b in levels], draws=400, seed=seed)
    ratios = [a / b for a, b in levels]
    assert iv.lo == pytest.approx(min(ratios)) and iv.hi == pytest.approx(max(ratios))
    if k == 2:  # a draw of both repeats has their mean as its median half the time: the middle fifth
        mid = ratio_of_medians([[a] * n for a, _ in levels], [[b] * n for _, b in levels], draws=400, seed=seed,
                               level=0.2)
        assert mid.lo == pytest.approx(sum(ratios) / 2) and mid.hi == pytest.approx(sum(ratios) / 2)


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), m=st.integers(1, 30))
def test_the_interval_of_one_repeat_is_the_percentile_bootstrap_of_its_steps(seed, n, m):
    """One repeat each: the steps of both runs resampled, written out here as the textbook
    percentile bootstrap (the same seeded draws), at the default 95 % and the default seed."""
    import random
    import statistics

    from harness.stats import quantile, ratio_of_medians

    num, den = _step_times(seed, n), _step_times(seed + 1, m)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(num, k=n)) / statistics.median(rng.choices(den, k=m))
                   for _ in range(300))
    iv = ratio_of_medians([num], [den], draws=300)
    assert iv.value == statistics.median(num) / statistics.median(den)
    assert (iv.lo, iv.hi) == (quantile(boots, (1 - 0.95) / 2), quantile(boots, (1 + 0.95) / 2))


def test_a_ratio_of_medians_refuses_unpaired_or_empty_runs():
    from harness.stats import ratio_of_medians

    with pytest.raises(ValueError, match="as many repeats on both sides, not 2 and 1"):
        ratio_of_medians([[1.0], [1.0]], [[1.0]])
    with pytest.raises(ValueError, match="as many repeats on both sides, not 0 and 0"):
        ratio_of_medians([], [])
    with pytest.raises(ValueError, match="bootstrap of an empty sample"):
        ratio_of_medians([[1.0], []], [[1.0], [2.0]])


def test_a_timed_claim_is_decided_only_outside_its_interval():
    from harness.experiments.claims import NOT_MEASURABLE, NOT_SUPPORTED, SUPPORTED, timed_claim
    from harness.stats import Interval

    def outcome(lo, hi, thr, **kw):
        c = timed_claim("p.t", "P", "q", "s", "c", "1", Interval((lo + hi) / 2, lo, hi), thr, "m", **kw)
        _CLAIMS.clear()
        return c.outcome

    assert outcome(1.1, 1.3, 1.0) == SUPPORTED and outcome(0.7, 0.9, 1.0) == NOT_SUPPORTED
    assert outcome(0.9, 1.1, 1.0) == NOT_MEASURABLE and outcome(1.0, 1.2, 1.0) == NOT_MEASURABLE
    assert outcome(0.7, 0.9, 1.0, above=False) == SUPPORTED
    assert outcome(1.1, 1.3, 1.0, undecided="load 9 on 2 cores") == NOT_MEASURABLE
    # the record itself refuses a verdict its interval does not carry
    with pytest.raises(ValueError, match="covers the criterion 1: within noise"):
        Claim("p.t", "P", "q", "s", "c", "1", "1", "supported", interval=Interval(1.0, 0.9, 1.1), threshold=1.0)
    with pytest.raises(ValueError, match="both its interval and its threshold"):
        Claim("p.t", "P", "q", "s", "c", "1", "1", "supported", interval=Interval(1.0, 0.9, 1.1))


def test_every_experiment_column_of_a_time_declares_its_spread():
    """A static rule over every experiment module (the supporting ones too, which the terminal-table
    check does not build): a Column whose unit is a time, or whose header names a time, a
    speed-up or a throughput, passes ``spread=`` unless it holds the paper's numbers."""
    import ast
    from pathlib import Path

    import harness.experiments as pkg
    from harness.reporting import is_time_unit

    words = re.compile(r"\btime\b|speed-up|throughput|(?<!\w)s/step|/ epoch|achievable", re.IGNORECASE)

    def text(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) for v in node.values)
        return ""

    found, bare = 0, []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Column"):
                continue
            args = [text(a) for a in node.args[:3]] + [""] * 3
            key, header, unit = args[0], args[1], args[2]
            if "paper" in (key + header).lower():
                continue
            if is_time_unit(unit) or words.search(header):
                found += 1
                if not any(k.arg == "spread" for k in node.keywords):
                    bare.append(f"{path.name}:{node.lineno} {header!r}")
    assert found >= 20 and bare == [], bare
