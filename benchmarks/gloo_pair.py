"""Two spawned gloo ranks for a benchmark (:func:`harness.rank_processes.spawn_ranks`): each
runs ``target(rank, port, *args, q)`` and puts one result on ``q``; the results come back sorted
by what each put first (its rank).  A rank that dies ends the benchmark at once with an error
naming it (its traceback is on stderr), not after ``timeout_s``; the other rank, left waiting
for it, is killed.  So are both when the benchmark ends any other way."""

from __future__ import annotations

from harness.rank_processes import spawn_ranks


def run_pair(target, *args, timeout_s: float = 600) -> list:
    try:
        results, died = spawn_ranks(2, target, *args, timeout_s=timeout_s)
    except TimeoutError as e:
        raise TimeoutError(f"the benchmark's ranks gave no result within {timeout_s:g} s") from e
    for r, code in died.items():
        if code != 0:
            raise RuntimeError(f"benchmark rank {r} died (exit code {code}); its traceback is above")
    if died:
        raise RuntimeError("the benchmark's ranks ended without their results")
    return results
