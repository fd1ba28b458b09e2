"""`commbench compare`: fails on a changed byte count or equivalence hash,
never on timing noise alone."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import Metric, read_result, write_result


@pytest.fixture(scope="module")
def base_record(tmp_path_factory):
    from harness.launcher import run
    from harness.registry import make_config

    return run(make_config("pipeline-sgd", world_size=2, model="tiny-opt", data="synthetic-markov",
                           steps=3, batch_size=4, seq_len=8))


def _write(rec, path):
    write_result(rec, path)
    return str(path)


def _with(rec, **metric_values):
    metrics = dict(rec.metrics)
    for name, value in metric_values.items():
        metrics[name] = dataclasses.replace(metrics[name], value=value)
    return dataclasses.replace(rec, metrics=metrics)


def test_identical_sets_pass(base_record, tmp_path, capsys):
    a = _write(base_record, tmp_path / "a" / "r.json")
    b = _write(base_record, tmp_path / "b" / "r.json")
    assert main(["compare", a, b]) == 0


def test_a_planted_byte_change_fails(base_record, tmp_path, capsys):
    old = _write(base_record, tmp_path / "old" / "r.json")
    planted = _with(base_record, payload_bytes_per_step=base_record.metrics["payload_bytes_per_step"].value + 4)
    new = _write(planted, tmp_path / "new" / "r.json")
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "payload_bytes_per_step" in out
    assert read_result(new).metrics["payload_bytes_per_step"].value != read_result(old).metrics[
        "payload_bytes_per_step"].value


def test_a_changed_equivalence_hash_fails(base_record, tmp_path):
    old = _write(base_record, tmp_path / "old.json")
    new = _write(_with(base_record, params_sha256="0" * 64), tmp_path / "new.json")
    assert main(["compare", old, new]) == 1


def test_timing_and_memory_noise_alone_never_fail(base_record, tmp_path, capsys):
    m = base_record.metrics
    slow = _with(base_record, step_time_s=m["step_time_s"].value * 3,
                 peak_memory_bytes=m["peak_memory_bytes"].value * 2)
    old = _write(base_record, tmp_path / "old.json")
    new = _write(slow, tmp_path / "new.json")
    assert main(["compare", old, new]) == 0
    assert "x3.000" in capsys.readouterr().out


def test_unknown_input_is_a_clear_error(tmp_path, capsys):
    assert main(["compare", "no/such/dir", "nor/this"]) == 2
    assert "neither a result" in capsys.readouterr().err


def test_step_time_has_its_noise(base_record):
    st = base_record.metrics["step_time_s"]
    assert isinstance(st, Metric) and st.stderr is not None and st.stderr >= 0
    json.dumps(base_record.to_dict())


# --------------------------------------------------------------------------- commits via asv results


def _asv_file(root, machine, sha, payload, seconds):
    """A result file in asv's own layout (result_columns + per-benchmark rows, parameterised)."""
    data = {"commit_hash": sha, "env_name": "existing-py3.11", "python": "3.11", "version": 2,
            "params": {"machine": machine, "python": "3.11"}, "requirements": {}, "env_vars": {},
            "result_columns": ["result", "params", "version", "started_at", "duration"],
            "results": {
                "bench_pipeline.Pipe.track_payload_bytes_per_step":
                    [[payload, payload * 2], [["'pipeline-sgd'", "'clapping-fc'"]], "v", 0, 1.0],
                "bench_pipeline.Pipe.track_seconds_per_step": [[seconds, seconds], [["'pipeline-sgd'",
                                                                "'clapping-fc'"]], "v", 0, 1.0]}}
    d = root / machine
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{sha[:8]}-existing-py3.11.json").write_text(json.dumps(data))


@pytest.fixture
def two_commits(tmp_path, monkeypatch):
    """A git repository with two commits; the working directory is its root."""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)

    def git(*args):
        return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    for i in range(2):
        (tmp_path / "f").write_text(str(i))
        git("add", "f")
        git("commit", "-qm", f"c{i}")
    return git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")


