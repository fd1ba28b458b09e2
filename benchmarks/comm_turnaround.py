"""Where a gloo Comm's ping-pong spends its time between gloo's calls: one rank's turnaround.

Two spawned gloo ranks play ping-pong through ``TorchDistComm`` (rank 1 sends back what it
received, as ``benchmarks.roundtrip_ratio`` does).  On rank 1, every round is stamped with
``time.perf_counter_ns`` at three points: when gloo's wait for the incoming message returns
(inside the Comm's ``_wait_message``), when ``recv`` hands back the payload, and when ``send``
hands the reply to gloo (the Comm's process group's ``send``).  The table gives, per size, the
median of each span over the rounds: what the Comm's own code adds to every round trip's
critical path beyond gloo's calls, on each side of a message.  The stamps wrap two of the Comm's
internals, so they add a few hundred nanoseconds of their own.

    python3 -m benchmarks.comm_turnaround [--sizes 16384,1048576] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks.gloo_pair import run_pair

WARMUP = 20


class _StampedGroup:
    """The Comm's process group, stamping the moment a send reaches gloo."""

    def __init__(self, pg, stamps: dict):
        self._pg, self._stamps = pg, stamps

    def send(self, *args):
        self._stamps["send"] = time.perf_counter_ns()
        return self._pg.send(*args)

    def recv(self, *args):
        return self._pg.recv(*args)

    def recv_anysource(self, *args):
        return self._pg.recv_anysource(*args)


def _rank(rank: int, port: int, sizes: list[int], rounds: int, q) -> None:
    from harness.comm.torchdist import TorchDistComm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0)
    stamps: dict[str, int] = {}
    comm._pg = _StampedGroup(comm._pg, stamps)
    wait_message = comm._wait_message

    def stamped_wait(work, src, what):
        got = wait_message(work, src, what)
        stamps["woke"] = time.perf_counter_ns()
        return got

    comm._wait_message = stamped_wait
    out = {}
    for size in sizes:
        t = torch.randint(0, 256, (size,), dtype=torch.uint8)
        spans: dict[str, list[float]] = {"woke -> payload": [], "payload -> gloo send": [], "turnaround": []}
        comm.barrier()
        for i in range(WARMUP + rounds):
            if rank == 0:
                comm.send(t, 1, "pp")
                comm.recv(1, "pp")
                continue
            got = comm.recv(0, "pp")
            handed = time.perf_counter_ns()
            comm.send(got, 0, "pp")
            if i >= WARMUP:
                spans["woke -> payload"].append((handed - stamps["woke"]) / 1e3)
                spans["payload -> gloo send"].append((stamps["send"] - handed) / 1e3)
                spans["turnaround"].append((stamps["send"] - stamps["woke"]) / 1e3)
        out[size] = {k: statistics.median(v) for k, v in spans.items()} if rank == 1 else None
    q.put((rank, out))
    comm.close()  # also leaves the process group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16384,1048576", help="message bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=2000)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}  torch {torch.__version__}")
    out = run_pair(_rank, sizes, a.rounds, timeout_s=3600)[1][1]
    print(f"gloo, 2 processes, {a.rounds} round trips per size; rank 1's spans, median µs")
    print("| bytes | gloo's wait returns -> `recv` returns | `send` called -> gloo's send | turnaround |")
    print("|---|---|---|---|")
    for size, spans in out.items():
        print(f"| {size:,} | {spans['woke -> payload']:.1f} | {spans['payload -> gloo send']:.1f} "
              f"| {spans['turnaround']:.1f} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
