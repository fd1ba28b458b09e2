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
    claim("P", '"x is 3x smaller"', "Table 2", "ratio > 3", "3.5x", 1.2, False, "how", unit="x")
    claim("P", '"y is lossless"', "Table 1", "ratio = 1", "1x", 1.0, True, "how", unit="x")
    claim("P", '"z"', "§5", "ratio > 2", "2x", float("nan"), True)  # a missing value cannot support anything
    claim("P", '"w reaches the threshold"', "Table 1", "reaches < 0.1", "7x", "never < 0.1 in 3 epochs", False)
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
        claim("P", "q", "s", "c", "1", None, None)
    with pytest.raises(ValueError, match="outcome"):
        Claim("P", "q", "s", "c", "1", "1", "yes")
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


# ---------------------------------------------------------------------------- timed claims (issue 14)

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
    c = timed_claim("P", "q", "s", "speed-up >= 1", "1", iv, 1.0, "measured")
    _CLAIMS.clear()
    assert c.outcome == NOT_MEASURABLE and c.how.startswith("within noise") and c.how.endswith("measured")
    assert c.ours.startswith("1 [") or c.ours.startswith("1.00 [")


def test_a_timed_claim_is_decided_only_outside_its_interval():
    from harness.experiments.claims import NOT_MEASURABLE, NOT_SUPPORTED, SUPPORTED, timed_claim
    from harness.stats import Interval

    def outcome(lo, hi, thr, **kw):
        c = timed_claim("P", "q", "s", "c", "1", Interval((lo + hi) / 2, lo, hi), thr, "m", **kw)
        _CLAIMS.clear()
        return c.outcome

    assert outcome(1.1, 1.3, 1.0) == SUPPORTED and outcome(0.7, 0.9, 1.0) == NOT_SUPPORTED
    assert outcome(0.9, 1.1, 1.0) == NOT_MEASURABLE and outcome(1.0, 1.2, 1.0) == NOT_MEASURABLE
    assert outcome(0.7, 0.9, 1.0, above=False) == SUPPORTED
    assert outcome(1.1, 1.3, 1.0, undecided="load 9 on 2 cores") == NOT_MEASURABLE
    # the record itself refuses a verdict its interval does not carry
    with pytest.raises(ValueError, match="covers the criterion 1: within noise"):
        Claim("P", "q", "s", "c", "1", "1", "supported", interval=Interval(1.0, 0.9, 1.1), threshold=1.0)
    with pytest.raises(ValueError, match="both its interval and its threshold"):
        Claim("P", "q", "s", "c", "1", "1", "supported", interval=Interval(1.0, 0.9, 1.1))


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
