"""Process backends over torch.distributed: ``gloo`` (CPU) and ``nccl`` (GPU).

One process per rank.  Point-to-point messages are framed (the frame protocol
in ``base``: a 14-byte header with tag hash, length and magic, then the payload
with a 2-byte end marker), so a receiver needs no prior knowledge of the size
and a protocol mismatch is caught, not decoded.  A frame of up to
``INLINE_MAX_PAYLOAD`` payload bytes travels as one transport message (header,
payload, end marker); a larger one as two (the header, then payload and end
marker), so its body's buffer is sized by what the header announced.  Except a
large frame of the size its pair expects: sender and receiver keep the same
history per peer and tag (``_SizeHistory``), and once two frames of one size of
at least ``SIZED_MIN_PAYLOAD`` bytes came in a row, the next of that size is one
message too, received into a buffer posted at that size (``_sized_buffer``) and
handed on as a view.  Gloo sends a message only once its receive is posted (a
rendezvous), so a body received behind its header waits a round of that per
frame; a pipeline's activations and gradients repeat their sizes.

What gloo allows a receiver to check: it accepts a message shorter than the
posted buffer (leaving the buffer's tail untouched) and aborts the whole
process on a longer one (an enforce failure in its own thread, which no Python
code can catch), and it does not say how many bytes arrived.  So every receive
is posted with the size the protocol fixes plus slack bytes after it:

* a frame's first message into a buffer of ``FIRST_BUFFER_NBYTES`` (one per Comm,
  and one per peer for receives posted ahead, ``Comm.irecv``: the same receive,
  posted to gloo at once and checked when taken, :class:`_PostedFrame`): the
  header, and the payload and end marker when the header announces an inline frame;
* a large frame's body into a new buffer of exactly the length that header
  announced, once the header passed its checks (magic, tag, ``n <= max_frame_bytes``),
  plus 2 end-marker bytes and ``BODY_SLACK`` bytes.

Before each receive the bytes a message may leave untouched are set so that a
message of another length is seen: the first buffer holds the Comm's random
guard bytes (drawn per Comm, never sent, so a sender cannot predict them; none
equals a byte of the end marker or zero, and the magic's slot is zero), a body buffer's
end-marker slot is cleared and its slack guarded.  A short message leaves guard
or zero where the magic or end marker belongs, a long one (by at most the
slack) changes the guard after the expected end (always when its extra bytes are
zeros; otherwise but for a chance of 1 in 256 per extra byte), and both are a CommError
naming the peer.  After a frame of ``end`` bytes passed every check, only those
bytes get their guard back before the next receive (``_RecvBuffer.dirty``);
after a failed check, the whole buffer.  A sender
following the protocol never sends more than its header announced, and refuses
a payload above ``max_frame_bytes`` itself (``Comm.send``), so gloo never sees a
message longer than the buffer posted for it.  A body's receive buffer is sized by
the announced length, never by ``max_frame_bytes``: memory is spent only on
messages that arrive, and a large ``max_frame_bytes`` reserves nothing.

What this cannot protect against is a peer that does not follow the protocol:
a raw gloo message longer than the buffer posted for it (a body more than
``BODY_SLACK`` bytes longer than its header said, or more than
``FIRST_BUFFER_NBYTES`` bytes arriving where a frame's first message is due) still ends the receiving process inside
gloo; the launcher then reports that rank as dead without a report.  Gloo
offers no way to learn a message's size before posting a buffer for it
(``checks/test_wire_hostile.py`` pins this limit).
Sends are posted, not waited on (``_send_frame``): the frame's messages
own their buffers, gloo keeps them in order per peer, and the Comm waits for
them only when more than ``max_in_flight_bytes`` or ``max_in_flight_frames``
are in flight (oldest first),
at every collective and barrier (a synchronisation point), and at close, so a
stage computes its next micro-batch while the last one is on the wire.  (Gloo's
send work reports completion only once waited on, so on gloo a frame is let go
at a bound or a synchronisation point, not when its bytes left; a frame
waited on at a bound is kept as a spare for the next of its size,
``SPARE_FRAMES``: a new one costs an allocation, and a large one page faults.)  A send
that fails (a dead peer) raises at the first of those waits, naming the peer.
The bound is the Comm's one limit on a program (``base.MAX_IN_FLIGHT_FRAMES``): gloo completes
a send only once its receive is posted, so two ranks that each send more frames than the bound
to the other before receiving any wait for each other at it; that wait's timeout says so, and
the threads backend keeps the same bound, so such a program stops there too.  The bound stays
because the alternative, holding every frame up to a synchronisation point, costs memory and,
for large frames, cache (each frame is written by the payload's copy; the more frames cycle, the
colder the one written), and gloo cannot let a frame go without a wait that blocks (a wait with
a short timeout closes the pair).
Every wait is bounded by the Comm's timeout; a peer that died surfaces as a
CommError within it (usually at once: gloo sees the closed connection), a
wait that runs out as ``CommTimeout`` naming the stalled rank when the run
has a progress board (each rank process beats its slot from a thread).

Rendezvous: with ``store_file`` (single-host runs started by the launcher) a
FileStore in the run's private directory, so nothing listens on a network
interface for it; otherwise torchrun's TCP store (MASTER_ADDR/MASTER_PORT).
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch
import torch.distributed as dist

from .base import (
    FRAME_END,
    FRAME_END_NBYTES,
    FRAME_HEADER_NBYTES,
    FRAME_MAGIC,
    Comm,
    CommError,
    CommTimeout,
    check_frame_end,
    pack_frame_header_into,
    parse_frame_header,
    payload_view,
)
from .progress_board import Heartbeat

# Control-plane gathers (rank outputs) are bounded by the Comm's max_frame_bytes,
# checked on every rank before anything is allocated: a peer's declared size is
# not trusted, and a rank whose own output is larger says so before sending.

#: The buffer a frame's first message is received into.  A frame whose header, payload,
#: end marker and guard fit travels as that one message: half the transport calls of
#: two, for the small frames (activations of a few micro-batch rows, control frames)
#: whose cost is per message, not per byte.  A larger first message aborts inside gloo.
#: Larger frames go as two messages: one message saves gloo's rendezvous for the body but
#: costs a receive two copies (the payload out, the guard back), and a 2 MiB buffer sent
#: frames up to 2 MiB as one without a resolvable gain at 1 MiB
#: (benchmarks/results/inline-2mib-2core/).
FIRST_BUFFER_NBYTES = 64 << 10
# Bytes posted after a large frame's body: a longer body by up to this many is a
# CommError, a longer one still aborts inside gloo (module docstring).  Small because the
# received payload is a view of its buffer (no copy), so the slack is part of what the
# tensor memory meter counts.
BODY_SLACK = 64
_CHECKED = 8  # the slack bytes guarded: a longer message overwrites them first
#: The largest payload sent inline (in the frame's one message).
INLINE_MAX_PAYLOAD = FIRST_BUFFER_NBYTES - FRAME_HEADER_NBYTES - FRAME_END_NBYTES - _CHECKED
#: A pair (sender, receiver, tag) whose payloads of at least this many bytes repeat a size sends
#: the next frame of that size as one message too: both ends keep the same history
#: (:class:`_SizeHistory`), so the receiver posts a buffer of that size ahead, and the body does
#: not wait for gloo's rendezvous behind a header the receiver has to read first.
SIZED_MIN_PAYLOAD = FIRST_BUFFER_NBYTES
#: Frames kept after their send was waited on, for the next frame of the same size (a pipeline's
#: activations and gradients repeat theirs, a ping-pong its message): for a small frame that saves
#: the allocation (``torch.empty`` through the dispatcher, about 1 us, a third of the send's own
#: time), for a large one new pages too (a page fault each, about 2 us on a VM).  Let go at every
#: synchronisation point.
SPARE_FRAMES = 2
#: Bytes per rank in one round of the results gather (what a declared size can cost rank 0
#: before those bytes arrive is one round: world x this).
GATHER_ROUND_BYTES = 4 << 20
# The expected sizes of a receive with no size history: read only, shared (not a new dict per message).
_NO_SIZES: Mapping[int, int] = MappingProxyType({})
# This process's Comms with sends posted: held here until those are waited on, so a Comm
# the program dropped still delivers them (close of any Comm waits for all, see _close_sends).
_POSTING: set = set()


@dataclass(slots=True)
class _Posted:
    """One frame's posted sends: their work handles and the frame they read from."""

    works: list
    frame: torch.Tensor  # on the host
    view: memoryview  # of ``frame``'s bytes
    posted: torch.Tensor  # the frame as posted (on the device for nccl): the messages are views of it
    dst: int
    nbytes: int


