"""``commbench table`` never pools runs whose configs differ: rows split by every config field that
differs (the link included, shown in the row), and only the seed, limits and meters are pooled, by
name."""

from __future__ import annotations

from harness.reporting import records_to_table
from harness.results import Metric, ResultRecord


def _rec(seed=0, step=0.5, **config) -> ResultRecord:
    cfg = {"algorithm": "pipeline-sgd", "model": "tiny-opt", "world_size": 2, "backend": "gloo",
           "seed": seed, "net": "none", "bandwidth": None, "latency_ms": 0.0, "timeout_s": 120.0,
           "params": {}, **config}
    return ResultRecord("pipeline-sgd", cfg, 2, "gloo", "tiny-opt", "d", 5, seed,
                        {"step_time_s": Metric(step, "s", False), "payload_bytes_per_step": Metric(100, "bytes")})


def test_configs_that_differ_are_rows_of_their_own():
    recs = [_rec(), _rec(seed=1), _rec(net="pacer", bandwidth="80mbit", step=2.0),
            _rec(net="netns", bandwidth="80mbit", step=3.0), _rec(lr=0.1), _rec(params={"k": 8}),
            _rec(latency_ms=5.0, net="pacer")]
    t = records_to_table(recs)
    rows = t.row_dicts()
    assert len(rows) == 6  # only the two seeds share a row
    links = [r["link"] for r in rows]
    assert links[:4] == ["unshaped", "pacer 80mbit", "netns 80mbit", "unshaped"]
    assert links[6 - 1] == "pacer +5 ms"
    assert rows[1]["step_time_s"] == 2.0 and rows[2]["step_time_s"] == 3.0  # never mixed
    keys = [c.key for c in t.columns]
    assert "config.lr" in keys and "config.params.k" in keys
    assert [r["config.params.k"] for r in rows] == [None, None, None, None, 8, None]
    assert rows[0]["runs"] == 2
    assert any("pool runs that differ only in seed (0, 1)" in n for n in t.notes)


def test_a_paced_run_alone_shows_its_rate():
    t = records_to_table([_rec(net="pacer", bandwidth="80mbit")])
    assert t.row_dicts()[0]["link"] == "pacer 80mbit"
    assert "link" not in [c.key for c in records_to_table([_rec()]).columns]
