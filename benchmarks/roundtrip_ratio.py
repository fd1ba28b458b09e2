"""The Comm's per-message cost against raw gloo: a ping-pong round trip and a burst of sends.

Two spawned gloo processes.  For each message size, every repeat times, in turn
(interleaved, the order rotating from one repeat to the next), ``--rounds`` round trips of a
uint8 tensor through each contestant; rank 0 takes the median round trip of each, and the table
gives the ratios per repeat, median [min, max]:

* raw: bare ``dist.send`` / ``dist.recv``;
* as the Comm posts: the Comm's transport calls without its Python or copies (a frame-sized
  ``isend`` left in flight as the Comm leaves it, a receive into a buffer of the size the Comm
  posts), so as posted / raw is the cost of its way of using gloo;
* posted + copies: those calls and the copies the Comm's protocol makes, with no other Python
  (the payload copied into its frame before the send; before a receive into the reused first
  buffer, the guard copied back over the bytes the last message wrote, and after it, the
  payload copied out; a frame of a size its pair expects received into a new buffer whose
  first bytes get the guard, handed on as it is), so posted + copies / raw is what the
  protocol's copies cost on top of gloo, a floor for any Comm that keeps them;
* the Comm: ``Comm.send`` / ``Comm.recv`` (framing, checks, byte meter), so Comm / posted +
  copies is what its checks, bookkeeping and layering add;
* the Comm with one frame in flight (``max_in_flight_frames=1``: a send waits for the one before
  it): its frames cycle two buffers through the payload's copy, not nine, so against the Comm it
  shows what the cache costs the default bound at large sizes (the copies contestant writes
  one frame).

It also times how long rank 0 takes to *issue* a burst of 8 sends (``dist.isend`` against
``Comm.send``, which posts without waiting): the caller's cost of handing off messages, the
median of 25 bursts of each per repeat, alternating.  CPU
time per round trip is printed beside the wall time; the load average too: the machine may be
shared, and only ratios of one run compare.

    python3 -m benchmarks.roundtrip_ratio [--sizes 16384,1048576] [--rounds 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import time
from collections import deque

import torch
import torch.distributed as dist

from benchmarks.gloo_pair import run_pair
from benchmarks.spread import extremes
from harness.comm.base import FRAME_HEADER_NBYTES, MAX_IN_FLIGHT_FRAMES
from harness.comm.byte_meter import FRAME_HEADER_BYTES
from harness.comm.torchdist import (
    BODY_SLACK,
    FIRST_BUFFER_NBYTES,
    INLINE_MAX_PAYLOAD,
    SIZED_MIN_PAYLOAD,
)

BURST = 8
BURSTS = 25  # bursts of each kind per repeat, alternating: one burst alone is a few hundred us


def _raw_round(t: torch.Tensor, buf: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.send(t, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _post(frame: torch.Tensor, dst: int, pending: deque) -> None:
    """A frame's ``isend``, left in flight as the Comm leaves it: waited on only once
    ``MAX_IN_FLIGHT_FRAMES`` others are."""
    pending.append(dist.isend(frame, dst))
    if len(pending) > MAX_IN_FLIGHT_FRAMES:
        pending.popleft().wait()


def _posted_round(frame: torch.Tensor, big: torch.Tensor, rank: int, pending: deque) -> None:
    """The Comm's transport calls without its Python or copies: a frame-sized send (``_post``)
    and a receive into a buffer of the size the Comm posts (its first buffer, or a large frame's
    own)."""
    if rank == 0:
        _post(frame, 1, pending)
        dist.recv(big, 1)
    else:
        dist.recv(big, 0)
        _post(frame, 0, pending)


class _Copies:
    """What the Comm copies per message at one payload size, with no other Python: its frame
    (``_send_frame``), its reused first buffer and guard (``_post_first``, ``_frame``), or
    a new buffer per frame at a size its pair expects (``_sized_buffer``)."""

    def __init__(self, size: int):
        self.size = size
        self.frame = torch.randint(0, 256, (size + FRAME_HEADER_BYTES,), dtype=torch.uint8)
        self.sized = size >= SIZED_MIN_PAYLOAD  # the Comm sends this size as one message once it repeats
        self.top = max(FIRST_BUFFER_NBYTES, size + FRAME_HEADER_BYTES + 8)
        self.first = torch.empty(FIRST_BUFFER_NBYTES, dtype=torch.uint8)
        self.guard = os.urandom(FIRST_BUFFER_NBYTES)

    def framed(self, payload: torch.Tensor) -> torch.Tensor:
        ctypes.memmove(self.frame.data_ptr() + FRAME_HEADER_NBYTES, payload.data_ptr(), self.size)
        return self.frame

    def recv(self, src: int) -> torch.Tensor:
        if self.sized:
            buf = torch.empty(self.top, dtype=torch.uint8)
            ctypes.memmove(buf.data_ptr(), self.guard, FIRST_BUFFER_NBYTES)
            dist.recv(buf, src)
            return buf[FRAME_HEADER_NBYTES: FRAME_HEADER_NBYTES + self.size]
        ctypes.memmove(self.first.data_ptr(), self.guard, self.size + FRAME_HEADER_BYTES)
        dist.recv(self.first, src)
        out = torch.empty(self.size, dtype=torch.uint8)
        ctypes.memmove(out.data_ptr(), self.first.data_ptr() + FRAME_HEADER_NBYTES, self.size)
        return out


def _copied_round(copies: _Copies, t: torch.Tensor, rank: int, pending: deque) -> None:
    """``_posted_round`` plus the copies the Comm makes (:class:`_Copies`); rank 1 sends back
    what it received, as through the Comm."""
    if rank == 0:
        _post(copies.framed(t), 1, pending)
        copies.recv(1)
    else:
        _post(copies.framed(copies.recv(0)), 0, pending)


def _comm_round(comm, t: torch.Tensor, rank: int) -> None:
    if rank == 0:
        comm.send(t, 1, "pp")
        comm.recv(1, "pp")
    else:
        comm.send(comm.recv(0, "pp"), 0, "pp")


def _timed(fn, rounds: int) -> tuple[float, float]:
    """(median wall s, mean CPU s) of one call of ``fn``."""
    walls = []
    c0 = time.process_time()
    for _ in range(rounds):
        w0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
    return statistics.median(walls), (time.process_time() - c0) / rounds


def _bursts(comm, t: torch.Tensor, buf: torch.Tensor, rank: int) -> tuple[float, float]:
    """Rank 0's median time to hand off ``BURST`` sends of ``t`` through ``dist.isend`` and
    through ``comm``, ``BURSTS`` of each, alternating (the receiver drains each burst before the
    next starts); 0.0 on rank 1."""
    raw, com = [], []
    for _ in range(BURSTS):
        dist.barrier()
        if rank == 0:
            w0 = time.perf_counter()
            works = [dist.isend(t, 1) for _ in range(BURST)]
            raw.append(time.perf_counter() - w0)
            for w in works:
                w.wait()
        else:
            for _ in range(BURST):
                dist.recv(buf, 0)
        comm.barrier()  # the Comm's sends of the last burst delivered, as every burst starts
        if rank == 0:
            w0 = time.perf_counter()
            for _ in range(BURST):
                comm.send(t, 1, "burst")
            com.append(time.perf_counter() - w0)
        else:
            for _ in range(BURST):
                comm.recv(0, "burst")
    comm.barrier()
    return (statistics.median(raw), statistics.median(com)) if rank == 0 else (0.0, 0.0)


def _rank(rank: int, port: int, sizes: list[int], rounds: int, repeats: int, q) -> None:
    from harness.comm.torchdist import TorchDistComm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0)
    comm1 = TorchDistComm("gloo", timeout_s=120.0, max_in_flight_frames=1)
    rows = []
    for size in sizes:
        t = torch.randint(0, 256, (size,), dtype=torch.uint8)
        buf = torch.empty_like(t)
        frame = torch.randint(0, 256, (size + FRAME_HEADER_BYTES,), dtype=torch.uint8)
        big = torch.empty(max(FIRST_BUFFER_NBYTES, size + FRAME_HEADER_BYTES + BODY_SLACK), dtype=torch.uint8)
        pending: deque = deque()
        posted = functools.partial(_posted_round, frame, big, rank, pending)
        copied = functools.partial(_copied_round, _Copies(size), t, rank, pending)
        for _ in range(3):  # warm every path
            _raw_round(t, buf, rank)
            posted()
            copied()
            _comm_round(comm, t, rank)
            _comm_round(comm1, t, rank)
        timed = {"raw": functools.partial(_raw_round, t, buf, rank), "posted": posted, "copied": copied,
                 "comm": functools.partial(_comm_round, comm, t, rank),
                 "comm1": functools.partial(_comm_round, comm1, t, rank)}
        names = list(timed)
        for k in range(repeats):
            got = {}
            for name in names[k % len(names):] + names[:k % len(names)]:  # the order rotates per repeat
                dist.barrier()
                got[name] = _timed(timed[name], rounds)
                while pending:  # the posted sends of "posted" and "copied", as the Comm's barrier does
                    pending.popleft().wait()
            raw, pat, cop, com, com1 = (got[name] for name in names)
            raw_burst, com_burst = _bursts(comm, t, buf, rank)
            rows.append((size, raw, com, raw_burst, com_burst, pat, cop, com1))
    q.put((rank, rows if rank == 0 else None))
    comm1.barrier()  # its sends delivered before the group goes
    comm.close()  # also leaves the process group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16384,1048576", help="message bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if any(INLINE_MAX_PAYLOAD < s < SIZED_MIN_PAYLOAD for s in sizes):  # header and body: not modelled
        ap.error(f"--sizes: the Comm sends {INLINE_MAX_PAYLOAD + 1}..{SIZED_MIN_PAYLOAD - 1} bytes as "
                 "two messages, which the posted + copies contestant does not model")
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}  torch {torch.__version__}")
    rows = run_pair(_rank, sizes, a.rounds, a.repeats, timeout_s=3600)[0][1]
    print(f"gloo, 2 processes, {a.rounds} round trips per repeat, {a.repeats} interleaved repeats")
    print("| bytes | raw round trip | as the Comm posts | posted + copies | Comm round trip "
          "| Comm, one frame in flight | posted / raw "
          "| posted + copies / raw | Comm / raw | Comm, one frame in flight / raw | Comm / as posted "
          "| Comm / posted + copies | raw burst of 8 | Comm burst of 8 | Comm / raw |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    med = statistics.median

    def cell(times: list[tuple[float, float]]) -> str:
        return f"{1e6 * med(w for w, _ in times):.0f} us (cpu {1e6 * med(c for _, c in times):.0f})"

    for size in sizes:
        mine = [r for r in rows if r[0] == size]
        raw, com, pat, cop, com1 = ([r[k] for r in mine] for k in (1, 2, 5, 6, 7))
        bu = [r[4] / r[3] for r in mine if r[3] > 0]
        def ratio(a, b) -> str:
            return extremes([x[0] / y[0] for x, y in zip(a, b, strict=True)])

        print(f"| {size:,} | {cell(raw)} | {cell(pat)} | {cell(cop)} | {cell(com)} | {cell(com1)} "
              f"| {ratio(pat, raw)} | {ratio(cop, raw)} | {ratio(com, raw)} | {ratio(com1, raw)} "
              f"| {ratio(com, pat)} | {ratio(com, cop)} "
              f"| {1e3 * med(r[3] for r in mine):.2f} ms | {1e3 * med(r[4] for r in mine):.2f} ms | {extremes(bu)} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
