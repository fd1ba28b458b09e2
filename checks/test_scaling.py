"""`commbench reproduce scaling`: the plan covers every family on both axes, and
the rows, growth factors and plot agree with the result records (a reduced
set of tiny pipeline runs)."""

from __future__ import annotations

import importlib.util
from collections import defaultdict

from harness.experiments.scaling import Run, measure, plan, plot, rows_for, tables_for
from harness.registry import make_config
from harness.reporting import render


def test_plan_has_three_sizes_and_two_world_sizes_per_family():
    sizes, worlds = defaultdict(set), defaultdict(set)
    for run in plan("tiny"):
        if run.axis == "size":
            sizes[run.family].add(run.cfg.model)
        else:
            worlds[run.family].add(run.cfg.world_size)
    families = {"pipeline", "zo", "distzo2", "protocol", "double-quant"}
    assert set(sizes) == set(worlds) == families
    assert all(len(models) >= 3 for models in sizes.values())
    for family, ws in worlds.items():
        assert {3, 5, 9} <= ws if family == "double-quant" else {2, 4} <= ws  # DQ: 1 master + 2, 4, 8


def test_rows_match_records_and_pipeline_bytes_grow_with_stages(tmp_path):
    runs = [Run("world", "pipeline", make_config("pipeline-sgd", model="tiny-opt", data="wiki-en",
                                                 world_size=w, steps=1, batch_size=4, seq_len=16))
            for w in (2, 3, 4)]
    results = measure(runs, tmp_path / "runs", quiet=True)
    assert len(list((tmp_path / "runs").glob("*.json"))) == 3
    size_table, world_table = tables_for(rows_for(results), "tiny")
    assert size_table.rows == [] and len(world_table.rows) == 3
    rows = world_table.row_dicts()
    for row, (_, rec) in zip(rows, results, strict=True):
        assert row["payload"] == rec.metrics["payload_bytes_per_step"].value
        assert row["messages"] == rec.metrics["messages_per_step"].value
        assert row["world"] == rec.world_size
    first = rows[0]
    assert first["bytes_ratio"] == 1 and first["x_ratio"] == 1
    payload = [r["payload"] for r in rows]
    assert payload == sorted(set(payload)), payload  # strictly: one more link per stage
    assert "scaling with world size" in render(world_table, "md")

    png = plot(rows, tmp_path / "scaling.png")
    if importlib.util.find_spec("matplotlib") is None:
        assert png is None
    else:
        assert png and (tmp_path / "scaling.png").stat().st_size > 0
