"""The benchmarks' pair of spawned ranks (``benchmarks.gloo_pair.run_pair``): a rank that dies
ends the benchmark with an error naming it, not a wait for the timeout, and the other rank,
left waiting, does not outlive it."""

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

    import torch.multiprocessing as mp

    pids = mp.get_context("spawn").Queue()
    with pytest.raises(RuntimeError, match=r"rank 1 died \(exit code 3\)"):
        run_pair(_rank_one_dies, pids, timeout_s=120)  # before: waited out timeout_s for the result
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
    with open(f"/proc/{pid}/stat") as f:  # a zombie no one reaped yet is gone too
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_the_ranks_end_with_the_benchmarks_process(tmp_path, sig):
    """A benchmark stopped by SIGTERM ends its ranks on the way out; one killed outright takes
    them with it (the kernel's parent-death signal), so no rank is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", "from benchmarks.gloo_pair import run_pair; "
                               "from checks.test_gloo_pair import _blocks; "
                               f"run_pair(_blocks, {str(tmp_path)!r}, timeout_s=300)"],
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
