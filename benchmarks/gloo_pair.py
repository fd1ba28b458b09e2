"""Two spawned gloo ranks for a benchmark: each runs ``target(rank, port, *args, q)`` and puts
one result on ``q``; the results come back sorted by what each put first (its rank).  A rank
that dies ends the benchmark at once with an error naming it (its traceback is on stderr), not
after ``timeout_s``; the other rank, left waiting for it, is killed.  So are both when the
benchmark ends any other way: SIGTERM is an exit that cleans up, and on Linux a rank is killed
when the benchmark's process dies (``PR_SET_PDEATHSIG``), even by SIGKILL."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import sys
import threading
import time

import torch.multiprocessing as mp

_PR_SET_PDEATHSIG = 1


def _rank(target, *args) -> None:
    """A rank's process: dies with the benchmark's, then runs ``target``."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != mp.parent_process().pid:  # it died before the line above
            os._exit(1)
    target(*args)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_pair(target, *args, timeout_s: float = 600) -> list:
    previous = None  # SIGTERM unwinds (the ranks are ended), unless the program handles it itself
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run_pair(target, *args, timeout_s=timeout_s)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run_pair(target, *args, timeout_s: float) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(target, r, port, *args, q)) for r in range(2)]
    for pr in procs:
        pr.start()
    results: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) < len(procs):
            try:
                results.append(q.get(timeout=1.0))
                continue
            except queue.Empty:
                pass
            for r, pr in enumerate(procs):
                if pr.exitcode not in (None, 0):
                    raise RuntimeError(f"benchmark rank {r} died (exit code {pr.exitcode}); "
                                       "its traceback is above")
            if all(pr.exitcode is not None for pr in procs):
                raise RuntimeError("the benchmark's ranks ended without their results")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the benchmark's ranks gave no result within {timeout_s:g} s")
        return sorted(results)
    finally:  # a rank that hangs after a failure must not outlive the benchmark
        for pr in procs:
            pr.join(timeout=60 if len(results) == len(procs) else 0)
            if pr.is_alive():
                pr.kill()
                pr.join()
