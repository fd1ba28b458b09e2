"""Two spawned gloo ranks for a benchmark: each runs ``target(rank, port, *args, q)`` and puts
one result on ``q``; the results come back sorted by what each put first (its rank)."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp


def run_pair(target, *args, timeout_s: float = 600) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, *args, q)) for r in range(2)]
    for pr in procs:
        pr.start()
    try:
        return sorted(q.get(timeout=timeout_s) for _ in procs)
    finally:  # a rank that hangs after a failure must not outlive the benchmark
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()
                pr.join()
