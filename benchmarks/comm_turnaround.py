"""Where a gloo Comm's ping-pong spends its time between gloo's calls: one rank's turnaround.

Two spawned gloo ranks play ping-pong through ``TorchDistComm`` (rank 1 sends back what it
received, as ``benchmarks.roundtrip_ratio`` does).  On rank 1, every round is stamped with
``time.perf_counter_ns`` at five points: when gloo's wait for the incoming message returns
(the wait of the work the Comm's receive posted), when the frame's header has been parsed
(``parse_frame_header``), when the frame has passed its checks and its payload is in hand
(``_frame``: the end marker and guard, the copy out of a reused buffer, the size
history), when ``recv`` hands back the payload (after the meter), and when ``send`` hands the
reply to gloo (the Comm's process group's ``send``).  The table gives, per size, the median of
each span over the rounds: what the Comm's own code adds to every round trip's critical path
beyond gloo's calls, on each side of a message, and where.  The stamps wrap four of the Comm's
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
    """The Comm's process group, stamping the moment a send reaches gloo and the moment the wait
    for a received message returns."""

    def __init__(self, pg, stamps: dict):
        self._pg, self._stamps = pg, stamps

    def send(self, *args):
        self._stamps["send"] = time.perf_counter_ns()
        return self._pg.send(*args)

    def recv(self, *args):
        return _StampedWork(self._pg.recv(*args), self._stamps)

    def recv_anysource(self, *args):
        return self._pg.recv_anysource(*args)


class _StampedWork:
    """A receive's work, stamping "woke" when its wait returns."""

    def __init__(self, work, stamps: dict):
        self._work, self._stamps = work, stamps

    def wait(self, *args):
        out = self._work.wait(*args)
        self._stamps["woke"] = time.perf_counter_ns()
        return out


def _stamped(fn, stamps: dict, key: str):
    """``fn``, stamping ``stamps[key]`` when it returns."""
    def stamped(*args, **kw):
        out = fn(*args, **kw)
        stamps[key] = time.perf_counter_ns()
        return out
    return stamped


#: The spans of the table: (name, from stamp, to stamp).
SPANS = (("wake -> header", "woke", "header"), ("header -> frame", "header", "frame"),
         ("frame -> payload", "frame", "payload"), ("payload -> gloo send", "payload", "send"),
         ("turnaround", "woke", "send"))


def _rank(rank: int, port: int, sizes: list[int], rounds: int, q) -> None:
    from harness.comm import torchdist
    from harness.comm.torchdist import TorchDistComm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0)
    stamps: dict[str, int] = {}
    comm._pg = _StampedGroup(comm._pg, stamps)
    comm._frame = _stamped(comm._frame, stamps, "frame")
    torchdist.parse_frame_header = _stamped(torchdist.parse_frame_header, stamps, "header")
    out = {}
    for size in sizes:
        t = torch.randint(0, 256, (size,), dtype=torch.uint8)
        spans: dict[str, list[float]] = {name: [] for name, _, _ in SPANS}
        comm.barrier()
        for i in range(WARMUP + rounds):
            if rank == 0:
                comm.send(t, 1, "pp")
                comm.recv(1, "pp")
                continue
            got = comm.recv(0, "pp")
            stamps["payload"] = time.perf_counter_ns()
            comm.send(got, 0, "pp")
            if i >= WARMUP:
                for name, lo, hi in SPANS:
                    spans[name].append((stamps[hi] - stamps[lo]) / 1e3)
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
    print("| bytes | gloo's wait returns -> header parsed | -> frame checked, payload in hand "
          "| -> `recv` returns | `send` called -> gloo's send | turnaround |")
    print("|---|---|---|---|---|---|")
    for size, spans in out.items():
        print(f"| {size:,} | " + " | ".join(f"{spans[name]:.1f}" for name, _, _ in SPANS) + " |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
