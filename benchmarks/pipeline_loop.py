"""One contestant of ``pipeline_interleaved``, step after step in a pair of gloo processes, for a
profiler or a system-call counter to attach to (a timing of its own is not the point: the
interleaved benchmark times).  Each rank prints its pid and its gloo threads' ids once warm.

    python3 -m benchmarks.pipeline_loop "engine[1f1b]" [--steps 1500] [--post-ahead]
    perf stat -e syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvfrom -t TID,TID -- sleep 3

``--post-ahead`` makes the engine's 1F1B post its receives ahead as GPipe does
(``engine.POSTS_AHEAD``), the choice its docstring measured against.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.gloo_pair import run_pair
from benchmarks.pipeline_interleaved import CONTESTANTS, _contestants
from benchmarks.pipelining_ratio import engine_config

WARM = 10  # steps before the ids are printed


def _rank(rank: int, port: int, cfg, name: str, steps: int, post_ahead: bool, q) -> None:
    from algorithms.pipeline import engine
    from algorithms.pipeline.local import batch
    from harness.comm.torchdist import TorchDistComm

    if post_ahead:
        engine.POSTS_AHEAD["1f1b"] = True
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(cfg.threads_per_rank or 1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0)
    _, opt, step, _ = _contestants(cfg, rank, comm)[name]
    for s in range(steps):
        if s == WARM:
            gloo = [t for t in sorted(os.listdir("/proc/self/task"))
                    if Path(f"/proc/self/task/{t}/comm").read_text().startswith("gloo")]
            # one write of the whole line: the two ranks share the pipe, and print's separate writes
            # of the text and its newline interleaved with the other rank's
            os.write(2, f"rank {rank}: pid {os.getpid()}, gloo threads {','.join(gloo)}\n".encode())
        ids, labels = batch(cfg, s, "cpu")
        opt.zero_grad(set_to_none=True)
        step(ids, labels)
        opt.step()
    q.put((rank, None))
    comm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("contestant", choices=CONTESTANTS)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--post-ahead", action="store_true", help="the engine's 1F1B posts its receives ahead")
    ap.add_argument("--model", default="tiny-opt")
    a = ap.parse_args()
    if a.steps <= WARM:
        ap.error(f"--steps must be above {WARM}")
    cfg = engine_config("gpipe", model=a.model, batch_size=8, seq_len=64, micro_batches=4, steps=a.steps)
    run_pair(_rank, cfg, a.contestant, a.steps, a.post_ahead, timeout_s=24 * 3600)


if __name__ == "__main__":
    main()
