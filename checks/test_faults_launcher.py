"""Faults around a process run: signals to the launcher, a stopped rank, what
listens during a run.  Each case ends in one clear line and leaves no rank
process, network namespace or run directory behind.

The launcher runs as ``python -m harness.cli run`` in its own session; what is
left behind is looked for independently of the harness's own bookkeeping: rank
processes by the launcher pid in their environment, namespaces and run
directories by the launcher pid in their names.  Every wait polls with a
deadline; none is a fixed sleep.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.netns import unavailable_reason

pytestmark = pytest.mark.gloo

DEADLINE_S = 120  # a bound on waiting, never a pass/fail threshold on speed
RUN = ["run", "pipeline-sgd", "--world-size", "2", "--backend", "gloo", "--model", "tiny-opt",
       "--data", "wiki-en", "--set", "batch_size=4", "--set", "seq_len=16", "--quiet"]


def _poll(cond, what: str, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.1)  # polling interval of a deadline wait, not synchronisation


def _ranks_of(launcher: int) -> dict[int, int]:
    """rank -> pid of live processes started by ``launcher`` (from their environment)."""
    found = {}
    tag = f"COMMBENCH_LAUNCHER_PID={launcher}".encode()
    for p in Path("/proc").glob("[0-9]*"):
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in env and state != "Z":
            rank = next(int(e[5:]) for e in env if e.startswith(b"RANK="))
            found[rank] = int(p.name)
    return found


def _run_dirs_of(launcher: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"commbench-run-{launcher}-*"))


def _namespaces_of(launcher: int) -> list[str]:
    if unavailable_reason() is not None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"cb-{launcher}-")]


_OUT_ROOT: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _out_root():
    """One temporary directory for every run's --out in this module, removed at its end."""
    with tempfile.TemporaryDirectory(prefix="cbchk-") as root:
        _OUT_ROOT.append(root)
        yield
        _OUT_ROOT.remove(root)


def _start(*extra: str, steps: int = 100000, timeout: float = 60) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness.cli", *RUN, "--steps", str(steps), "--timeout", str(timeout),
           "--out", os.path.join(tempfile.mkdtemp(dir=_OUT_ROOT[-1]), "r.json"), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _training(p: subprocess.Popen) -> dict[int, int]:
    """Wait until both ranks run and the last one reported a step; their pids."""
    def ready():
        if p.poll() is not None:
            raise AssertionError(f"launcher ended early: {p.communicate()}")
        dirs = _run_dirs_of(p.pid)
        ranks = _ranks_of(p.pid)
        return ranks if len(ranks) == 2 and dirs and (dirs[0] / "progress1.json").exists() else None
    return _poll(ready, "the run to start training")


def _assert_nothing_left(launcher: int) -> None:
    _poll(lambda: not _ranks_of(launcher), f"rank processes of launcher {launcher} to end")
    _poll(lambda: not _namespaces_of(launcher), f"namespaces of launcher {launcher} to go")
    _poll(lambda: not _run_dirs_of(launcher), f"run directory of launcher {launcher} to go")


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=DEADLINE_S)
    return p.returncode, err


def _one_clear_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ---- signals to the launcher ---------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_to_the_launcher_stops_and_removes_everything(sig):
    p = _start()
    try:
        ranks = _training(p)
        if sig == signal.SIGTERM and Path("/proc/net/tcp").exists():
            _assert_listening_on_loopback_only([p.pid, *ranks.values()])
        os.kill(p.pid, sig)
        code, err = _finish(p)
        assert code == 128 + sig, err
        line = _one_clear_line(err)
        assert f"interrupted by {signal.Signals(sig).name}" in line, line
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()


def _watchdog_of(launcher: int) -> int:
    for p in Path("/proc").glob("[0-9]*"):
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.leftovers" in argv and str(launcher).encode() in argv:
            return int(p.name)
    raise AssertionError(f"no watchdog process for launcher {launcher}")