class _SizeHistory(dict):
    """Per (peer, tag hash): the last payload size of at least ``SIZED_MIN_PAYLOAD`` bytes and
    whether the one before had the same size.  Sender and receiver record the same frames in
    the same order (gloo keeps a pair's messages in order; a receive checks the tag), so both
    ends agree on ``expected`` without a message: the size a frame may travel at in one message.
    A dict of ``(peer, tag hash) -> (size, repeated)``, so that an empty history (small frames
    only) is seen without a call: ``if history``."""

    def expected(self, peer: int, taghash: int) -> int | None:
        last = self.get((peer, taghash))
        return last[0] if last is not None and last[1] else None

    def record(self, peer: int, taghash: int, n: int) -> None:
        if n < SIZED_MIN_PAYLOAD:
            self.pop((peer, taghash), None)
        else:
            last = self.get((peer, taghash))
            self[(peer, taghash)] = (n, last is not None and last[0] == n)


def _first_buffer_guard() -> bytes:
    """Random bytes for the first buffer: none is a byte of the end marker (so no window of a
    short message's tail reads as one), none is zero (a message longer than announced by zero
    bytes, the likeliest padding, always changes the guard after its end; another extra byte
    matches the guard by chance, 1 in 256 per byte), and the magic's slot is zero (a header one
    byte short cannot be completed by the guard)."""
    g = np.frombuffer(bytearray(os.urandom(FIRST_BUFFER_NBYTES)), dtype=np.uint8)
    for b in FRAME_END:
        g[g == b] ^= 1
    g[g == 0] = 1  # 1 is not a byte of the end marker
    g[FRAME_HEADER_NBYTES - len(FRAME_MAGIC): FRAME_HEADER_NBYTES] = 0
    return g.tobytes()


