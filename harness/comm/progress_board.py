"""Where every rank of one run says how far it got, so a timed-out wait can name
the rank that stopped making progress instead of the one that waited.

One slot per rank, three float64s: the last heartbeat (a rank process's
liveness thread, gloo only), the time of its last communication boundary, and
its state (computing, waiting in a Comm operation, finished).  Times are
``time.monotonic()``: one system-wide clock on Linux, so slots written by
different processes of one host compare.  The board lives in memory for the
threads backend and in a file of the run's private directory for processes.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path

COMPUTING, WAITING, FINISHED = 0.0, 1.0, 2.0
_SLOT = struct.Struct("<ddd")  # heartbeat, last boundary, state
# What each writer writes of its slot, and no more: the heartbeat thread and the rank's own
# thread write at once, and a read-modify-write of the whole slot by one could undo the other's.
_BEAT = struct.Struct("<d")  # at the slot's start
_MARK = struct.Struct("<dd")  # after the heartbeat: boundary and state, every message
_MARK_OFFSET = _BEAT.size
BEAT_INTERVAL_S = 0.5
# A heartbeat this old means the process is stopped, dead or hung with the GIL
# held: many intervals, so a loaded machine's scheduling delay is not mistaken
# for a stall (the oldest heartbeat is named in any case, see stalled()).
STALE_BEAT_S = 8 * BEAT_INTERVAL_S


def load_note(load: float | None = None, cores: int | None = None) -> str:
    """'' unless the 1-minute load average exceeds the cores this process may use; then a clause
    saying so, since a starved rank looks exactly like a stalled one."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:
        return ""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    if load <= cores:
        return ""
    return (f"; the machine is overloaded (load average {load:.1f} on {cores} core"
            f"{'' if cores == 1 else 's'}): a rank starved of CPU looks stalled, so a longer "
            "--timeout or fewer ranks may let it finish")


class ProgressBoard:
    """Per-rank last-progress times of one run (see the module docstring)."""

    def __init__(self, world_size: int, buf, keep=None):
        self.world_size = world_size
        self._buf = buf
        self._keep = keep  # the mmap's file object, closed with the board

    @classmethod
    def in_memory(cls, world_size: int) -> ProgressBoard:
        return cls(world_size, bytearray(_SLOT.size * world_size))

    @staticmethod
    def create_file(path: str | os.PathLike, world_size: int) -> None:
        """Zeroed slots (never seen), written before any rank starts."""
        Path(path).write_bytes(bytes(_SLOT.size * world_size))

    @classmethod
    def open_file(cls, path: str | os.PathLike, world_size: int) -> ProgressBoard:
        f = open(path, "r+b")
        if os.fstat(f.fileno()).st_size != _SLOT.size * world_size:
            f.close()
            raise ValueError(f"progress board {path} does not hold {world_size} slots")
        return cls(world_size, mmap.mmap(f.fileno(), 0), keep=f)

    def _read(self, rank: int) -> tuple[float, float, float]:
        return _SLOT.unpack_from(self._buf, rank * _SLOT.size)

    def mark(self, rank: int, state: float) -> None:
        """A communication boundary of ``rank``: entering or leaving a wait, or the end."""
        _MARK.pack_into(self._buf, rank * _SLOT.size + _MARK_OFFSET, time.monotonic(), state)

    def clear(self, rank: int, state: float) -> None:
        """``rank`` in ``state`` with no communication boundary reached yet."""
        _MARK.pack_into(self._buf, rank * _SLOT.size + _MARK_OFFSET, 0.0, state)

    def beat(self, rank: int) -> None:
        _BEAT.pack_into(self._buf, rank * _SLOT.size, time.monotonic())

    def stalled(self, me: int) -> tuple[int, str] | None:
        """The rank (other than ``me``) that stopped making progress, and how; None if all others wait.

        In order: the oldest heartbeat if it is stale (a stopped or dead
        process); the rank outside any Comm wait that has gone longest without
        reaching its next communication (stuck computing, or a blocked rank
        thread); a rank that finished its program while others still wait.
        """
        now = time.monotonic()
        rows = {r: self._read(r) for r in range(self.world_size) if r != me}
        if not rows:
            return None
        beats = {r: row[0] for r, row in rows.items()}
        if any(b > 0 for b in beats.values()):
            r = min(beats, key=lambda k: (beats[k], k))
            if beats[r] == 0:
                return r, "its process never started communicating"
            if now - beats[r] > STALE_BEAT_S:
                return r, f"no sign of life from its process for {now - beats[r]:.1f} s (stopped, hung or dead)"
        busy = {r: row[1] for r, row in rows.items() if row[2] == COMPUTING}
        if busy:
            r = min(busy, key=lambda k: (busy[k], k))
            if busy[r] == 0:
                return r, "it never reached its first communication"
            return r, f"it has not reached its next communication for {now - busy[r]:.1f} s"
        done = [r for r, row in rows.items() if row[2] == FINISHED]
        if done:
            return done[0], "it finished its program while others still wait for it"
        return None

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        if self._keep is not None:
            self._keep.close()


class Heartbeat:
    """A daemon thread beating ``rank``'s slot every BEAT_INTERVAL_S until stopped."""

    def __init__(self, board: ProgressBoard, rank: int):
        self._board, self._rank = board, rank
        self._stop = threading.Event()
        board.beat(rank)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_INTERVAL_S):
            self._board.beat(self._rank)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