@pytest.mark.parametrize("new_payload, new_seconds, code, shown", [
    (1000, 1.5, 0, "x3.000"),       # 3x slower: reported, never failed on
    (1004, 0.5, 1, "REGRESSION"),   # a planted byte change fails
])
def test_commits_gate_on_bytes_only(two_commits, capsys, new_payload, new_seconds, code, shown):
    old, new = two_commits
    root = Path("results/asv")
    _asv_file(root, "m1", old, 1000, 0.5)
    _asv_file(root, "m1", new, new_payload, new_seconds)
    assert main(["compare", "HEAD~1", "HEAD"]) == code
    out = capsys.readouterr().out
    assert shown in out and "machine 'm1'" in out


def test_commits_need_one_machine_that_measured_both(two_commits, capsys):
    old, new = two_commits
    root = Path("results/asv")
    _asv_file(root, "m1", old, 1000, 0.5)
    _asv_file(root, "m2", new, 1004, 0.5)
    assert main(["compare", "HEAD~1", "HEAD"]) == 2  # never compare two machines
    assert "no machine" in capsys.readouterr().err
    _asv_file(root, "m2", old, 1004, 0.5)
    assert main(["compare", "HEAD~1", "HEAD"]) == 0
    assert main(["compare", "HEAD~1", "HEAD", "--machine", "m1"]) == 2
    assert main(["compare", "HEAD~1", "nonsense-rev"]) == 2


