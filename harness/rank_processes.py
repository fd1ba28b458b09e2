"""Spawned rank processes for the checks and benchmarks that need a real process group
(``checks._gloo.run_gloo``, ``benchmarks.gloo_pair.run_pair``); runs go through
``harness.launcher``.

Each of ``world`` spawned processes runs ``target(rank, port, *args, q)`` and puts one tuple
``(rank, ...)`` on ``q``; ``port`` is a free loopback port for the group's rendezvous.  A rank
dies with the process that spawned it (``PR_SET_PDEATHSIG`` on Linux), even one killed by
SIGKILL, and SIGTERM is an exit that ends the ranks, unless the program handles it itself.
Nothing outlives :func:`spawn_ranks`: a rank still running when it returns or raises is killed.

A rank is a fresh interpreter (``spawn``) unless the caller names modules to ``preload``: it is
then forked from a server process that imported them once (``forkserver``), which spares each
rank its imports (``import torch`` takes seconds of CPU).  A process has one server, which
imports the modules of the first call that names any; a rank imports any others it is given
itself.  The checks use it; the benchmarks keep fresh interpreters.  A forked rank's parent is
the server, which lives on as long as any rank it forked does, so a forked rank watches the
process that asked for it instead and kills itself when that one ends (a daemon thread waiting
on multiprocessing's parent sentinel).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import queue
import signal
import socket
import sys
import threading
import time

import torch.multiprocessing as mp

_PR_SET_PDEATHSIG = 1


def _rank(target, preload: tuple[str, ...], *args) -> None:
    """A rank's process: dies with its parent, has ``preload`` imported, then runs ``target``."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if not mp.parent_process().is_alive():  # it died before the line above
            os._exit(1)
    if preload:  # forked: its parent-death signal is the server's, not the asker's
        threading.Thread(target=_die_with, args=(mp.parent_process(),), name="rank-dies-with-its-asker",
                         daemon=True).start()
    for name in preload:  # already there when the server imported it (a no-op then)
        importlib.import_module(name)
    target(*args)


def _die_with(parent) -> None:
    parent.join()  # returns once the process that asked for this rank has ended, however
    os.kill(os.getpid(), signal.SIGKILL)  # as the parent-death signal ends a spawned rank


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def spawn_ranks(world: int, target, *args, timeout_s: float, grace_s: float | None = 0.0,
                preload: tuple[str, ...] = ()) -> tuple[list[tuple], dict[int, int]]:
    """Run ``world`` ranks of ``target``; returns (the tuples they put, sorted by rank, and the
    exit code of each rank that ended without putting one, in the order they were seen).

    It returns once every rank has put its tuple or ended.  After the first rank that ended
    without one, the others have ``grace_s`` seconds more (None: up to ``timeout_s``; a rank
    left waiting for a dead peer may need its Comm's timeout to say so), then are killed.
    TimeoutError when ``timeout_s`` passes first."""
    previous = None  # SIGTERM unwinds (the ranks are ended), unless the program handles it itself
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _spawn(world, target, args, timeout_s, grace_s, preload)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _spawn(world: int, target, args: tuple, timeout_s: float, grace_s: float | None,
           preload: tuple[str, ...]):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("forkserver" if preload else "spawn")
    if preload:  # taken when the server starts: a later call's other modules its ranks import
        ctx.set_forkserver_preload(list(preload))
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(target, preload, r, port, *args, q)) for r in range(world)]
    for pr in procs:
        pr.start()
    results: dict[int, tuple] = {}
    died: dict[int, int] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) + len(died) < world:
            try:
                got = q.get(timeout=0.5)
                results[got[0]] = got
                continue
            except queue.Empty:
                pass
            for r, pr in enumerate(procs):  # a rank's tuple is put before it ends: read first
                if pr.exitcode is not None and r not in results and r not in died and q.empty():
                    died[r] = pr.exitcode
                    if len(died) == 1 and grace_s is not None:
                        deadline = min(deadline, time.monotonic() + grace_s)
            if len(results) + len(died) < world and time.monotonic() > deadline:
                if died:
                    break  # the grace after a death ran out: those left are killed below
                raise TimeoutError(f"the ranks gave no result within {timeout_s:g} s")
        return [results[r] for r in sorted(results)], died
    finally:
        for pr in procs:  # what is left after a failure must not outlive this call
            pr.join(timeout=60 if len(results) == world else 0)
            if pr.is_alive():
                pr.kill()
                pr.join()