@pytest.mark.parametrize("also_watchdog", [False, True], ids=["launcher", "launcher+watchdog"])
def test_sigkill_to_the_launcher_takes_the_ranks_and_leaves_nothing(also_watchdog):
    """The ranks die with the launcher (parent-death signal); the watchdog removes
    the run directory, or, when it was killed too, ``commbench clean`` does."""
    p = _start()
    try:
        _training(p)
        if also_watchdog:
            os.kill(_watchdog_of(p.pid), signal.SIGKILL)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        _poll(lambda: not _ranks_of(p.pid), "the ranks to die with their launcher")
        if also_watchdog:
            assert _run_dirs_of(p.pid), "nobody was left to remove the run directory"
            out = subprocess.run([sys.executable, "-m", "harness.cli", "clean"], capture_output=True,
                                 text=True, timeout=DEADLINE_S)
            assert out.returncode == 0 and f"commbench-run-{p.pid}-" in out.stdout, out
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.netns
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
@pytest.mark.parametrize("sig", [signal.SIGKILL])  # TERM: the same clean-up as without namespaces
def test_signals_in_network_namespaces_leave_no_namespace(sig):
    p = _start("--net", "netns")
    try:
        _training(p)
        assert _namespaces_of(p.pid), "the run should hold namespaces while it trains"
        os.kill(p.pid, sig)
        p.communicate(timeout=DEADLINE_S)
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()


# ---- nothing listens beyond loopback -----------------------------------------------
def _listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of TCP sockets in LISTEN state held by ``pids`` (from /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((str(ipaddress.ip_address(words)), int(hexport, 16)))
    return out


def _assert_listening_on_loopback_only(pids: list[int]) -> None:
    socks = _listening(pids)
    assert socks, "gloo listens for its pair connections: the check must see them"
    outside = [(a, port) for a, port in socks if not ipaddress.ip_address(a).is_loopback]
    assert outside == [], f"listening beyond loopback during a single-host run: {outside}"


# ---- a stopped rank is named ------------------------------------------------------
@pytest.mark.parametrize("stopped", [1])
def test_a_stopped_gloo_rank_is_named_not_the_one_that_waited(stopped):
    p = _start(timeout=8)
    try:
        ranks = _training(p)
        os.kill(ranks[stopped], signal.SIGSTOP)
        code, err = _finish(p)
        assert code == 1, err
        line = _one_clear_line(err)
        assert f"rank {stopped} failed: stopped making progress: no sign of life" in line, line
        assert "timed out after 8 s" in line, line
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()


def test_a_rank_stopped_before_the_group_forms_is_named():
    # stopped while it starts (importing torch takes seconds): it never joins the process group
    p = _start("--world-size", "3", timeout=6)
    try:
        pid = _poll(lambda: _ranks_of(p.pid).get(1), "rank 1 to start")
        os.kill(pid, signal.SIGSTOP)
        code, err = _finish(p)
        assert code == 1, err
        line = _one_clear_line(err)
        assert "rank 1 failed: stopped making progress" in line, line
        assert "to join the process group" in line, line
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()


def test_a_stall_message_mentions_the_load_when_it_exceeds_the_cores():
    from harness.comm.progress_board import load_note

    assert load_note(load=35.0, cores=8).startswith("; the machine is overloaded (load average 35.0 on 8 cores)")
    assert load_note(load=3.0, cores=8) == ""


# ---- a rank that dies without a report ---------------------------------------------
def test_a_rank_that_dies_by_a_signal_is_named_with_its_last_output():
    # what a library prints before it aborts the process (gloo's enforce failures do) is the
    # only account of the death: the launcher's one line carries the rank's last output
    p = _start(timeout=30)
    try:
        ranks = _training(p)
        with open(_run_dirs_of(p.pid)[0] / "rank1.log", "a") as log:
            log.write("terminate called after throwing an instance of 'planted'\n")
        os.kill(ranks[1], signal.SIGABRT)
        code, err = _finish(p)
        assert code == 1, err
        line = _one_clear_line(err)
        assert "rank 1 failed: process died without a report (killed by signal 6)" in line, line
        said = line.split("; its last output: ", 1)[1]
        assert "terminate called after throwing an instance of 'planted'" in said, line
        _assert_nothing_left(p.pid)
    finally:
        if p.poll() is None:
            p.kill()
