"""In-process backend: every rank is a thread, messages are copied tensors.

Fast enough for property checks, and it follows the same contract as the
process backends: payloads are copied (a sender may reuse its buffer), tags
must match, every wait has a timeout, and when one rank fails every other
rank's next wait raises instead of hanging.  A send completes once its receive
is posted, as on gloo, and a rank waits for its sends where gloo's must: past
the in-flight bound (``base.MAX_IN_FLIGHT_FRAMES``) and at every collective; so
a program that would stop on gloo stops here too, where the checks run.  A
mailbox holds frames in the process backends' format (header bytes, body with
end marker; the frame protocol in ``base``), checked the same way on receipt.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .base import (
    FRAME_END,
    FRAME_END_NBYTES,
    FRAME_HEADER_NBYTES,
    Comm,
    CommError,
    CommTimeout,
    RankFailed,
    check_frame_end,
    pack_frame_header,
    parse_frame_header,
)
from .progress_board import ProgressBoard

_END = torch.frombuffer(bytearray(FRAME_END), dtype=torch.uint8)


def _in_flight(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that no rank's tensor meter counts while it waits in a mailbox or a
    collective slot.  On the process backends a message in flight lies in the transport, not in
    either rank's tensors; counted in the sender's meter here, it would stay there until the
    receiving *thread* let it go, and the sender's peak would depend on how the threads were
    scheduled (two runs of a config would disagree).  The receiver counts it from its first op
    on it, as a process backend's receiver counts its receive buffer."""
    with _disable_current_modes():
        return t.clone()


