"""The gloo Comm of this tree against another commit's, per round trip, in one pair of processes.

Extract the other commit's Comm package first (it imports only itself)::

    mkdir -p old-comm && git archive BASE harness/comm | tar -x -C old-comm
    python3 -m benchmarks.comm_before_after old-comm/harness/comm [--sizes 16384,1048576] [--rounds 2000]

Two spawned gloo ranks hold both Comms and run ``roundtrip_ratio``'s ping-pong with raw
``dist.send`` / ``recv``, the old Comm and this one in turn, in an order drawn at random every
round (``turns``), one round trip per turn (``--block K``: K back to back): as a pipeline calls
the Comm, between other work, not in a hot loop.  Rank 0 times every round trip; the table gives, per size, the median
round trip of each and the ratios between the turns of one round, median [quartiles], and for
now / before the 95 % interval of its median (``spread.median_interval``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks import progress
from benchmarks.gloo_pair import run_pair
from benchmarks.other_commit import load_package
from benchmarks.roundtrip_ratio import _comm_round, _raw_round
from benchmarks.spread import median_interval, quartiles
from benchmarks.turns import turn_order

CONTESTANTS = ("raw gloo", "Comm before", "Comm now")


def _rank(rank: int, port: int, old_path: str, sizes: list[int], rounds: int, block: int, q) -> None:
    from harness.comm.torchdist import TorchDistComm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    load_package(old_path, "oldcomm")
    old = importlib.import_module("oldcomm.torchdist")
    comms = (old.TorchDistComm("gloo", timeout_s=120.0), TorchDistComm("gloo", timeout_s=120.0))
    out = {}
    for size in sizes:
        t = torch.randint(0, 256, (size,), dtype=torch.uint8)
        buf = torch.empty_like(t)
        fns = [functools.partial(_raw_round, t, buf, rank), *(functools.partial(_comm_round, c, t, rank) for c in comms)]
        for _ in range(5):  # every path warm
            for fn in fns:
                fn()
        comms[1].barrier()
        times = [[] for _ in fns]
        for r in progress.rounds(rounds, f"comm_before_after, {size} bytes", report=rank == 0):
            for i in turn_order(r, range(len(fns))):
                for _ in range(block):
                    w0 = time.perf_counter()
                    fns[i]()
                    times[i].append(time.perf_counter() - w0)
        comms[0].barrier()  # the old Comm's sends waited on before the next size
        out[size] = times
    q.put((rank, out))
    comms[0].barrier()
    comms[1].close()  # also leaves the process group (after waiting for both Comms' sends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="another commit's harness/comm package directory")
    ap.add_argument("--sizes", default="16384,1048576", help="message bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--block", type=int, default=1, help="round trips per contestant's turn")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.old, "torchdist.py")):
        ap.error(f"{a.old}: not a harness/comm package (no torchdist.py)")
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}  torch {torch.__version__}")
    out = run_pair(_rank, os.path.abspath(a.old), sizes, a.rounds, a.block, timeout_s=3600)[0][1]
    print(f"gloo, 2 processes, {a.rounds} rounds of {a.block} round trip(s) per contestant, order drawn per round")
    print("| bytes | " + " | ".join(f"{c} round trip" for c in CONTESTANTS)
          + " | before / raw | now / raw | now / before | now / before: the median's 95 % interval |")
    print("|---" * 8 + "|")

    for size, (raw, old, new) in out.items():
        now_before = [n / o for n, o in zip(new, old, strict=True)]
        print(f"| {size:,} | " + " | ".join(f"{1e6 * statistics.median(v):.0f} us" for v in (raw, old, new))
              + f" | {quartiles([o / r for o, r in zip(old, raw, strict=True)])}"
              f" | {quartiles([n / r for n, r in zip(new, raw, strict=True)])}"
              f" | {quartiles(now_before)} | {median_interval(now_before)} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
