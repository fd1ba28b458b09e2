"""Run a function as the ranks of a real gloo group (one spawned process each).

For Comm-level checks; whole algorithms go through ``harness.launcher``.
The function must be picklable (module level, or functools.partial of one).
"""

from __future__ import annotations

import os
import pickle

import torch

from harness.launcher import RankFailed
from harness.rank_processes import spawn_ranks

#: What every rank imports: imported once, by the server the ranks are forked from
#: (``harness.rank_processes``), not by each rank.
PRELOAD = ("torch", "harness.comm.torchdist", "checks._gloo")


def _entry(rank: int, port: int, fn, world: int, timeout_s: float, q) -> None:
    from harness.comm.torchdist import TorchDistComm, init_process_group_from_env

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        init_process_group_from_env("gloo", timeout_s)
        comm = TorchDistComm("gloo", timeout_s=timeout_s)
        q.put((rank, "ok", pickle.dumps(fn(comm))))
        comm.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None


def run_gloo(world: int, fn, *, timeout_s: float = 60.0, fresh: bool = False) -> list:
    """``fn(comm)`` on every rank of a gloo group of ``world`` processes, its results in rank
    order; RankFailed for a rank that died (once the others, left waiting for it, have said so
    within their Comm's timeout) or raised (the lowest such rank).  ``fresh``: each rank a new
    interpreter, not forked (for a peak RSS that must not count the pages a forked rank faults
    in from its server's imports as it runs)."""
    try:
        reports, died = spawn_ranks(world, _entry, fn, world, timeout_s, timeout_s=timeout_s + 60, grace_s=None,
                                    preload=() if fresh else PRELOAD)
    except TimeoutError:
        raise RankFailed(-1, "gloo ranks did not finish in time") from None
    if died:
        r, code = next(iter(died.items()))
        raise RankFailed(r, f"process died (exit code {code})")
    errors = [(rank, value) for rank, status, value in reports if status == "error"]
    if errors:
        raise RankFailed(*errors[0])
    return [pickle.loads(value) for _, _, value in reports]
