"""`reproduce sparq-gemma` rebuilt from its committed run records (results/sparq-gemma/runs):
every table and claim it makes from them, each claim once, the accuracy decided on the 20-step
runs.  The records are one measured run (about an hour on 2 cores, Gemma-3 opt-in), so CI
checks the experiment's arithmetic without the model; each record's config must equal the one
the experiment asks for, so a changed setting fails here until the run is redone."""

from __future__ import annotations

import json
from pathlib import Path

from harness.experiments import sparq_gemma
from harness.experiments.runner import run_experiments
from harness.registry import config_from_dict
from harness.results import read_result

RUNS = Path(__file__).resolve().parents[1] / "results" / "sparq-gemma" / "runs"


def test_sparq_gemma_tables_and_claims_rebuild_from_its_records(tmp_path, monkeypatch):
    used = []

    def replay(cfg, quiet, run_dir, name):
        rec = read_result(RUNS / f"{name}.json")
        # read as a RunConfig: a field added since the run (with its default) is the run's setting
        assert config_from_dict(rec.config).to_dict() == cfg.to_dict(), \
            f"{name}: the experiment's config changed since the run"
        used.append(name)
        return rec

    monkeypatch.setattr(sparq_gemma.gemma, "installed", lambda: True)
    monkeypatch.setattr(sparq_gemma, "_run", replay)
    run_experiments("sparq-gemma", scale="tiny", out_dir=tmp_path, quiet=True)
    assert sorted(used) == sorted(p.stem for p in RUNS.glob("*.json"))
    claims = json.loads((tmp_path / "sparq-gemma-claims.json").read_text())["claims"]
    ids = [c["id"] for c in claims]
    assert len(ids) == len(set(ids)) and "sparq.accuracy-vs-zo" in ids
    acc = next(c for c in claims if c["id"] == "sparq.accuracy-vs-zo")
    assert "after 20 steps" in acc["how"]  # the longer runs decide it, not the 2-step rows