def _far_guard(guard: bytes, lo: int, hi: int) -> bytes:
    """The guard of bytes ``lo:hi`` of a sized buffer past its first ``FIRST_BUFFER_NBYTES``: the
    first buffer's ``guard`` after the header, repeated (random, no byte of the end marker, and
    the same byte at an offset whichever expected size's slot covers it)."""
    period = FIRST_BUFFER_NBYTES - FRAME_HEADER_NBYTES
    out = b""
    while lo < hi:  # a slice of the guard, or two where the period wraps
        start = FRAME_HEADER_NBYTES + lo % period
        take = min(hi - lo, FIRST_BUFFER_NBYTES - start)
        out += guard[start: start + take]
        lo += take
    return out


class _RecvBuffer:
    """A receive buffer, read and written in place on the host through a memoryview of its bytes
    (for the few bytes a check touches, slicing, comparing and assigning a memoryview cost a
    third of a ``ctypes`` call and a tenth of a tensor op), and how many of its leading bytes
    the last message may have written (for the reused first buffer: only those need their
    guard back)."""

    def __init__(self, device: torch.device, on_host: bool, nbytes: int = FIRST_BUFFER_NBYTES, lead: int = 0):
        # ``lead`` bytes before the buffer: a payload after the header then starts aligned.
        # ``on_host``: the Comm's, not ``device.type`` again (a new string per call, per frame)
        self.tensor = torch.empty(lead + nbytes, dtype=torch.uint8, device=device)[lead:]
        self.view = memoryview(self.tensor.numpy()) if on_host else None  # None: on a device
        self.addr = self.tensor.data_ptr() if on_host else None
        self.dirty = FIRST_BUFFER_NBYTES

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes ``lo:hi``, copied to the host."""
        return bytes(self.view[lo:hi]) if self.view is not None else \
            self.tensor[lo:hi].cpu().numpy().tobytes()

    def write(self, lo: int, data: bytes) -> None:
        """``data`` into the buffer from ``lo``."""
        if self.view is not None:
            self.view[lo: lo + len(data)] = data
        else:
            self.tensor[lo: lo + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def take(self, lo: int, n: int) -> torch.Tensor:
        """A new host tensor holding bytes ``lo:lo + n``: the one copy a receive into the reused
        buffer makes (not a tensor op on the buffer itself, or a rank's memory meter would count
        the receive scratch as the rank's)."""
        out = torch.empty(n, dtype=torch.uint8)
        if self.addr is not None:
            ctypes.memmove(out.data_ptr(), self.addr + lo, n)
        else:
            out.copy_(self.tensor[lo: lo + n])
        return out

    def payload(self, lo: int, n: int) -> torch.Tensor:
        """Bytes ``lo:lo + n`` handed on as they are: a view of a buffer not reused (on a device,
        a copy to the host)."""
        view = self.tensor[lo: lo + n]
        return view if self.addr is not None else view.cpu()


def _backend_error(rank: int, what: str, e: Exception) -> CommError:
    """The backend's error (a closed peer, say) as a CommError naming this rank and ``what``."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CommError(f"rank {rank}: {what} failed: {first}")


class _BackendErrors:
    """``with`` around a collective's transport calls: the backend's errors become
    :func:`_backend_error`.  (Per message, the Comm catches them with ``try``: no calls when
    nothing fails.)"""

    def __init__(self, rank: int, what: str):
        self.rank, self.what = rank, what

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind, e, tb) -> bool:
        if e is None or isinstance(e, CommError) or not isinstance(e, Exception):
            return False
        raise _backend_error(self.rank, self.what, e) from e


class _PostedFrame:
    """A receive posted ahead (``Comm.irecv``) from one peer: its first message goes to the
    transport (a plain gloo receive, no thread) as soon as every receive posted before it from
    that peer has been taken, into that peer's own first buffer.  Only then, because the pair's
    size history (which decides the buffer) is complete up to it; a stage posts one receive
    ahead per peer, so its transfer overlaps the compute.  ``result()`` waits for that message,
    checks it exactly as a blocking receive does, receives a body that follows, and posts the
    peer's next receive."""

    def __init__(self, comm: TorchDistComm, src: int, taghash: int):
        self._comm, self._src, self._taghash = comm, src, taghash
        self._first = None  # (buffer, expected sizes, work) once posted to the transport

    def start(self) -> None:
        comm = self._comm
        self._first = comm._post_first(self._src, self._taghash, comm._recv_what[self._src],
                                       comm._peer_buffer(self._src))

    def result(self) -> torch.Tensor:
        comm, src = self._comm, self._src
        queue = comm._ahead[src]
        try:  # the oldest posted from its peer (Comm._take checks), so already started
            comm._wait(self._first[2], comm._recv_what[src])
            payload = comm._frame(src, self._taghash, self._first)
        finally:
            queue.popleft()
            if queue:
                queue[0].start()
        return payload


def init_process_group_from_env(backend: str, timeout_s: float,
                                store_file: str | None = None) -> tuple[int, int]:
    """Join the process group described by torchrun-style environment variables
    (with ``store_file``, rendezvous through that file instead of a TCP store)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise CommError(f"cannot join a {backend} group: environment lacks {', '.join(missing)}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        kw = {}
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
            torch.cuda.set_device(local)
            kw["device_id"] = torch.device("cuda", local)
        if store_file is not None:
            kw["store"] = dist.FileStore(store_file, world)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=_dt.timedelta(seconds=timeout_s), **kw)
    return rank, world


class TorchDistComm(Comm):
    """Comm over an initialised torch.distributed default group."""

    def __init__(self, backend: str = "gloo", **kw):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown torch.distributed backend {backend!r}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise CommError("the nccl backend needs CUDA, which this machine does not have")
        super().__init__(dist.get_rank(), dist.get_world_size(), **kw)
        self.backend = backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._host = self.device.type == "cpu"
        self._timeout = _dt.timedelta(seconds=self.timeout_s)
        # the guard bytes written before every receive (module docstring): random, never sent
        self._first_guard = _first_buffer_guard()  # bytes: compared and copied as they are
        self._first_guard_view = memoryview(self._first_guard)  # sliced without a copy
        # a frame's first message's receive buffer, reused (allocated here, before any meter
        # starts); posted receives have one per peer (_PostedFrame), made at a peer's first
        self._hbuf = _RecvBuffer(self.device, self._host)
        self._peer_buffers: dict[int, _RecvBuffer] = {}
        self._ahead: dict[int, deque[_PostedFrame]] = {}  # posted receives per peer, oldest first
        self._heartbeat = Heartbeat(self.board, self.rank) if self.board is not None else None
        # self._sends holds a _Posted per send not yet waited on
        self._spare_frames: list[tuple[torch.Tensor, memoryview]] = []  # oldest first, at most SPARE_FRAMES
        # the sizes of large frames sent and received, per peer and tag: when one repeats, the
        # next frame of that size is one message, received into a buffer posted at its size
        self._sizes_out, self._sizes_in = _SizeHistory(), _SizeHistory()
        # the transport's own calls (dist.isend/irecv resolve and check the group on every call)
        self._pg = dist.group.WORLD
        self._guards: dict[str, _BackendErrors] = {}
        # what a point-to-point wait names, per peer: made once, not formatted per message
        self._recv_what = [f"recv from rank {r}" for r in range(self.world_size)]
        self._send_what = [f"send to rank {r}" for r in range(self.world_size)]

    def _guard(self, what: str) -> _BackendErrors:
        """Turn the backend's errors (closed peer, timeout) into CommError (one object per
        ``what``, kept: a handful of strings, entered on every message)."""
        guard = self._guards.get(what)
        if guard is None:
            guard = self._guards[what] = _BackendErrors(self.rank, what)
        return guard

    def _wait(self, work, what: str) -> None:
        """Wait for ``work``, bounded by the timeout (CommTimeout); the backend's errors become
        CommError naming ``what``."""
        try:
            ok = work.wait(self._timeout)
        except Exception as e:
            if "timed out" not in str(e).lower():
                raise _backend_error(self.rank, what, e) from e
            ok = False
        if ok is False:
            raise CommTimeout(f"rank {self.rank}: {what} timed out after {self.timeout_s:g} s")

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=False) if t.device != self.device else t

    def _send_frame(self, data, dst, taghash):
        # the payload copied next to its header and end marker by address: torch's sliced copies
        # cost ~5x a memcpy at 1 MiB, a tensor op is one more call through a rank's memory meter
        # (a dispatch mode), and a numpy view of the payload costs more than the copy for a small
        # frame
        data = data if data.is_cpu else data.cpu()
        n, at = data.numel(), data.data_ptr()
        self._send_written_frame(n, lambda _, to: ctypes.memmove(to, at, n), dst, taghash)

    def _send_written_frame(self, n, write, dst, taghash):
        # Posted, not waited on: the frame's messages own their buffers (the payload is
        # written next to its header or end marker, so the caller may reuse its tensor at
        # once) and gloo keeps their order per peer.  They are waited on when the bytes in
        # flight pass the bound, and at every collective and barrier (_flush_sends).
        if self.backend != "gloo":  # on gloo it lets go of nothing (_reap_sends)
            self._reap_sends()
        nbytes = FRAME_HEADER_NBYTES + n + FRAME_END_NBYTES
        frame, view = self._new_frame(nbytes)
        # filled through the frame's memoryview (a tensor op is one more call through a rank's
        # memory meter, a dispatch mode)
        pack_frame_header_into(view, n, taghash)
        write(view[FRAME_HEADER_NBYTES:FRAME_HEADER_NBYTES + n], frame.data_ptr() + FRAME_HEADER_NBYTES)
        view[FRAME_HEADER_NBYTES + n:] = FRAME_END
        host_frame, frame = frame, (frame if self._host else frame.to(self.device))
        # one message (header, payload, end marker) when it fits the receiver's first buffer or
        # has the size the receiver expects from this pair's history, else the header, then the body
        sizes = self._sizes_out
        whole = n <= INLINE_MAX_PAYLOAD or n == sizes.expected(dst, taghash)
        if sizes or n >= SIZED_MIN_PAYLOAD:  # else nothing to record (a call per message saved)
            sizes.record(dst, taghash, n)
        try:
            works = ([self._pg.send([frame], dst, 0)] if whole else
                     [self._pg.send([frame[:FRAME_HEADER_NBYTES]], dst, 0),
                      self._pg.send([frame[FRAME_HEADER_NBYTES:]], dst, 0)])
        except Exception as e:
            raise _backend_error(self.rank, f"send to rank {dst}", e) from e
        self._sends.append(_Posted(works, host_frame, view, frame, dst, nbytes))
        self._sends_bytes += nbytes
        _POSTING.add(self)
        self._wait_to_the_bound(self._finish_oldest_send)

    def _new_frame(self, nbytes: int) -> tuple[torch.Tensor, memoryview]:
        """A host buffer for a frame and a memoryview of it: a spare of that size if one is kept
        (SPARE_FRAMES)."""
        for i, (_, view) in enumerate(self._spare_frames):
            if len(view) == nbytes:
                return self._spare_frames.pop(i)
        frame = torch.empty(nbytes, dtype=torch.uint8)
        return frame, memoryview(frame.numpy())

    def _finish_oldest_send(self) -> None:
        posted = self._sends.popleft()
        self._sends_bytes -= posted.nbytes
        if not self._sends:
            _POSTING.discard(self)
        for w in posted.works:
            self._wait(w, self._send_what[posted.dst])
        self._spare_frames.append((posted.frame, posted.view))  # the transport is done with it
        del self._spare_frames[:-SPARE_FRAMES]

    def _reap_sends(self) -> None:
        """Let go of the sends that completed (a failed one raises, naming its peer).  Not on
        gloo, whose send work says it completed only once waited on: there this would let go of
        nothing (``_send_frame`` does not call it)."""
        while self._sends and all(w.is_completed() for w in self._sends[0].works):
            self._finish_oldest_send()

    def _flush_sends(self) -> None:
        """Wait for every posted send, oldest first (each bounded by the timeout); the spare
        frames go too (a synchronisation point leaves no transport buffer behind)."""
        while self._sends:
            self._finish_oldest_send()
        self._spare_frames.clear()

    def _post_message(self, buf: torch.Tensor, src: int | None, what: str):
        """Post the receive of one transport message into ``buf``; returns its work."""
        try:
            return self._pg.recv([buf], src, 0) if src is not None else self._pg.recv_anysource([buf], 0)
        except Exception as e:
            raise _backend_error(self.rank, what, e) from e

    def _check_guard(self, got: bytes, guard: bytes, src: int, end: int) -> None:
        # a longer message overwrites the bytes after its expected end from their start
        if got != guard:
            raise CommError(f"rank {self.rank}: message from rank {src} is longer than the "
                            f"{end} bytes its frame announced")

    def _sized_buffer(self, sizes) -> _RecvBuffer:
        """A new first buffer for a frame that may come whole at one of the expected ``sizes``:
        the first buffer's guard over its first ``FIRST_BUFFER_NBYTES`` bytes (any other first
        message is checked as in the reused buffer), and for each size its end marker's slot and
        the slack after it guarded (:func:`_far_guard`).  The rest is never read: a frame of an
        expected size ends where its slot is, and any other first message ends in the first bytes."""
        top = FRAME_HEADER_NBYTES + max(sizes) + FRAME_END_NBYTES + _CHECKED
        # the payload is handed on as a view: it starts 16-byte aligned, as a body buffer's does,
        # so a decoder may view it as floats of any width
        buf = _RecvBuffer(self.device, self._host, max(FIRST_BUFFER_NBYTES, top), lead=-FRAME_HEADER_NBYTES % 16)
        buf.dirty = 0  # nothing to restore: the buffer is not reused
        buf.write(0, self._first_guard)
        for n in sizes:
            lo = FRAME_HEADER_NBYTES + n
            buf.write(lo, _far_guard(self._first_guard, lo, lo + FRAME_END_NBYTES + _CHECKED))
        return buf

    def _post_first(self, src: int | None, taghash: int, what: str, hbuf: _RecvBuffer | None = None,
                    srcs: list[int] = ()):
        """Post the receive of a frame's first message: (buffer, expected sizes per source, work)."""
        if src is not None:
            e = self._sizes_in.expected(src, taghash) if self._sizes_in else None
            expected = _NO_SIZES if e is None else {src: e}
        else:
            expected = {s: e for s in srcs if (e := self._sizes_in.expected(s, taghash)) is not None}
        if expected:
            hbuf = self._sized_buffer(set(expected.values()))
        else:
            # Only the bytes the reused buffer's last message wrote need their guard back (a
            # message writes its own length and no more): after a checked frame its ``end``, else all.
            hbuf = self._hbuf if hbuf is None else hbuf
            dirty, hbuf.dirty = hbuf.dirty, FIRST_BUFFER_NBYTES
            hbuf.write(0, self._first_guard_view[:dirty])  # a slice of a memoryview: no copy
        return hbuf, expected, self._post_message(hbuf.tensor, src, what)

    def _frame(self, got: int, taghash: int, posted, in_place: bool = False):
        """The payload of a frame from ``got`` whose first message (``_post_first``) has arrived:
        that message checked, the body received if one follows, the pair's size history updated.
        One function for the blocking, posted and any-source receives, each of which waits for its
        own message first (every layer of calls between gloo's wait and the payload is on a
        ping-pong's critical path).  ``in_place`` (``Comm.recv_read``): the payload as
        ``_recv_in_place`` gives it, in the reused buffer where the frame came inline."""
        # The checks read numpy views on the host: no tensor op (and no tensor the memory
        # meter would count) per check.
        hbuf, expected, _ = posted
        n = parse_frame_header(hbuf.read(0, FRAME_HEADER_NBYTES), rank=self.rank, src=got,
                               taghash=taghash, max_frame_bytes=self.max_frame_bytes)
        sized = n == expected.get(got)  # the whole frame, at the size this pair's history expects
        inline = sized or n <= INLINE_MAX_PAYLOAD  # the payload and its end marker came with the header
        end = FRAME_HEADER_NBYTES + (n + FRAME_END_NBYTES if inline else 0)
        tail = hbuf.read(end - FRAME_END_NBYTES, end + _CHECKED)
        guard = _far_guard(self._first_guard, end, end + _CHECKED) if sized else self._first_guard[end: end + _CHECKED]
        if inline:
            check_frame_end(tail[:FRAME_END_NBYTES], rank=self.rank, src=got, nbytes=n)
        self._check_guard(tail[FRAME_END_NBYTES:], guard, got, end)
        if sized:  # a buffer of its own: the payload is a view of it
            payload = hbuf.payload(FRAME_HEADER_NBYTES, n)
        else:
            hbuf.dirty = end
            if in_place and inline and hbuf.view is not None:  # read where it lies, not copied out
                if self._sizes_in:  # (an inline frame's size: recorded only once a pair has a history)
                    self._sizes_in.record(got, taghash, n)
                at = FRAME_HEADER_NBYTES
                return hbuf.view[at:at + n], hbuf.addr + at
            # the reused buffer: copied out; or the header alone, and the body follows
            payload = hbuf.take(FRAME_HEADER_NBYTES, n) if inline else self._recv_body(n, got)
        if self._sizes_in or n >= SIZED_MIN_PAYLOAD:  # else nothing to record (a call per message saved)
            self._sizes_in.record(got, taghash, n)
        return payload_view(payload) if in_place else payload

    def _post_recv_frame(self, src, taghash):
        posted = _PostedFrame(self, src, taghash)
        queue = self._ahead.setdefault(src, deque())
        queue.append(posted)
        if len(queue) == 1:  # nothing from this peer is posted before it: to the transport now
            posted.start()
        return posted

    def _peer_buffer(self, src: int) -> _RecvBuffer:
        """The first buffer of ``src``'s posted receives (one posted to the transport at a time)."""
        if src not in self._peer_buffers:
            self._peer_buffers[src] = _RecvBuffer(self.device, self._host)
        return self._peer_buffers[src]

    def _recv_frame(self, src, taghash, hbuf: _RecvBuffer | None = None, in_place: bool = False):
        what = self._recv_what[src]
        posted = self._post_first(src, taghash, what, hbuf)
        self._wait(posted[2], what)
        return self._frame(src, taghash, posted, in_place)

    def _recv_in_place(self, src, taghash):
        return self._recv_frame(src, taghash, in_place=True)

    def _recv_any_frame(self, srcs, taghash):
        # The first message from any source (gloo's recv-from-any-source), then the body
        # from that source: per-pair FIFO order keeps header and body together.
        what = f"recv from any of ranks {srcs}"
        posted = self._post_first(None, taghash, what, srcs=srcs)
        self._wait(posted[2], what)
        with self._guard(what):
            src = int(posted[2]._source_rank())
        if src not in srcs:
            raise CommError(f"rank {self.rank}: {what} got a message from rank {src}, "
                            "which is not one of them (the ranks' programs disagree)")
        return src, self._frame(src, taghash, posted)

    def _recv_body(self, n: int, src: int) -> torch.Tensor:
        """The payload of ``n`` bytes a checked header announced, in its own message."""
        try:  # the announced size, validated by the header's checks; only now is memory spent on it
            buf = _RecvBuffer(self.device, self._host, n + FRAME_END_NBYTES + BODY_SLACK)
        except RuntimeError as e:
            raise CommError(f"rank {self.rank}: cannot allocate {n} bytes for the frame from rank {src} "
                            f"({str(e).splitlines()[0][:120]})") from e
        end = n + FRAME_END_NBYTES
        slack_guard = self._first_guard[-_CHECKED:]
        buf.write(n, bytes(FRAME_END_NBYTES) + slack_guard)  # a short message leaves the marker's slot zero
        what = self._recv_what[src]
        self._wait(self._post_message(buf.tensor, src, what), what)
        got = buf.read(n, end + _CHECKED)
        self._check_guard(got[FRAME_END_NBYTES:], slack_guard, src, end)
        check_frame_end(got[:FRAME_END_NBYTES], rank=self.rank, src=src, nbytes=n)
        return buf.payload(0, n)  # a view of the receive buffer (no copy)

    def _all_gather_raw(self, data):
        self._flush_sends()  # a synchronisation point: every send posted before it has completed
        # Sizes first, so unequal contributions are an error rather than garbage.
        size = torch.tensor([data.numel()], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.world_size)]
        with self._guard("all_gather"):
            self._wait(dist.all_gather(sizes, size, async_op=True), "all_gather")
        if len({int(s) for s in sizes}) != 1:
            raise CommError(f"rank {self.rank}: all_gather with unequal sizes {[int(s) for s in sizes]}")
        out = [torch.empty_like(data, device=self.device) for _ in range(self.world_size)]
        with self._guard("all_gather"):
            self._wait(dist.all_gather(out, self._to_dev(data), async_op=True), "all_gather")
        return [o.cpu() for o in out]

    def _broadcast_raw(self, data, src):
        self._flush_sends()  # a synchronisation point: every send posted before it has completed
        buf = self._to_dev(data)
        with self._guard("broadcast"):
            self._wait(dist.broadcast(buf, src, async_op=True), "broadcast")
        return buf.cpu()

    def _barrier(self):
        self._flush_sends()  # a synchronisation point: every send posted before it has completed
        with self._guard("barrier"):
            self._wait(dist.barrier(async_op=True), "barrier")

    def _gather_bytes_raw(self, data):
        self._flush_sends()  # a synchronisation point: every send posted before it has completed
        # Sizes first (bounded before allocating), then the contributions in rounds of at most
        # GATHER_ROUND_BYTES per rank, each padded to the round's width; rank 0 keeps each
        # rank's declared prefix.  What rank 0 holds grows with the bytes that arrived, never
        # with a number a peer declared: a peer that announces 1 GiB and sends nothing costs
        # one round's buffers, not a 1 GiB allocation on every rank.
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.world_size)]
        with self._guard("gathering results"):
            self._wait(dist.all_gather(sizes, size, async_op=True), "gathering results")
        n = [int(s) for s in sizes]
        for r, k in enumerate(n):
            if not 0 <= k <= self.max_frame_bytes:
                who = "its own result is" if r == self.rank else f"rank {r} declared a result of"
                raise CommError(f"rank {self.rank}: {who} {k} bytes, above the largest frame "
                                f"({self.max_frame_bytes} bytes, --max-frame-bytes)")
        parts = [bytearray() for _ in n] if self.rank == 0 else None
        for lo in range(0, max(n), GATHER_ROUND_BYTES):
            width = min(GATHER_ROUND_BYTES, max(n) - lo)
            try:  # bounded above; a machine short of memory is still a CommError, not a crash
                buf = torch.zeros(width, dtype=torch.uint8)
                mine = data[lo:lo + width]
                if mine:
                    buf[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
                buf = self._to_dev(buf)
                out = [torch.empty_like(buf) for _ in n] if self.rank == 0 else None
            except RuntimeError as e:
                raise CommError(f"rank {self.rank}: cannot allocate {width} bytes per rank for the "
                                f"results ({str(e).splitlines()[0][:120]})") from e
            with self._guard("gathering results"):
                self._wait(dist.gather(buf, out, dst=0, async_op=True), "gathering results")
            if parts is not None:
                for part, o, k in zip(parts, out, n, strict=True):
                    part += o[:max(0, min(k - lo, width))].cpu().numpy().tobytes()
        return None if parts is None else [bytes(part) for part in parts]

    def _close_sends(self) -> None:
        super()._close_sends()  # the paced sends still queued are posted first
        # Leaving the group ends every send posted on it, from any Comm of this process
        # (a program may have made more than one and closed only one): all are delivered first.
        for comm in [self, *(c for c in list(_POSTING) if c is not self)]:
            comm._finish_sends(comm._flush_sends)
            comm._sends.clear()
            comm._sends_bytes = 0
            _POSTING.discard(comm)

    def close(self):
        super().close()
        # A receive posted to the transport and never taken (a program that posted more than it
        # took) leaves gloo a pointer into its buffer: the group is not destroyed under it (the
        # Comm keeps the buffer); the process's exit ends both.
        left = any(queue and queue[0]._first is not None for queue in self._ahead.values())
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
            self.board.close()
            self.board = None
        # the Comm's own reference to the group goes first: a group object still referenced when
        # the group is destroyed lives on until the interpreter's exit, whose teardown of gloo's
        # threads then aborts the process ("terminate called without an active exception")
        self._pg = None
        if dist.is_initialized() and not left:
            dist.destroy_process_group()
