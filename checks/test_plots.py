"""PNG plots are real PNG files; the ``codecs`` experiment counts real payload bytes;
records carry the measured time of every step for loss-vs-wall-time plots."""

from __future__ import annotations

import math

import pytest

from harness.reporting.plots import (
    SKIPPED,
    Curve,
    note,
    plot_bandwidth,
    plot_codec_sizes,
    plot_loss_curves,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path) -> None:
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 2000  # axes, lines and text, not an empty canvas


def test_note_names_the_plot_or_why_there_is_none():
    assert note("out/x.png") == "plot: out/x.png"
    assert note(None) == SKIPPED


def test_loss_curves_png(tmp_path):
    pytest.importorskip("matplotlib")
    curves = [Curve("a", [3.0, 2.5, 2.2], step_time_s=[0.1, 0.1, 0.2]),
              Curve("b", [3.0, 2.8, 2.7], steps=[10, 20, 30], bits=[1e3, 2e3, 3e3]),
              Curve("c", [3.1, 2.9])]  # neither step times nor bits: step panel only
    out = plot_loss_curves(curves, tmp_path / "sub" / "loss.png", "tiny", hline=2.6)
    assert out == str(tmp_path / "sub" / "loss.png")
    _assert_png(out)


def test_bandwidth_and_codec_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"method": "x", "bandwidth": rate, "step": t, "speedup": 1.0, "speedup_paper": paper}
            for rate, t, paper in (("10mbit", 2.0, None), ("1gbit", 0.5, 1.8))]
    _assert_png(plot_bandwidth(rows, tmp_path / "bw.png", "user-space pacer"))
    pts = [{"codec": c, "tensor": k, "elements": n, "payload": n * b + 20, "floor": n * b}
           for c, b in (("fp32", 4), ("fp16", 2)) for k in ("gaussian", "relu") for n in (256, 1024)]
    _assert_png(plot_codec_sizes(pts, tmp_path / "codecs.png"))


# --------------------------------------------------------------------------- codecs experiment
@pytest.fixture(scope="module")
def codecs_table(tmp_path_factory):
    from harness.experiments import get_experiment

    out = tmp_path_factory.mktemp("codecs")
    (table,) = get_experiment("codecs").run("tiny", out, True)
    return table, out


def test_codecs_experiment_covers_every_codec(codecs_table):
    from algorithms.codecs import CODECS

    table, out = codecs_table
    names = {row["codec"].partition(":")[0] for row in table.row_dicts()}
    assert names == set(CODECS)
    note_ = table.notes[-1]
    if note_ != SKIPPED:
        assert note_ == f"plot: {out / 'codecs.png'}"
        _assert_png(out / "codecs.png")


def test_codecs_payload_is_the_encoded_length(codecs_table):
    from algorithms.codecs import make_codec
    from harness.experiments.codecs import make_tensor

    table, _ = codecs_table
    d = table.row_dicts()
    for spec, kind, n in (("sparse", "relu", 16_384), ("qstoch:bits=4", "gaussian", 1024),
                          ("topk:ratio=0.1", "gaussian", 262_144)):
        row = next(r for r in d if (r["codec"], r["tensor"], r["elements"]) == (spec, kind, n))
        x = make_tensor(kind, n)
        assert x.numel() == n
        assert row["payload"] == len(make_codec(spec).encode(x).tobytes())
        assert row["bpe"] == pytest.approx(8 * row["payload"] / n)
    lossless = [r for r in d if r["lossless"] == "yes"]
    assert {r["codec"] for r in lossless} >= {"identity", "sparse"}
    for r in lossless:
        assert r["payload"] >= r["floor"], r


# --------------------------------------------------------------------------- step times
def test_record_history_holds_one_step_time_per_step(tmp_path):
    from harness.launcher import run
    from harness.registry import make_config
    from harness.results import read_result, write_result

    cfg = make_config("fo-sgd", model="tiny-opt", steps=3, batch_size=2, seq_len=16, world_size=1,
                      backend="threads")
    rec = run(cfg)
    times = rec.history["step_time_s"]
    assert len(times) == cfg.steps == len(rec.history["loss"])
    assert all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in times)
    # the metric is the median of these very times
    assert rec.metrics["step_time_s"].value == sorted(times)[1]
    back = read_result(write_result(rec, tmp_path / "r.json"))
    assert back.history["step_time_s"] == times