@pytest.fixture(scope="module")
def asv_portable():
    """scripts/asv_portable.py, loaded as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "asv_portable", Path(__file__).resolve().parent.parent / "scripts" / "asv_portable.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_asv_results_made_portable(tmp_path, asv_portable):
    sha = "ab" * 20
    _asv_file(tmp_path, "m1", sha, 1000, 0.5)
    f = tmp_path / "m1" / f"{sha[:8]}-existing-py3.11.json"
    data = json.loads(f.read_text())
    data.update(env_name="existing-py_home_u_venv_bin_python3", python="/home/u/venv/bin/python3")
    local = f.with_name(f"{sha[:8]}-existing-py_home_u_venv_bin_python3.json")
    local.write_text(json.dumps(data))
    f.unlink()
    assert asv_portable.make_portable(tmp_path, "3.11") == [f]
    assert not local.exists() and "/home/u" not in f.read_text()
    assert json.loads(f.read_text())["results"] == data["results"]


def test_asv_rerun_of_some_benchmarks_keeps_the_others(tmp_path, asv_portable):
    sha = "cd" * 20
    _asv_file(tmp_path, "m1", sha, 1000, 0.5)  # the full, portable file
    portable = tmp_path / "m1" / f"{sha[:8]}-existing-py3.11.json"
    full = json.loads(portable.read_text())
    part = dict(full, env_name="existing-py_x_python3",
                results={"bench_pipeline.Pipe.track_seconds_per_step": [[0.7, 0.7], [["'a'", "'b'"]], "v", 0, 1.0]})
    (tmp_path / "m1" / f"{sha[:8]}-existing-py_x_python3.json").write_text(json.dumps(part))
    asv_portable.make_portable(tmp_path, "3.11")
    merged = json.loads(portable.read_text())["results"]
    assert merged["bench_pipeline.Pipe.track_seconds_per_step"][0] == [0.7, 0.7]
    assert merged["bench_pipeline.Pipe.track_payload_bytes_per_step"] == full["results"][
        "bench_pipeline.Pipe.track_payload_bytes_per_step"]


# --------------------------------------------------------------------------- exit rules
def test_nothing_compared_is_an_error(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "nothing compared" in capsys.readouterr().err


def test_disjoint_sides_compare_nothing(base_record, tmp_path, capsys):
    other = dataclasses.replace(base_record, config={**base_record.config, "seed": 7}, seed=7)
    a = _write(base_record, tmp_path / "a" / "r.json")
    b = _write(other, tmp_path / "b" / "r.json")
    assert main(["compare", a, b]) == 2
    assert "no run is on both sides" in capsys.readouterr().err


def test_a_run_missing_on_one_side_fails_unless_allowed(base_record, tmp_path, capsys):
    other = dataclasses.replace(base_record, config={**base_record.config, "seed": 7}, seed=7)
    _write(base_record, tmp_path / "old" / "r.json")
    _write(other, tmp_path / "old" / "s.json")
    _write(base_record, tmp_path / "new" / "r.json")
    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    assert main(["compare", old, new]) == 1
    assert "1 run(s) on one side only" in capsys.readouterr().err
    assert main(["compare", old, new, "--allow-missing"]) == 0
    assert main(["compare", new, old]) == 1  # missing from OLD counts too


def test_two_records_of_one_config_on_one_side_are_an_error(base_record, tmp_path, capsys):
    _write(base_record, tmp_path / "old" / "r.json")
    _write(base_record, tmp_path / "new" / "r.json")
    _write(_with(base_record, params_sha256="0" * 64), tmp_path / "new" / "r2.json")
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "new")]) == 2
    assert "NEW holds two records of one config" in capsys.readouterr().err


def test_peak_tensor_bytes_is_deterministic_where_both_measured_it(base_record, tmp_path):
    from harness.results.schema import Metric as M

    measured = dataclasses.replace(base_record, metrics={
        **base_record.metrics, "peak_tensor_bytes": M(1_000_000, "bytes", False)})
    old = _write(measured, tmp_path / "old.json")
    assert main(["compare", old, _write(measured, tmp_path / "same.json")]) == 0
    # a record from before the metric (or a memory="rss" run) is no regression
    assert main(["compare", _write(base_record, tmp_path / "rss.json"), old]) == 0
    grown = _with(measured, peak_tensor_bytes=1_000_008)
    assert main(["compare", old, _write(grown, tmp_path / "grown.json")]) == 1


def test_commits_name_metrics_whole_and_say_what_was_not_compared(two_commits, capsys):
    """A parameter holding a dot is not cut at it; a benchmark that failed (None) or was skipped
    (NaN) on one side is named as not compared and fails the comparison unless allowed."""
    old, new = two_commits
    root = Path("results/asv")
    _asv_file(root, "m1", old, 1000, 0.5)
    _asv_file(root, "m1", new, 1000, 0.5)
    f = root / "m1" / f"{new[:8]}-existing-py3.11.json"
    data = json.loads(f.read_text())
    data["results"]["bench_pipeline.Pipe.track_seconds_per_step"][0] = None  # failed in NEW
    data["results"]["bench_pipeline.Pipe.track_payload_bytes_per_step"][1] = [["'clapping-fc-p0.5/w3'",
                                                                               "'b'"]]
    f.write_text(json.dumps(data))
    g = root / "m1" / f"{old[:8]}-existing-py3.11.json"
    data = json.loads(g.read_text())
    data["results"]["bench_pipeline.Pipe.track_payload_bytes_per_step"][1] = [["'clapping-fc-p0.5/w3'",
                                                                               "'b'"]]
    g.write_text(json.dumps(data))
    assert main(["compare", "HEAD~1", "HEAD", "--all"]) == 1
    cap = capsys.readouterr()
    from harness.reporting.compare import compare_commits

    changes, _ = compare_commits("HEAD~1", "HEAD")
    assert {c.metric for c in changes} == {"track_payload_bytes_per_step"}
    assert "bench_pipeline.Pipe.track_payload_bytes_per_step('clapping-fc-p0.5/w3')" in {c.run for c in changes}
    for param in ("'pipeline-sgd'", "'clapping-fc'"):
        assert f"not compared: bench_pipeline.Pipe.track_seconds_per_step({param}) (OLD 0.5, NEW failed)" \
            in cap.out
    assert "2 metric(s) without a value on one side" in cap.err
    assert main(["compare", "HEAD~1", "HEAD", "--allow-missing"]) == 0