class ThreadsWorld:
    """Shared state of one in-process world: mailboxes and collective slots."""

    def __init__(self, world_size: int, timeout_s: float = 120.0, device: torch.device | str | None = None):
        self.world_size = world_size
        self.timeout_s = timeout_s
        # Where the ranks compute (their RankContext reads ``comm.device``): the CPU by
        # default; a CUDA device puts every rank thread on that one GPU (a 2-stage
        # pipeline on one card).  Frames still travel as host bytes, as nccl's
        # receives hand them back (harness/comm/torchdist.py).
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cond = threading.Condition()
        self.mail: dict[tuple[int, int], deque] = {}
        self.slots: dict[int, dict] = {}
        self.failed: str | None = None
        self.seq = 0  # global arrival order of point-to-point messages (for recv_any)
        # per (sender, receiver): frames sent, and receives posted for them (a frame whose
        # receive is posted has completed its send, as on gloo: ThreadsComm._wait_sends)
        self.sent: dict[tuple[int, int], int] = {}
        self.claimed: dict[tuple[int, int], int] = {}
        self.board = ProgressBoard.in_memory(world_size)
        self.done = 0  # rank threads that returned or raised

    def fail(self, reason: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = reason
            self.cond.notify_all()

    def wait_for(self, predicate, what: str, rank: int):
        """Wait (under self.cond) until predicate() is truthy, a peer fails, or timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.failed is not None:
                raise CommError(f"rank {rank}: {what} aborted because {self.failed}")
            value = predicate()
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"rank {rank}: {what} timed out after {self.timeout_s:g} s")
            self.cond.wait(left)

    def comm(self, rank: int, **kw) -> ThreadsComm:
        return ThreadsComm(self, rank, **kw)


class ThreadsComm(Comm):
    backend = "threads"

    def __init__(self, world: ThreadsWorld, rank: int, **kw):
        kw.setdefault("timeout_s", world.timeout_s)
        kw.setdefault("board", world.board)
        super().__init__(rank, world.world_size, **kw)
        self.world = world
        self.device = world.device
        self._op = 0  # collective sequence number of this rank
        # self._sends holds (receiver, its index in the pair, bytes) per send not yet waited on:
        # waited on past the bound and at every collective, as gloo's are
        self._ahead: dict[int, deque[_PostedFrame]] = {}  # receives posted ahead, per peer

    def _send_frame(self, data, dst, taghash):
        w = self.world
        with w.cond:
            if w.failed is not None:
                raise CommError(f"rank {self.rank}: send aborted because {w.failed}")
            w.seq += 1
            if data.device.type != "cpu":  # a device payload crosses as host bytes
                data = data.cpu()
            # the send buffer, counted by the sender while it exists, as on the process backends
            body = torch.cat([data, _END])
            frame = (w.seq, pack_frame_header(data.numel(), taghash), _in_flight(body))
            del body
            w.mail.setdefault((self.rank, dst), deque()).append(frame)
            pair, nbytes = (self.rank, dst), FRAME_HEADER_NBYTES + frame[2].numel()
            # the mailbox holds the frame now: a reference kept here while this rank waits at the
            # bound would keep the receiver's counted copy alive after it let go, so its peak
            # would depend on when this thread returned
            del frame
            index = w.sent.get(pair, 0)
            w.sent[pair] = index + 1
            self._sends.append((dst, index, nbytes))
            self._sends_bytes += nbytes
            w.cond.notify_all()
            self._wait_to_the_bound(self._wait_oldest_send)

    def _wait_oldest_send(self) -> None:
        """Wait (under the world's lock) until the receive of this rank's oldest send not yet
        waited on is posted: what a gloo send's wait waits for."""
        w = self.world
        dst, index, nbytes = self._sends[0]
        pair = (self.rank, dst)
        w.wait_for(lambda: w.claimed.get(pair, 0) > index, f"send to rank {dst}", self.rank)
        self._sends.popleft()
        self._sends_bytes -= nbytes

    def _wait_sends(self) -> None:
        """A synchronisation point: every send has its receive posted, as gloo waits for every
        posted send before a collective (a program that sends, then enters a collective the
        receiver enters before receiving, stops here on every backend)."""
        with self.world.cond:
            while self._sends:
                self._wait_oldest_send()

    def _claim(self, src: int) -> None:
        """Post a receive from ``src`` (under the world's lock): the next frame's send completes."""
        pair = (src, self.rank)
        self.world.claimed[pair] = self.world.claimed.get(pair, 0) + 1
        self.world.cond.notify_all()

    def _open(self, src, taghash, header: bytes, body: torch.Tensor) -> torch.Tensor:
        """Check a queued frame as the process backends check theirs; return the payload."""
        n = parse_frame_header(header, rank=self.rank, src=src, taghash=taghash,
                               max_frame_bytes=self.max_frame_bytes)
        if body.numel() > n + FRAME_END_NBYTES:
            raise CommError(f"rank {self.rank}: frame body from rank {src} is longer than the "
                            f"{n} bytes announced")
        end = bytes(body[n:].tolist()) if body.numel() >= n else b""
        check_frame_end(end.rjust(FRAME_END_NBYTES, b"\0"), rank=self.rank, src=src, nbytes=n)
        return body[:n]

    def _recv_frame(self, src, taghash):
        return self._take_frame(src, taghash, claim=True)

    def _take_frame(self, src, taghash, claim: bool = False):
        """The next frame from ``src`` once it is in the mailbox; its receive is posted first
        when ``claim`` (else it was posted ahead)."""
        w = self.world
        with w.cond:
            if claim:
                self._claim(src)
            box = w.mail.setdefault((src, self.rank), deque())
            w.wait_for(lambda: len(box) > 0, f"recv from rank {src}", self.rank)
            _, header, body = box.popleft()
        return self._open(src, taghash, header, body)

    def _recv_any_frame(self, srcs, taghash):
        w = self.world
        with w.cond:
            boxes = {src: w.mail.setdefault((src, self.rank), deque()) for src in srcs}

            def first():  # the source whose waiting message arrived earliest
                ready = [(box[0][0], src) for src, box in boxes.items() if box]
                return min(ready)[1] + 1 if ready else 0  # +1: rank 0 must be truthy

            src = w.wait_for(first, f"recv from any of ranks {srcs}", self.rank) - 1
            self._claim(src)  # the receive from any source matches the first frame to arrive
            _, header, body = boxes[src].popleft()
        return src, self._open(src, taghash, header, body)

    def _post_recv_frame(self, src, taghash):
        posted = _PostedFrame(self, src, taghash)
        queue = self._ahead.setdefault(src, deque())
        queue.append(posted)
        if len(queue) == 1:  # as on gloo: one receive per peer posted to the transport at a time
            posted.start()
        return posted

    def _collective(self, contribution, what: str) -> list:
        self._wait_sends()
        w = self.world
        seq = self._op
        self._op += 1
        with w.cond:
            slot = w.slots.setdefault(seq, {"parts": [None] * w.world_size, "n": 0, "read": 0})
            slot["parts"][self.rank] = contribution
            slot["n"] += 1
            w.cond.notify_all()
            w.wait_for(lambda: slot["n"] == w.world_size, what, self.rank)
            parts = list(slot["parts"])
            slot["read"] += 1
            if slot["read"] == w.world_size:
                del w.slots[seq]
        return parts

    def _all_gather_raw(self, data):
        parts = self._collective(_in_flight(data), "all_gather")
        sizes = {p.numel() for p in parts}
        if len(sizes) != 1:
            raise CommError(f"rank {self.rank}: all_gather with unequal sizes {sorted(sizes)}")
        return [p.clone() for p in parts]

    def _broadcast_raw(self, data, src):
        parts = self._collective(_in_flight(data) if self.rank == src else None, "broadcast")
        return parts[src].clone()

    def _barrier(self):
        self._collective(None, "barrier")

    def _gather_bytes_raw(self, data):
        parts = self._collective(data, "gather_bytes")
        return parts if self.rank == 0 else None


class _PostedFrame:
    """A receive posted ahead (``Comm.irecv``), posted as gloo posts it: when every receive
    posted before it from that peer has been taken (so it completes the sender's send then, no
    sooner), and taken from the mailbox when waited on."""

    def __init__(self, comm: ThreadsComm, src: int, taghash: int):
        self._comm, self._src, self._taghash = comm, src, taghash

    def start(self) -> None:
        with self._comm.world.cond:
            self._comm._claim(self._src)

    def result(self) -> torch.Tensor:
        queue = self._comm._ahead[self._src]
        try:
            return self._comm._take_frame(self._src, self._taghash)
        finally:
            queue.popleft()
            if queue:
                queue[0].start()


def run_threads(world_size: int, fn, *, timeout_s: float = 120.0, latency_ms: float = 0.0,
                metered: bool = True, max_frame_bytes: int | None = None,
                max_run_time_s: float | None = None, bandwidth_bps: float | None = None,
                device: torch.device | str | None = None) -> list:
    """Run ``fn(comm)`` on ``world_size`` rank threads; return their results in rank order.

    A rank that raises ends the run: the others are released with CommError
    and the first failure is re-raised as RankFailed naming the rank (for a
    timed-out wait, the rank that stopped making progress).  A healthy run
    has no time limit unless ``max_run_time_s`` is given; each wait is bounded
    by ``timeout_s``.  ``device`` (default CPU) is where every rank computes.
    """
    world = ThreadsWorld(world_size, timeout_s, device)
    results: list = [None] * world_size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        kw = {} if max_frame_bytes is None else {"max_frame_bytes": max_frame_bytes}
        try:
            # built inside the try: a rank whose Comm cannot be built (a bad
            # option, a raising meter) must count itself done, or the run waits forever
            comm = world.comm(rank, latency_ms=latency_ms, metered=metered, bandwidth_bps=bandwidth_bps, **kw)
            results[rank] = fn(comm)
            comm.close()
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[rank] = e
            world.fail(f"rank {rank} failed ({type(e).__name__}: {e})")
        finally:
            with world.cond:
                world.done += 1
                world.cond.notify_all()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    over_time = _await_ranks(world, max_run_time_s)
    with world.cond:
        errors = dict(errors)  # threads left running may still add to it
    if over_time:
        raise RankFailed(-1, f"the run did not finish within --max-run-time {max_run_time_s:g} s")
    if errors:
        # Report the root cause: the first rank that failed for a reason other
        # than being aborted by a peer; a timed-out wait names the rank it waited on.
        root = min((r for r, e in errors.items() if not _is_abort(e)), default=min(errors))
        err = errors[root]
        if isinstance(err, CommTimeout) and err.stalled_rank is not None:
            raise RankFailed(err.stalled_rank, err.blame()) from err
        raise RankFailed(root, f"{type(err).__name__}: {err}") from err
    return results


def _await_ranks(world: ThreadsWorld, max_run_time_s: float | None) -> bool:
    """Until every rank thread ended; after a failure, at most one more timeout for
    the others to notice it (a rank blocked outside the Comm never does: its
    daemon thread is left behind); at most ``max_run_time_s`` in all.  True
    when the run was stopped for exceeding ``max_run_time_s``."""
    start = time.monotonic()
    failed_at: float | None = None
    with world.cond:
        while world.done < world.world_size:
            now = time.monotonic()
            limits = []
            if world.failed is not None:
                failed_at = now if failed_at is None else failed_at
                limits.append(failed_at + world.timeout_s)
            if max_run_time_s is not None:
                limits.append(start + max_run_time_s)
            if limits and now >= min(limits):
                if world.failed is None:
                    world.failed = f"the run exceeded --max-run-time {max_run_time_s:g} s"
                    world.cond.notify_all()
                    return True
                return False
            world.cond.wait(min(limits) - now if limits else None)
    return False


def _is_abort(e: BaseException) -> bool:
    return isinstance(e, CommError) and "aborted because" in str(e)


__all__ = ["ThreadsWorld", "ThreadsComm", "run_threads"]
