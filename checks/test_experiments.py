"""`commbench reproduce`: experiments are registered, and the claims summary
places each paper's value beside ours with a verdict."""

from __future__ import annotations

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


def test_claims_table_has_our_column_and_the_papers(tmp_path):
    _CLAIMS.clear()
    claim("P", "x is smaller", "> 3x", 1.2, False, "how")
    claim("P", "y is lossless", "1x", 1.0, True)
    claim("P", "z", "2x", float("nan"), True)  # a missing value cannot support anything
    table = claims_table(list(_CLAIMS))
    md = render(table, "md")
    assert "paper" in md and "ours" in md and "supported here" in md
    assert [row["supported"] for row in table.row_dicts()] == ["no", "yes", "undecided"]
    written = _write_tables("claims", [table], tmp_path)
    assert (tmp_path / "claims.md").exists() and (tmp_path / "claims.csv").exists()
    assert written
    assert isinstance(_CLAIMS[0], Claim)
    _CLAIMS.clear()


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
