"""The command line: bad input ends with one line and a non-zero status; a
good run writes a valid record that `commbench table` renders."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest

from harness.cli import main
from harness.results import read_result


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "no-such-algo"], "unknown algorithm 'no-such-algo'"),
    (["run", "fo-sgd", "--set", "lr"], "expected key=value"),
    (["run", "fo-sgd", "--set", "nonsense=1"], "unknown key"),
    (["run", "fo-sgd", "--set", "lr=abc"], "expected float"),
    (["run", "fo-sgd", "--set", "lr=-1"], "lr must be > 0"),
    (["run", "pipeline-sgd", "--world-size", "1"], "needs world size >= 2"),
    (["run", "pipeline-sgd", "--world-size", "9", "--model", "tiny-opt"], "do not fit tiny-opt"),
    (["run", "fo-sgd", "--world-size", "2"], "needs world size 1"),
    (["run", "fo-sgd", "--model", "gpt-17"], "gpt-17"),
    (["run", "fo-sgd", "--data", "imagenet"], "imagenet"),
    (["run", "fo-sgd", "--backend", "mpi"], "invalid choice"),
    (["run", "fo-sgd", "--net", "pacer"], "needs --bandwidth"),
    (["run", "pipeline-sgd", "--world-size", "2", "--net", "netns", "--bandwidth", "fast"], "not a rate"),
    (["run", "fo-sgd", "--steps", "0"], "steps must be >= 1"),
    (["table", "does/not/exist.json"], "does/not/exist.json"),
    (["reproduce", "nope"], "unknown experiment"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert lines[0].startswith("commbench: error:")


def test_run_writes_a_record_and_table_renders_it(tmp_path):
    out = tmp_path / "r.json"
    code, stdout, stderr = _cli("run", "pipeline-sgd", "--world-size", "2", "--steps", "2",
                                "--set", "seq_len=8", "--set", "batch_size=2", "--out", str(out), "--quiet")
    assert code == 0, stderr
    rec = read_result(out)
    assert rec.algorithm == "pipeline-sgd" and rec.config["seq_len"] == 8
    for fmt in ("md", "csv", "latex", "html"):
        code, text, err = _cli("table", str(tmp_path), "--format", fmt)
        assert code == 0, err
        assert "pipeline-sgd" in text
    code, text, _ = _cli("table", str(out), "--format", "csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert any("pipeline-sgd" in r for r in rows)


def test_corrupt_result_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "commbench.result/1", "algori')
    assert main(["table", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("fo-sgd", "pipeline-sgd", "tiny-opt", "tiny-llama", "wiki-en", "foundation"):
        assert name in out
