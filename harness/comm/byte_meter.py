"""Byte meter: the payload bytes and messages a rank sends and receives through the Comm.

Every Comm operation reports here the length of the serialized payload it
sends and receives.  Counting conventions (the same on every backend):

* ``send``/``recv``: the payload's length, once at the sender (``sent``) and
  once at the receiver (``received``).  The 16 framing bytes that carry the
  length, tag and end markers are counted apart, as ``framing_bytes``.
* collectives are counted as the point-to-point traffic they deliver: in an
  ``all_gather`` / ``all_reduce`` each rank sends its S bytes to each of the
  W-1 others; in a ``broadcast`` the source sends S bytes to each of the
  W-1 others.  (That is what the CPU implementation, an all-gather, moves.)

A meter is per rank; the run sums the ranks' ``sent`` totals.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import NamedTuple

FRAME_HEADER_BYTES = 16  # 14-byte frame header + 2-byte end marker, see comm.base (frame protocol)


class Flow(NamedTuple):
    """One kind of traffic: who sent to whom, which way, under which tag.  A named tuple:
    one is made and hashed per message, which a frozen dataclass's Python-level
    ``__init__`` / ``__hash__`` made a visible share of a small message's cost."""

    src: int
    dst: int  # -1: a collective's peers as a whole
    direction: str  # "sent" | "received"
    tag: str
    op: str


class ByteMeter:
    """Per-rank counters of payload bytes and messages, keyed by ``Flow``."""

    def __init__(self, rank: int, enabled: bool = True):
        self.rank = rank
        self.enabled = enabled
        self._lock = threading.Lock()
        self._counts: dict[Flow, list[int]] = {}  # [bytes, messages]: one lookup per message
        self.framing_bytes = 0

    def record(self, flow: Flow, nbytes: int, messages: int = 1, framing: int = 0) -> None:
        if not self.enabled:
            return
        with self._lock:
            counts = self._counts.get(flow)
            if counts is None:
                counts = self._counts[flow] = [0, 0]
            counts[0] += nbytes
            counts[1] += messages
            self.framing_bytes += framing

    def snapshot(self) -> MeterSnapshot:
        with self._lock:
            return MeterSnapshot({f: c[0] for f, c in self._counts.items()},
                                 {f: c[1] for f, c in self._counts.items()}, self.framing_bytes)


@dataclass(frozen=True)
class MeterSnapshot:
    bytes: dict[Flow, int]
    messages: dict[Flow, int]
    framing_bytes: int

    def __sub__(self, other: MeterSnapshot) -> MeterSnapshot:
        keys = set(self.bytes) | set(other.bytes)
        return MeterSnapshot(
            {k: self.bytes.get(k, 0) - other.bytes.get(k, 0) for k in keys},
            {k: self.messages.get(k, 0) - other.messages.get(k, 0) for k in keys},
            self.framing_bytes - other.framing_bytes,
        )

    def total(self, direction: str = "sent", tag: str | None = None) -> tuple[int, int]:
        """(bytes, messages) summed over flows in one direction (optionally one tag)."""
        b = m = 0
        for flow, n in self.bytes.items():
            if flow.direction == direction and (tag is None or flow.tag == tag):
                b += n
                m += self.messages[flow]
        return b, m

    def by_tag(self, direction: str = "sent") -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = {}
        for flow, n in self.bytes.items():
            if flow.direction == direction and (n or self.messages[flow]):
                acc = out.setdefault(flow.tag, [0, 0])
                acc[0] += n
                acc[1] += self.messages[flow]
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}

    def to_rows(self) -> list[dict]:
        return [
            {"src": f.src, "dst": f.dst, "direction": f.direction, "tag": f.tag, "op": f.op,
             "bytes": n, "messages": self.messages[f]}
            for f, n in sorted(self.bytes.items(), key=lambda kv: (kv[0].direction, kv[0].tag, kv[0].src, kv[0].dst))
            if n or self.messages[f]
        ]
