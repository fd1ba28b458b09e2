"""User-space link shaping: ``--bandwidth`` without network namespaces or root.

The kernel-verified path (``net="netns"``, :mod:`harness.netns`) gives every
rank its own link to a switch and shapes both directions with ``tc tbf``.
The pacer models the same star topology inside the Comm, one token bucket
per link direction at the same rate:

* **uplink** (rank -> switch): a message leaves once the bucket has covered
  its wire bytes.  The wait is the link's, not the program's: ``Comm.send``
  reserves the bytes and returns, and the rank's sender thread
  (:class:`PacedSender`) posts the message at its release time, so compute
  goes on while the link is busy, as behind a shaped NIC.  The bucket holds
  ``burst_bytes`` (the value ``harness.netns`` gives tbf), so a short
  message goes at once on an idle link, as it does through tbf: the caller
  posts it itself when no earlier message is still queued (no thread hop).  (A
  collective is a synchronisation point: its caller waits for its bytes.)
* **downlink** (switch -> rank): the receiver pays after a message arrives.
  Packets cross both shapers in a stream, so on an idle downlink a message
  that took ``n / rate`` on the uplink is not delayed again; only when
  several senders converge on one receiver (a parameter server) does the
  downlink queue, which is what the switch's tbf does.

Wire bytes are modelled as payload plus the Comm's frame header plus
Ethernet/IPv4/TCP headers per segment at MTU 1500 (``_SEGMENT``), so the
pacer and ``tc tbf`` (which counts whole frames) charge about the same
bytes.  ACKs in the opposite direction are not charged.  Pacing changes only
time: no byte of any message and no result hash depends on it.

Clocks: ``time.monotonic`` is system-wide on Linux, but each bucket is used by
one rank only, so no clock is ever compared across processes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

# A full TCP segment at MTU 1500 with timestamps carries 1448 bytes of data;
# Ethernet (14) + IPv4 (20) + TCP (20) + timestamp option (12) = 66 bytes on top.
_SEGMENT = 1448
_SEGMENT_OVERHEAD = 66
_TIMER_HZ = 250  # the kernel tick harness.netns sizes tbf's bucket for


def wire_bytes(payload: int, framing: int = 0) -> int:
    """Bytes a link carries for one message: payload, framing and per-segment headers."""
    data = payload + framing
    return data + max(1, math.ceil(data / _SEGMENT)) * _SEGMENT_OVERHEAD


def tbf_burst_bytes(rate_bps: float, mtu: int = 1500) -> int:
    """The bucket size ``harness.netns`` gives ``tc tbf``: one tick's worth, at least 4 MTUs."""
    return max(int(rate_bps) // 8 // _TIMER_HZ, 4 * mtu)


class TokenBucket:
    """One direction of one link: ``rate_bps`` with a bucket of ``burst_bytes``.

    Kept as the time the link finishes what it was given (a virtual clock):
    a bucket that is ``burst`` bytes ahead of that time is full.
    """

    def __init__(self, rate_bps: float, burst_bytes: int, clock=time.monotonic):
        if rate_bps <= 0:
            raise ValueError("rate_bps must be > 0")
        if burst_bytes < 0:
            raise ValueError("burst_bytes must be >= 0")
        self.rate_Bps = rate_bps / 8.0
        self.burst_s = burst_bytes / self.rate_Bps
        self.clock = clock
        self.free_at = -math.inf  # when the link has sent everything handed to it
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, start: float | None = None) -> float:
        """Queue ``nbytes`` that can start at ``start`` (default now); return how long
        the caller must wait before they count as sent (0 when the bucket covers them)."""
        now = self.clock()
        with self._lock:
            begin = max(now if start is None else start, self.free_at)
            self.free_at = begin + nbytes / self.rate_Bps
            return max(0.0, self.free_at - self.burst_s - now)


class LinkPacer:
    """Both directions of one rank's link to the switch."""

    def __init__(self, rate_bps: float, burst_bytes: int | None = None, *, clock=time.monotonic,
                 sleep=time.sleep):
        burst = tbf_burst_bytes(rate_bps) if burst_bytes is None else burst_bytes
        self.rate_bps = rate_bps
        self.up = TokenBucket(rate_bps, burst, clock)
        self.down = TokenBucket(rate_bps, burst, clock)
        self.clock = clock
        self.sleep = sleep
        self.waited_s = 0.0  # total time this rank spent waiting on its buckets

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self.waited_s += seconds
            self.sleep(seconds)

    def outgoing(self, nbytes: int) -> None:
        """Before a message of ``nbytes`` wire bytes leaves this rank."""
        self._wait(self.up.reserve(nbytes))

    def outgoing_release(self, nbytes: int) -> float:
        """Queue a message of ``nbytes`` wire bytes on the uplink without waiting: the
        ``clock`` time at which it counts as sent (the Comm's sender thread posts it then)."""
        wait = self.up.reserve(nbytes)
        self.waited_s += wait
        return self.clock() + wait

    def incoming(self, nbytes: int) -> None:
        """After a message of ``nbytes`` wire bytes arrived at this rank: it streamed
        through the sender's uplink for ``nbytes / rate`` before now, and through
        this downlink at the same time unless the downlink was busy."""
        streamed = self.clock() - nbytes / self.up.rate_Bps
        self._wait(self.down.reserve(nbytes, start=streamed))


class PacedSender:
    """Posts one rank's paced messages from a thread, each once its uplink released it.

    ``Comm.send`` reserves the message's wire bytes on the token bucket (which gives
    the time the link has carried them) and queues it here; the caller goes on
    computing while the message waits for its link, as it would behind a shaped
    NIC.  Messages are posted in the order they were queued, so the order per
    peer is the caller's.  A failure to post is kept and raised to the caller at
    its next send or synchronisation point (:meth:`check`, :meth:`drain`).
    """

    def __init__(self, post, clock=time.monotonic, name: str = "paced-send"):
        self._post = post  # post(data, dst, taghash): the backend's send of one frame
        self._clock = clock
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, release_at: float, data, dst: int, taghash: int) -> None:
        with self._cond:
            self._queue.append((release_at, data, dst, taghash))
            self._cond.notify_all()

    def idle(self) -> bool:
        """Nothing queued and nothing being posted: a message released now may be posted by
        its caller without overtaking one queued before it."""
        with self._cond:
            return not self._queue and not self._busy

    def check(self) -> None:
        """Raise the failure of an earlier post, if there was one."""
        if self._error is not None:
            raise self._error

    def drain(self, timeout_s: float) -> bool:
        """Until every queued message was posted, at most ``timeout_s`` past the last one's
        release; False when that ran out (a failed post raises)."""
        with self._cond:
            last = max((item[0] for item in self._queue), default=self._clock())
            deadline = max(last, self._clock()) + timeout_s
            while (self._queue or self._busy) and self._error is None:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
        self.check()
        return True

    def stop(self) -> None:
        """End the thread; messages still queued are dropped."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._queue or self._clock() < self._queue[0][0]):
                    wait = None if not self._queue else self._queue[0][0] - self._clock()
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, data, dst, taghash = self._queue.popleft()
                self._busy = True
            try:
                self._post(data, dst, taghash)
            except BaseException as e:  # noqa: BLE001 - raised to the caller by check / drain
                with self._cond:
                    self._error = e
                    self._stopped = True
                    self._queue.clear()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
