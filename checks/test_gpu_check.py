"""The GPU check's CPU side: the script starts, skips its CUDA parts with one line, writes a
summary that parses; its part code runs on tiny models on the CPU; the table builder reads
records (here ``checks/gpu_fixture/``, invented values marked as a fixture, never measured)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check as g

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "checks" / "gpu_fixture"


def test_script_without_cuda_skips_in_one_line_and_writes_a_summary(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path / "out"),
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("gpu-check: CUDA parts skipped")]
    assert len(said) == 1 and "no CUDA device" in said[0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["schema"] == g.SCHEMA and summary["cuda"] is False and summary["fixture"] is False
    assert list(summary["parts"]) == list(g.PARTS)
    assert all(p["status"] == "skipped" for p in summary["parts"].values())
    assert summary["env"]["torch"]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert md == g.table(tmp_path / "out") and "CUDA parts skipped" in md and "FIXTURE" not in md


def test_table_of_the_fixture_says_fixture_and_shows_every_part(capsys):
    assert g.main(["table", str(FIXTURE)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("**FIXTURE — not measured")
    for name in g.PARTS:
        assert f"| {name} |" in md
    assert "| fo-sgd | 4.00 | 2 |" in md and "2 + 11 storage" in md
    assert '"> 3x": supports' in md and '"> 3x": does not support' in md
    assert "failed: RuntimeError" in md and "| timeout |" in md
    assert "nccl with several ranks needs several GPUs" in md


def test_table_refuses_what_is_not_a_gpu_check_directory(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"schema": "other/1"}))
    assert g.main(["table", str(tmp_path)]) == 2
    assert g.main(["table", str(tmp_path / "missing")]) == 2


def test_overlap_is_the_share_of_copy_time_under_compute():
    tl = [{"op": "U", "start_ms": 0.0, "end_ms": 2.0}, {"op": "C", "start_ms": 1.0, "end_ms": 5.0},
          {"op": "O", "start_ms": 5.0, "end_ms": 6.0}, {"op": "U", "start_ms": 3.0, "end_ms": 4.0}]
    ov = g.overlap_stats(tl)
    assert ov["upload_ms"] == 3.0 and ov["upload_overlapped_fraction"] == pytest.approx(2 / 3)
    assert ov["offload_overlapped_fraction"] == 0.0 and ov["compute_ms"] == 4.0 and ov["span_ms"] == 6.0


def test_parts_run_on_tiny_models_on_the_cpu(tmp_path, monkeypatch):
    # the code the GPU run executes, minus the CUDA calls: a failure here is not left for the device
    monkeypatch.setattr(g, "BATCH", 2)
    z = {"part": "zo2", "status": "ok"}
    g.part_zo2(tmp_path, z, model_name="tiny-opt", seq=8, rounds=2, device="cpu")
    assert z["schedule_problems"] == [] and len(z["zo2_step_s"]) == len(z["mezo_step_s"]) == 2
    assert {e["op"] for e in z["timeline"]} == set("UCO") and z["overlap"]["compute_ms"] > 0
    m = {"part": "memory-tiny-opt", "status": "ok"}
    g.part_memory(tmp_path, m, "tiny-opt", seq=8, device="cpu")
    assert [r["algorithm"] for r in m["runs"]] == [a for a, _, _ in g.MEMORY_RUNS]
    assert all(r["status"] == "ok" for r in m["runs"]), m["runs"]
    assert json.loads((tmp_path / "memory-tiny-opt.json").read_text())["runs"]
