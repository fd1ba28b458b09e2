"""In-process backend: every rank is a thread, messages are copied tensors.

Fast enough for property checks, and it follows the same contract as the
process backends: payloads are copied (a sender may reuse its buffer), tags
must match, every wait has a timeout, and when one rank fails every other
rank's next wait raises instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from .base import Comm, CommError, RankFailed


class ThreadsWorld:
    """Shared state of one in-process world: mailboxes and collective slots."""

    def __init__(self, world_size: int, timeout_s: float = 120.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.mail: dict[tuple[int, int], deque] = {}
        self.slots: dict[int, dict] = {}
        self.failed: str | None = None
        self.seq = 0  # global arrival order of point-to-point messages (for recv_any)

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
                raise CommError(f"rank {rank}: {what} timed out after {self.timeout_s:g} s")
            self.cond.wait(left)

    def comm(self, rank: int, **kw) -> ThreadsComm:
        return ThreadsComm(self, rank, **kw)


class ThreadsComm(Comm):
    backend = "threads"

    def __init__(self, world: ThreadsWorld, rank: int, **kw):
        kw.setdefault("timeout_s", world.timeout_s)
        super().__init__(rank, world.world_size, **kw)
        self.world = world
        self._op = 0  # collective sequence number of this rank

    def _send_frame(self, data, dst, taghash):
        w = self.world
        with w.cond:
            if w.failed is not None:
                raise CommError(f"rank {self.rank}: send aborted because {w.failed}")
            w.seq += 1
            w.mail.setdefault((self.rank, dst), deque()).append((w.seq, taghash, data.clone()))
            w.cond.notify_all()

    def _recv_frame(self, src, taghash):
        w = self.world
        with w.cond:
            box = w.mail.setdefault((src, self.rank), deque())
            w.wait_for(lambda: len(box) > 0, f"recv from rank {src}", self.rank)
            _, got, data = box.popleft()
        if got != taghash:
            raise CommError(f"rank {self.rank}: message from rank {src} has another tag "
                            "than the one received (the ranks' programs disagree)")
        return data

    def _recv_any_frame(self, srcs, taghash):
        w = self.world
        with w.cond:
            boxes = {src: w.mail.setdefault((src, self.rank), deque()) for src in srcs}

            def first():  # the source whose waiting message arrived earliest
                ready = [(box[0][0], src) for src, box in boxes.items() if box]
                return min(ready)[1] + 1 if ready else 0  # +1: rank 0 must be truthy

            src = w.wait_for(first, f"recv from any of ranks {srcs}", self.rank) - 1
            _, got, data = boxes[src].popleft()
        if got != taghash:
            raise CommError(f"rank {self.rank}: message from rank {src} has another tag "
                            "than the one received (the ranks' programs disagree)")
        return src, data

    def _collective(self, contribution, what: str) -> list:
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
        parts = self._collective(data.clone(), "all_gather")
        sizes = {p.numel() for p in parts}
        if len(sizes) != 1:
            raise CommError(f"rank {self.rank}: all_gather with unequal sizes {sorted(sizes)}")
        return [p.clone() for p in parts]

    def _broadcast_raw(self, data, src):
        parts = self._collective(data.clone() if self.rank == src else None, "broadcast")
        return parts[src].clone()

    def _barrier(self):
        self._collective(None, "barrier")

    def gather_objects(self, obj):
        parts = self._collective(obj, "gather_objects")
        return parts if self.rank == 0 else None


def run_threads(world_size: int, fn, *, timeout_s: float = 120.0, latency_ms: float = 0.0,
                metered: bool = True, bandwidth_bps: float | None = None) -> list:
    """Run ``fn(comm)`` on ``world_size`` rank threads; return their results in rank order.

    A rank that raises ends the run: the others are released with CommError
    and the first failure is re-raised as RankFailed naming the rank.
    """
    world = ThreadsWorld(world_size, timeout_s)
    results: list = [None] * world_size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        comm = world.comm(rank, latency_ms=latency_ms, metered=metered, bandwidth_bps=bandwidth_bps)
        try:
            results[rank] = fn(comm)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[rank] = e
            world.fail(f"rank {rank} failed ({type(e).__name__}: {e})")

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s * 4 + 10
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        world.fail("the run exceeded its time limit")
        raise RankFailed(-1, "threads run did not finish within its time limit")
    if errors:
        # Report the root cause: the first rank that failed for a reason other
        # than being aborted by a peer.
        root = min((r for r, e in errors.items() if not _is_abort(e)), default=min(errors))
        raise RankFailed(root, f"{type(errors[root]).__name__}: {errors[root]}") from errors[root]
    return results


def _is_abort(e: BaseException) -> bool:
    return isinstance(e, CommError) and "aborted because" in str(e)


__all__ = ["ThreadsWorld", "ThreadsComm", "run_threads"]
