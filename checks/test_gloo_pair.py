"""The spawned rank processes of the checks and benchmarks (``harness.rank_processes``), as the
benchmarks' pair uses them (``benchmarks.gloo_pair.run_pair``): a rank that dies ends the
benchmark with an error naming it, not a wait for the timeout, and the other rank, left
waiting, does not outlive it; as the checks use them (``checks._gloo.run_gloo``): the others
have their grace to say what they saw of the dead rank."""

from __future__ import annotations

import threading

import pytest

from benchmarks.gloo_pair import run_pair


def _rank_one_dies(rank: int, port: int, pids, q) -> None:
    import os

    pids.put(os.getpid())
    if rank == 1:
        raise SystemExit(3)
    threading.Event().wait()  # rank 0 stands for a rank blocked on its dead peer


def _nobody_answers(rank: int, port: int, q) -> None:
    pass


def test_a_rank_that_dies_is_named_at_once_and_its_peer_is_killed():
    import os
    import time

    import torch.multiprocessing as mp

    pids = mp.get_context("spawn").Queue()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 died \(exit code 3\)"):
        run_pair(_rank_one_dies, pids, timeout_s=600)  # before: waited out timeout_s for the result
    assert time.monotonic() - t0 < 300  # at once, not after the timeout (a liveness bound)
    for pid in (pids.get(timeout=10), pids.get(timeout=10)):
        with pytest.raises(ProcessLookupError):  # both ended (and were reaped by run_pair)
            os.kill(pid, 0)


def test_ranks_that_end_without_a_result_are_an_error():
    with pytest.raises(RuntimeError, match="ended without their results"):
        run_pair(_nobody_answers, timeout_s=120)


def _blocks(rank: int, port: int, pid_dir: str, q) -> None:
    import os
    from pathlib import Path

    Path(pid_dir, f"rank{rank}.tmp").write_text(str(os.getpid()))
    Path(pid_dir, f"rank{rank}.tmp").rename(Path(pid_dir, f"rank{rank}"))
    threading.Event().wait()


def _gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie no one reaped yet is gone too
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:  # reaped between the signal and the read
        return True


#: How a process starts its ranks: a benchmark's fresh interpreters, and the checks' ranks forked
#: from a server that imported torch (whose parent is that server, not the process that asked)
STARTS = {"spawned": "from benchmarks.gloo_pair import run_pair as start; kw = {}",
          "forked": "from harness.rank_processes import spawn_ranks; kw = dict(preload=('torch',)); "
                    "start = lambda *a, **k: spawn_ranks(2, *a, **k)"}


@pytest.mark.parametrize("start", list(STARTS))
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_the_ranks_end_with_the_benchmarks_process(tmp_path, sig, start):
    """A benchmark stopped by SIGTERM ends its ranks on the way out; one killed outright takes
    them with it (a spawned rank by the kernel's parent-death signal; a forked one, whose parent is
    the server, by its thread watching the process that asked for it), so no rank is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", f"{STARTS[start]}; "
                               "from checks.test_gloo_pair import _blocks; "
                               f"start(_blocks, {str(tmp_path)!r}, timeout_s=300, **kw)"],
                              cwd=os.getcwd(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"rank{r}").exists() for r in range(2)):
        assert parent.poll() is None and time.monotonic() < deadline, parent.stderr.read()
        time.sleep(0.05)  # polling for files the ranks write, not a synchronisation by delay
    pids = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    parent.send_signal(getattr(signal, sig))
    parent.wait(timeout=60)
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"ranks {pids} outlived the benchmark"
        time.sleep(0.05)
    if sig == "SIGTERM":
        assert parent.returncode == 128 + signal.SIGTERM


def _one_dies_and_the_other_sees_it(rank: int, port: int, fifo: str, q) -> None:
    import os
    import time

    if rank == 1:
        with open(fifo, "wb") as f:
            f.write(str(os.getpid()).encode())
        os._exit(3)  # no result
    with open(fifo, "rb") as f:
        pid = int(f.read())
    while True:  # until reaped: the spawner has seen the death, and its grace has begun
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)  # polling for the reaping, not a synchronisation by delay
    q.put((0, "rank 0 saw its peer die"))


@pytest.mark.parametrize("grace_s", [None, 60.0])
def test_after_a_death_the_other_ranks_have_their_grace_to_report(tmp_path, grace_s):
    """``spawn_ranks`` with a grace: a rank that dies without a result does not cut short the
    ranks left waiting for it; both outcomes come back, the dead rank with its exit code."""
    import os

    from harness.rank_processes import spawn_ranks

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results, died = spawn_ranks(2, _one_dies_and_the_other_sees_it, str(fifo), timeout_s=120, grace_s=grace_s)
    assert results == [(0, "rank 0 saw its peer die")]
    assert died == {1: 3}


def _imported(rank: int, port: int, module: str, q) -> None:
    import sys

    q.put((rank, module in sys.modules))


def test_ranks_start_with_the_modules_they_are_given_and_no_others():
    """``preload``: a rank starts with the modules imported, forked from a server that imported
    them or, when this process's server was started with others, importing them itself; without
    it each rank is a fresh interpreter (``colorsys``: a module no rank imports otherwise)."""
    from harness.rank_processes import spawn_ranks

    def imported(preload):
        results, died = spawn_ranks(2, _imported, "colorsys", timeout_s=120, preload=preload)
        assert not died
        return [r[1] for r in results]

    assert imported(("json",)) == [False, False]  # the server, if this starts it, lacks colorsys
    assert imported(("colorsys",)) == [True, True]
    assert imported(()) == [False, False]
