"""Faults checked inside this process (fast): a blocked rank thread is named,
not the rank whose wait timed out; a whole-run limit only when one is set;
stop signals become ``Interrupted`` (held while ranks start); leftovers of dead
launchers are removed and nothing else is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from harness.comm import CommTimeout, RankFailed, run_threads
from harness.comm.progress_board import Heartbeat, ProgressBoard
from harness.config import ConfigError
from harness.launcher import Interrupted, _Signals
from harness.registry import make_config


# ---- stalled rank naming (threads backend) ---------------------------------------
def _blocked_chain(world: int, blocked: int, release: threading.Event):
    """Rank r receives from r+1; ``blocked`` never reaches its send (a stuck rank thread)."""
    def prog(comm):
        r = comm.rank
        if r == blocked:
            release.wait()  # blocked outside the Comm until the check lets it go
            return None
        if r + 1 < world:
            comm.recv(r + 1)
        if r > 0:
            comm.send(comm_payload(), r - 1)
        return r
    return prog


def comm_payload():
    import torch

    return torch.zeros(3, dtype=torch.uint8)


@pytest.mark.parametrize("world,blocked", [(2, 1), (3, 2), (4, 2)])
def test_a_blocked_rank_thread_is_named_not_the_rank_that_timed_out(world, blocked):
    release = threading.Event()
    try:
        with pytest.raises(RankFailed) as info:
            run_threads(world, _blocked_chain(world, blocked, release), timeout_s=0.5)
    finally:
        release.set()
    assert info.value.rank == blocked, str(info.value)
    msg = str(info.value)
    assert f"rank {blocked} failed: stopped making progress: it has not reached its next communication" in msg
    assert f"recv from rank {blocked} timed out after 0.5 s" in msg or "timed out after 0.5 s" in msg


@pytest.mark.parametrize("load,named", [(64.0, True), (0.0, False)])
def test_a_stall_under_overload_mentions_the_load(load, named, monkeypatch):
    # a starved live rank and a stalled one look alike: the message says when the machine is overloaded
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    release = threading.Event()
    try:
        with pytest.raises(RankFailed) as info:
            run_threads(2, _blocked_chain(2, 1, release), timeout_s=0.5)
    finally:
        release.set()
    msg = str(info.value)
    assert "stopped making progress" in msg
    assert ("overloaded (load average 64.0 on" in msg) == named, msg


def test_a_timeout_without_a_stalled_rank_says_so():
    def prog(comm):  # every rank waits for the other: a deadlock, nobody to blame
        comm.recv(1 - comm.rank)

    with pytest.raises(RankFailed) as info:
        run_threads(2, prog, timeout_s=0.3)
    assert "timed out after 0.3 s" in str(info.value)
    assert "stopped making progress" not in str(info.value)
    assert isinstance(info.value.__cause__, CommTimeout)


def test_a_rank_that_left_a_wait_and_then_blocked_is_named():
    # Rank 1 receives, then blocks before its reply: leaving its wait marked it computing.
    release = threading.Event()

    def prog(comm):
        if comm.rank == 0:
            comm.send(comm_payload(), 1)
            comm.recv(1)
        else:
            comm.recv(0)
            release.wait()
            comm.send(comm_payload(), 0)

    try:
        with pytest.raises(RankFailed) as info:
            run_threads(2, prog, timeout_s=0.5)
    finally:
        release.set()
    assert info.value.rank == 1, str(info.value)
    assert "it has not reached its next communication" in str(info.value)


def test_a_rank_whose_wait_timed_out_stays_waiting_so_a_later_timeout_blames_nobody():
    # The deadlock above, with the race made certain: rank 1's wait times out first. Were it
    # then marked computing, rank 0's timeout a moment later would blame it ("0.0 s").
    from types import SimpleNamespace

    from harness.comm.base import _Waiting
    from harness.comm.progress_board import WAITING

    board = ProgressBoard.in_memory(2)
    waits = [_Waiting(SimpleNamespace(board=board, rank=r)) for r in range(2)]
    for w in waits:
        w.__enter__()  # both ranks inside their receive
    for r in (1, 0):  # rank 1 times out first
        timeout = CommTimeout(f"rank {r}: recv from rank {1 - r} timed out after 0.3 s")
        assert waits[r].__exit__(CommTimeout, timeout, None) is False  # re-raised as it is
        assert board._read(r)[2] == WAITING


def test_board_names_a_process_that_never_beat_while_others_do():
    # A zeroed slot is "never seen" (ProgressBoard.create_file); once any other
    # rank has a heartbeat, the lowest rank still at 0 never started (stalled()).
    # Heartbeat times only need to be > 0 here: no clock comparison is involved.
    board = ProgressBoard.in_memory(4)
    board.beat(2)
    board.beat(3)
    assert board.stalled(me=2) == (0, "its process never started communicating")
    board.beat(0)
    assert board.stalled(me=2) == (1, "its process never started communicating")


def test_board_names_a_stale_heartbeat_with_its_age(monkeypatch):
    # A heartbeat older than STALE_BEAT_S names its process as stopped, with the
    # heartbeat's age (now - last beat) in the reason (stalled()).  A fake clock
    # in place of time.monotonic: no sleeps, and the age is exact.
    from types import SimpleNamespace

    from harness.comm import progress_board as pb

    clock = [1000.0]
    monkeypatch.setattr(pb, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    board = ProgressBoard.in_memory(3)
    board.beat(0)
    clock[0] = 1002.0
    board.beat(1)
    board.beat(2)
    age = pb.STALE_BEAT_S + 2.5  # rank 0's beat is 2.5 s past stale, the others 0.5 s
    clock[0] = 1000.0 + age
    assert board.stalled(me=2) == (
        0, f"no sign of life from its process for {age:.1f} s (stopped, hung or dead)")


def test_a_closed_comm_is_on_the_board_as_finished():
    # Comm.close() marks the rank FINISHED, so a peer's timed-out wait blames
    # it as finished, not as stuck computing (ProgressBoard.stalled()).
    from harness.comm import ThreadsWorld

    world = ThreadsWorld(2, timeout_s=5)
    c1 = world.comm(1)
    rank, why = world.board.stalled(me=0)  # built: computing
    assert rank == 1 and why.startswith("it has not reached its next communication")
    c1.close()
    assert world.board.stalled(me=0) == (1, "it finished its program while others still wait for it")


def test_a_file_board_and_its_heartbeat_thread(tmp_path):
    # The process backends' board: a file of zeroed slots (create_file) that each
    # rank process opens and beats from a liveness thread (module docstring of
    # harness/comm/progress_board.py).
    path = tmp_path / "board"
    ProgressBoard.create_file(path, 3)
    board, seen = ProgressBoard.open_file(path, 3), ProgressBoard.open_file(path, 3)
    try:
        beat = Heartbeat(board, 1)
        try:
            # A daemon thread: a rank process that ends without stopping it
            # (an exception before Comm.close) must still be able to exit.
            assert [t.daemon for t in threading.enumerate() if t.name == "heartbeat1"] == [True]
        finally:
            beat.stop()
        assert not [t for t in threading.enumerate() if t.name == "heartbeat1"]
        # Seen through a second mapping of the file: rank 1 beat at start, rank 2
        # never did, so rank 2 is the one that never started (stalled()).
        assert seen.stalled(me=0) == (2, "its process never started communicating")
    finally:
        board.close()
        seen.close()


def test_max_run_time_stops_a_run_and_prints_seconds():
    release = threading.Event()

    def prog(comm):
        if comm.rank == 0:
            release.wait()

    try:
        with pytest.raises(RankFailed, match=r"the run failed: .*--max-run-time 0\.4 s"):
            run_threads(2, prog, timeout_s=600, max_run_time_s=0.4)
    finally:
        release.set()


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True])
def test_max_run_time_is_validated(bad):
    with pytest.raises(ConfigError, match="max_run_time_s"):
        make_config("pipeline-sgd", world_size=2, max_run_time_s=bad)


def test_cli_rejects_a_bad_max_run_time(capsys):
    from harness.cli import main

    assert main(["run", "pipeline-sgd", "--world-size", "2", "--max-run-time", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max-run-time" in err


# ---- stop signals ------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_stop_signals_raise_interrupted_and_wait_while_deferred(sig):
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as info:
        with _Signals() as sigs:
            with sigs.deferred():
                signal.raise_signal(sig)  # held: ranks are being started
                held = sigs.pending
            assert held == sig
            sigs.check()
    assert info.value.signum == sig and signal.Signals(sig).name in str(info.value)
    assert signal.getsignal(sig) == before  # handlers restored


# ---- leftovers -------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _fake_run_dir(tmp: Path, pid: int, marker: str | None) -> Path:
    d = tmp / f"commbench-run-{pid}-abc123"
    d.mkdir()
    if marker is not None:
        (d / "launcher.pid").write_text(marker)
    return d


def test_remove_stale_removes_only_dead_launchers_run_dirs(tmp_path):
    from harness.leftovers import remove_stale

    dead = _dead_pid()
    gone = _fake_run_dir(tmp_path, dead, str(dead))
    live = _fake_run_dir(tmp_path, os.getppid(), str(os.getppid()))  # a live process
    (tmp_path / f"commbench-run-{dead}-nomarker").mkdir()  # not made by commbench: no marker
    wrong = tmp_path / f"commbench-run-{dead}-wrongmark"
    wrong.mkdir()
    (wrong / "launcher.pid").write_text("1")
    other = tmp_path / f"commbench-runx-{dead}-abc"
    other.mkdir()
    removed = remove_stale(tmp_path)
    assert not gone.exists()
    assert live.exists() and wrong.exists() and other.exists()
    assert (tmp_path / f"commbench-run-{dead}-nomarker").exists()
    assert any(str(gone) in r for r in removed)


@pytest.mark.netns
def test_remove_stale_removes_only_dead_launchers_namespaces(tmp_path):
    from harness.leftovers import remove_stale
    from harness.netns import leftover_namespaces, unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    dead, live = _dead_pid(), os.getppid()
    names = [f"cb-{dead}-abcdef-sw", f"cb-{dead}-abcdef-r0", f"cb-{live}-abcdef-r0", f"cb-{dead}-notours"]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        remove_stale(tmp_path)
        left = set(leftover_namespaces())
        assert names[0] not in left and names[1] not in left
        assert names[2] in left and names[3] in left
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_commbench_clean_reports_what_it_removed(tmp_path, monkeypatch, capsys):
    import tempfile

    from harness.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    d = _fake_run_dir(tmp_path, dead, str(dead))
    assert main(["clean"]) == 0
    out = capsys.readouterr().out
    assert not d.exists() and f"removed run directory {d}" in out and "commbench clean:" in out


@pytest.mark.parametrize("op", ["all_gather", "broadcast", "barrier"])
def test_a_timed_out_collective_is_named_in_the_error(op):
    # The error a user reads names the operation that waited, so a hang can be
    # traced to its line of the program (threads backend, ThreadsWorld.wait_for).
    release = threading.Event()

    def prog(comm):
        if comm.rank == 1:  # alive but never joins: rank 0's wait must time out
            release.wait()
            return None
        try:
            t = torch.zeros(2)
            {"all_gather": lambda: comm.all_gather(t), "broadcast": lambda: comm.broadcast(t, src=0),
             "barrier": comm.barrier}[op]()
        finally:
            release.set()

    with pytest.raises(RankFailed) as info:
        run_threads(2, prog, timeout_s=0.3)
    assert f"rank 0: {op} timed out after 0.3 s" in str(info.value)


def test_a_rank_that_joined_its_group_is_computing_with_its_heartbeat_kept(monkeypatch):
    # rendezvous (harness.rank_entry): waiting, beating, then in the group: computing with no
    # communication boundary yet, and the heartbeat the joining left in its slot untouched
    from types import SimpleNamespace

    from harness.comm.progress_board import COMPUTING
    from harness.rank_entry import rendezvous

    monkeypatch.setenv("RANK", "1")
    board = ProgressBoard.in_memory(2)
    rendezvous(SimpleNamespace(world_size=2), board, join=lambda: None)
    beat, boundary, state = board._read(1)
    assert beat > 0 and boundary == 0.0 and state == COMPUTING
    assert board._read(0) == (0.0, 0.0, 0.0)
