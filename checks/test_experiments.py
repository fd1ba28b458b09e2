"""`commbench reproduce`: experiments are registered, and the claims summary
places each paper's value beside ours with a verdict."""

from __future__ import annotations

from harness.experiments import _CLAIMS, EXPERIMENTS, Claim, _write_tables, claim, claims_table
from harness.registry import load_all
from harness.tables import render, write_table


def test_every_paper_has_an_experiment():
    load_all()
    for name in ("foundation", "sparq", "distzo2", "clapping", "protocol", "double-quant"):
        assert name in EXPERIMENTS


def test_claims_table_has_our_column_and_the_papers(tmp_path):
    _CLAIMS.clear()
    claim("P", "x is smaller", "> 3x", 1.2, False, "how")
    claim("P", "y is lossless", "1x", 1.0, True)
    claim("P", "z", "2x", float("nan"), True)  # a missing value cannot support anything
    table = claims_table(list(_CLAIMS))
    md = render(table, "md")
    assert "paper" in md and "ours" in md and "supported here" in md
    assert [row[4] for row in table.rows] == ["no", "yes", "undecided"]
    written = _write_tables("claims", [table], tmp_path, write_table)
    assert (tmp_path / "claims.md").exists() and (tmp_path / "claims.csv").exists()
    assert written
    assert isinstance(_CLAIMS[0], Claim)
    _CLAIMS.clear()
