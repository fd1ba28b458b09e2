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
