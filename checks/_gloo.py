"""Run a function as the ranks of a real gloo group (one spawned process each).

For Comm-level checks; whole algorithms go through ``harness.launcher``.
The function must be picklable (module level, or functools.partial of one).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time

import torch
import torch.multiprocessing as mp

from harness.launcher import RankFailed


def _entry(fn, rank: int, world: int, port: int, q, timeout_s: float) -> None:
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


def run_gloo(world: int, fn, *, timeout_s: float = 60.0) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, q, timeout_s), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = time.monotonic() + timeout_s + 60
    try:
        while len(results) + len(errors) < world:
            try:
                rank, status, value = q.get(timeout=0.5)
                (results if status == "ok" else errors)[rank] = value
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs)
                    if p.exitcode not in (None, 0) and r not in results and r not in errors]
            if dead and all(p.exitcode is not None for p in procs):
                break
            if time.monotonic() > deadline:
                raise RankFailed(-1, "gloo ranks did not finish in time")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    died = [r for r, p in enumerate(procs) if r not in results and r not in errors]
    if died:
        raise RankFailed(died[0], f"process died (exit code {procs[died[0]].exitcode})")
    if errors:
        r = min(errors)
        raise RankFailed(r, errors[r])
    return [pickle.loads(results[r]) for r in range(world)]
