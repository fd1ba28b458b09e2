"""What the user points at is never destroyed, and no result is lost silently.

Output paths (``run --out``, ``table --out``, ``reproduce --out-dir``, plots,
every atomic write): only regular files are written or replaced; device nodes,
FIFOs, sockets (and links to them) are refused with one line, exit 2, nothing
written.  A link to a regular file is followed and stays a link.  A run's
``--out`` that exists is refused without ``--force``, and a file another run
wrote there during this one is kept, this run's record saved beside it.

Device nodes are only ever *looked at* here: ``/dev/null`` is named to commands
whose launcher is a spy (nothing would be written even if the check failed), and
afterwards it must still be a character device.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import (
    OutputChanged,
    OutputRefused,
    atomic_write,
    file_stamp,
    read_result,
    write_result,
)

FAST = ["--steps", "2", "--set", "seq_len=8", "--set", "batch_size=2", "--quiet"]


@pytest.fixture
def spied(tmp_path, monkeypatch):
    """cwd in tmp_path; every way a rank starts raises instead (nothing runs, nothing is written)."""
    import harness.launcher
    import harness.progress
    import harness.rank_entry

    monkeypatch.chdir(tmp_path)
    calls = []

    def spy(*a, **k):
        calls.append(a)
        raise RuntimeError("ran")

    for mod, name in ((harness.launcher, "run"), (harness.progress, "run"), (harness.progress, "launch"),
                      (harness.rank_entry, "run_rank")):
        monkeypatch.setattr(mod, name, spy)
    return calls


@pytest.fixture(scope="module")
def a_record(tmp_path_factory):
    from harness.launcher import run
    from harness.registry import make_config

    d = tmp_path_factory.mktemp("rec")
    write_result(run(make_config("fo-sgd", steps=2, batch_size=2, seq_len=8)), d / "r.json")
    return d / "r.json"


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    return p


def _sock(tmp_path: Path):
    p = tmp_path / "s.json"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    return p, s


def _one_line_exit_2(capsys, code) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), err
    return lines[0]


def _still_char_device(path: str) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


# --------------------------------------------------------------------------- refused kinds
@pytest.mark.parametrize("command", ["run", "table"])
def test_a_fifo_is_refused_before_anything_runs(command, tmp_path, spied, a_record, capsys):
    fifo = _fifo(tmp_path)
    args = ["run", "fo-sgd", "--out", str(fifo)] if command == "run" else \
        ["table", str(a_record), "--out", str(fifo), "--format", "md"]
    line = _one_line_exit_2(capsys, main(args))
    assert str(fifo) in line and "is a FIFO" in line, line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and spied == []
    assert sorted(os.listdir(tmp_path)) == ["pipe.json"]


@pytest.mark.parametrize("command", ["run", "table"])
def test_a_socket_is_refused(command, tmp_path, spied, a_record, capsys):
    path, s = _sock(tmp_path)
    try:
        args = ["run", "fo-sgd", "--out", str(path)] if command == "run" else \
            ["table", str(a_record), "--out", str(path), "--format", "md"]
        line = _one_line_exit_2(capsys, main(args))
        assert "is a socket" in line and stat.S_ISSOCK(os.lstat(path).st_mode) and spied == []
    finally:
        s.close()


def test_a_device_node_is_refused_and_left_a_device(spied, capsys):
    # `run`: the spy stops any run before a write could happen, whatever the check does
    assert _still_char_device("/dev/null")
    line = _one_line_exit_2(capsys, main(["run", "fo-sgd", "--out", "/dev/null"]))
    assert "/dev/null" in line and "is a character device" in line, line
    assert _still_char_device("/dev/null") and spied == []


@pytest.mark.parametrize("kind,word", [(stat.S_IFCHR, "character device"), (stat.S_IFBLK, "block device")])
def test_table_refuses_a_path_whose_stat_says_device(kind, word, tmp_path, a_record, monkeypatch, capsys):
    # `table` writes when the check fails, so no real device is named: a plain file that stat
    # reports as a device stands in for one
    import harness.results.files as files

    fake = tmp_path / "dev.md"
    fake.write_text("untouched")
    real_stat = os.stat

    def stat_says_device(p, *a, **k):
        st = real_stat(p, *a, **k)
        if os.path.abspath(p) == str(fake):
            return os.stat_result((kind | 0o666, *tuple(st)[1:]))
        return st

    monkeypatch.setattr(files.os, "stat", stat_says_device)
    line = _one_line_exit_2(capsys, main(["table", str(a_record), "--out", str(fake), "--format", "md"]))
    assert f"is a {word}" in line and str(fake) in line, line
    assert fake.read_text() == "untouched" and sorted(os.listdir(tmp_path)) == ["dev.md"]


def test_reproduce_refuses_a_fifo_as_out_dir(tmp_path, spied, capsys):
    fifo = _fifo(tmp_path)
    line = _one_line_exit_2(capsys, main(["reproduce", "codecs", "--out-dir", str(fifo)]))
    assert "(a FIFO (named pipe))" in line and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_to_a_fifo_is_refused_and_stays_a_link(tmp_path, spied, capsys):
    fifo = _fifo(tmp_path)
    link = tmp_path / "r.json"
    link.symlink_to(fifo)
    line = _one_line_exit_2(capsys, main(["run", "fo-sgd", "--out", str(link)]))
    assert "is a FIFO" in line and "a link to" in line, line
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_to_a_device_is_refused(tmp_path, spied, capsys):
    link = tmp_path / "r.json"
    link.symlink_to("/dev/null")
    line = _one_line_exit_2(capsys, main(["run", "fo-sgd", "--out", str(link)]))
    assert "is a character device" in line and link.is_symlink() and _still_char_device("/dev/null")


def test_atomic_write_refuses_what_is_not_a_regular_file_at_write_time(tmp_path):
    # the check before a run may be minutes old: the writer looks again
    fifo = _fifo(tmp_path)
    with pytest.raises(OutputRefused, match="FIFO"):
        atomic_write(fifo, "x")
    path, s = _sock(tmp_path)
    try:
        with pytest.raises(OutputRefused, match="socket"):
            atomic_write(path, b"x")
    finally:
        s.close()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISSOCK(os.lstat(path).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["pipe.json", "s.json"]  # no temp file left


def test_atomic_write_follows_a_link_and_keeps_it(tmp_path):
    real = tmp_path / "real.md"
    real.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    dangling = tmp_path / "d.md"
    dangling.symlink_to(tmp_path / "made.md")
    atomic_write(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "made.md").read_text() == "made"


def test_a_plot_is_never_written_into_a_fifo(tmp_path):
    pytest.importorskip("matplotlib")
    from harness.reporting.plots import Curve, plot_loss_curves

    fifo = _fifo(tmp_path)
    with pytest.raises(OutputRefused, match="FIFO"):
        plot_loss_curves([Curve("a", [1.0, 0.5], step_time_s=[0.1, 0.1])], fifo, "t")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_too_long_out_name_is_bad_input(tmp_path, spied, capsys):
    line = _one_line_exit_2(capsys, main(["run", "fo-sgd", "--out", str(tmp_path / ("x" * 300 + ".json"))]))
    assert "305 bytes" in line and "this file system allows" in line and spied == []


# --------------------------------------------------------------------------- another run's result
def test_an_existing_out_is_refused_without_force(tmp_path, spied, capsys):
    out = tmp_path / "r.json"
    out.write_text("another run's result")
    line = _one_line_exit_2(capsys, main(["run", "fo-sgd", "--out", str(out)]))
    assert "exists" in line and "--force" in line and spied == []
    assert out.read_text() == "another run's result"


def test_force_replaces_an_existing_out(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("old")
    assert main(["run", "fo-sgd", *FAST, "--force", "--out", str(out)]) == 0, capsys.readouterr().err
    assert read_result(out).algorithm == "fo-sgd"


def test_force_through_a_link_writes_the_file_it_names(tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(real)
    assert main(["run", "fo-sgd", *FAST, "--force", "--out", str(link)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and read_result(real).algorithm == "fo-sgd"


@pytest.mark.parametrize("force", [False, True])
def test_a_file_written_during_the_run_is_kept_and_the_record_saved_beside(force, tmp_path, monkeypatch,
                                                                          capsys):
    import harness.progress

    out = tmp_path / "r.json"
    if force:
        out.write_text("before")
    real = harness.progress.run

    def run_then_another_writes(cfg, quiet):
        rec = real(cfg, quiet)
        out.write_text("the other run's record, written while this one ran")
        return rec

    monkeypatch.setattr(harness.progress, "run", run_then_another_writes)
    code = main(["run", "fo-sgd", *FAST, "--out", str(out), *(["--force"] if force else [])])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "written by another process" in err, err
    assert out.read_text() == "the other run's record, written while this one ran"
    saved = Path(err.rsplit("saved to ", 1)[1])
    assert saved.parent == tmp_path and read_result(saved).algorithm == "fo-sgd"


def test_create_only_and_stamped_writes(tmp_path, a_record):
    rec = read_result(a_record)
    p = tmp_path / "r.json"
    write_result(rec, p, expect=None)
    with pytest.raises(OutputChanged):
        write_result(rec, p, expect=None)
    stamp = file_stamp(p)
    write_result(rec, p, expect=stamp)  # still the file it saw: replaced
    with pytest.raises(OutputChanged):
        write_result(rec, p, expect=stamp)  # the stamp is of the file before
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_two_concurrent_runs_on_one_out_lose_no_result(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "harness.cli", "run", "fo-sgd", "--steps", "3", "--set", "seq_len=8",
           "--set", "batch_size=2", "--quiet", "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(c for c, _, _ in results)
    assert codes[0] == 0 and codes[1] in (1, 2), results
    assert sum(f"result: {out}" in o for _, o, _ in results) == 1, results
    records = [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    if codes[1] == 1:  # both ran: the second's record is beside the first's
        assert len(records) == 2, (records, results)
        assert all(json.loads((tmp_path / f).read_text())["algorithm"] == "fo-sgd" for f in records)
    else:  # the second started after the first had written: refused before running
        assert records == ["r.json"]


# --------------------------------------------------------------------------- an interrupted reproduce
def _stub_experiment(monkeypatch, run):
    import harness.experiments.runner as runner
    from harness.experiments.registry import Experiment

    monkeypatch.setattr(runner, "get_experiment", lambda name: Experiment(name, "stub", run, paper=False))


def test_a_reproduce_stopped_half_way_leaves_its_directory_marked_and_unread(tmp_path, a_record, monkeypatch,
                                                                          capsys):
    from harness.experiments.runner import run_experiments
    from harness.results.files import INCOMPLETE

    out = tmp_path / "exports"
    (out / "stub" / "runs").mkdir(parents=True)
    (out / "claims.md").write_text("an earlier, complete set's claims")
    (out / "stub" / "runs" / "r.json").write_bytes(a_record.read_bytes())

    def half_then_ctrl_c(scale, out_dir, quiet):
        (out_dir / "stub" / "runs" / "r.json").write_bytes(a_record.read_bytes())  # part-new records
        raise KeyboardInterrupt

    _stub_experiment(monkeypatch, half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_experiments("stub", scale="tiny", out_dir=out, quiet=True)
    assert (out / INCOMPLETE).is_file()
    capsys.readouterr()
    for args in (["table", str(out / "stub" / "runs")], ["table", str(out / "stub" / "runs" / "r.json")],
                 ["compare", str(out / "stub" / "runs"), str(a_record.parent)]):
        line = _one_line_exit_2(capsys, main(args))
        assert INCOMPLETE in line and "unfinished" in line, line

    # a run that finishes removes the mark
    _stub_experiment(monkeypatch, lambda scale, out_dir, quiet: [])
    run_experiments("stub", scale="tiny", out_dir=out, quiet=True)
    assert not (out / INCOMPLETE).exists()
    assert main(["table", str(out / "stub" / "runs"), "--format", "md"]) == 0


def _sigint_default():
    """In the child: ^C's default action, as in a terminal.  A job started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then keeps ignoring it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_reproduce_promptly_with_a_message(tmp_path):
    import signal
    import time

    out = tmp_path / "exports"
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "reproduce", "clapping", "--out-dir", str(out),
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_sigint_default)
    try:
        end = time.monotonic() + 120
        while not (out / "INCOMPLETE").exists():  # polling with a deadline: the run has begun
            assert p.poll() is None and time.monotonic() < end, p.communicate()
            time.sleep(0.1)
        time.sleep(3)
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and len(lines) == 1, err
    assert "interrupted by SIGINT" in lines[0] and "INCOMPLETE" in lines[0], lines
    assert took < 20, took  # a bound on waiting (seconds, not the 45 s of a communication timeout)
    assert (out / "INCOMPLETE").is_file()
