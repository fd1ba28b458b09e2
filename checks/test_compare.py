"""`commbench compare`: fails on a changed byte count or equivalence hash,
never on timing noise alone."""

from __future__ import annotations

import dataclasses
import json

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
