"""The Comm: the only way rank programs talk to each other.

Rank programs are SPMD functions that call ``send``/``recv`` with serialized
payloads (1-D uint8 tensors: real bytes, e.g. a codec's output) and the
numeric collectives ``broadcast``/``all_reduce``/``all_gather`` on tensors of
a shape every rank knows.  Every operation is metered (see ``byte_meter``) and has
a timeout; a dead or stuck peer raises ``CommError`` instead of hanging.

Backends implement five raw primitives; everything else (metering, latency
injection, argument checks, the deterministic reduction) lives here once, so
the same rank program gives bit-identical results on every CPU backend.
"""

from __future__ import annotations

import functools
import math
import struct
import time
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

import torch

from .byte_meter import FRAME_HEADER_BYTES, ByteMeter, Flow
from .pacer import LinkPacer, PacedSender, wire_bytes
from .progress_board import COMPUTING, FINISHED, WAITING, ProgressBoard, load_note


class CommError(RuntimeError):
    """A communication failed: timeout, dead peer, or a protocol mismatch."""


class CommTimeout(CommError):
    """A wait ran out of time.  When the run's progress board could tell,
    ``stalled_rank`` is the peer that stopped making progress and
    ``stall_reason`` says how; ``waited`` is the timed-out wait itself."""

    def __init__(self, message: str, stalled_rank: int | None = None, stall_reason: str = ""):
        super().__init__(message if stalled_rank is None else
                         f"{message}; rank {stalled_rank} stopped making progress: {stall_reason}")
        self.waited = message
        self.stalled_rank = stalled_rank
        self.stall_reason = stall_reason

    def blame(self) -> str:
        """The failure as told of the stalled rank (for RankFailed)."""
        return f"stopped making progress: {self.stall_reason} (found when {self.waited})"


class RankFailed(RuntimeError):
    """A run ended because one rank failed (``rank`` -1: the run as a whole)."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        self.message = message
        who = f"rank {rank}" if rank >= 0 else "the run"
        super().__init__(f"{who} failed: {message}")


@functools.lru_cache(maxsize=4096)
def tag_hash(tag: str) -> int:
    # cached: a program uses a handful of tags, and this runs on every message
    return zlib.crc32(tag.encode())


# ---- frame protocol --------------------------------------------------------
# A point-to-point message is a frame:
#   header  (14 bytes): uint32 tag hash, uint64 payload length n, magic b"\xcb\xf1"
#   body    (n + 2 bytes): the payload, then the end marker b"\xcb\xe0"
# (16 framing bytes in all, FRAME_HEADER_BYTES); how a backend splits it into
# transport messages is its own (torchdist: one message for a small frame, two else).  Each ends in a fixed nonzero
# byte pair, so a receiver that clears those two bytes before the transport
# writes into its buffer sees a message that came up short: they are still zero.
# The receiver checks n against the maximum frame size (max_frame_bytes, a run
# option) before it allocates or posts a buffer for the body, so a hostile length
# allocates nothing; a sender refuses a payload above it on its own side, so a
# frame from a peer that follows the protocol never announces more.  Detecting a
# message that is *longer* than announced is the backend's part (torchdist: guard
# bytes after the expected end, and what gloo cannot catch; threads: the length
# of the queued tensor).
FRAME_MAGIC = b"\xcb\xf1"
FRAME_END = b"\xcb\xe0"
_FRAME_HEADER = struct.Struct("<IQ2s")
FRAME_HEADER_NBYTES = _FRAME_HEADER.size  # 14
FRAME_END_NBYTES = len(FRAME_END)
assert FRAME_HEADER_NBYTES + FRAME_END_NBYTES == FRAME_HEADER_BYTES
#: Default largest payload a Comm sends or accepts: 1 GiB, above the largest
#: message of the shipped algorithms (a full fp32 model of 125M parameters is 0.5 GB).
DEFAULT_MAX_FRAME_BYTES = 1 << 30
#: Sends a rank has posted and whose receives are not known to be posted, past which a send waits
#: for the oldest of them (bytes, frames).  Every backend keeps this bound, because gloo cannot do
#: without it (harness/comm/torchdist.py: its send work says it completed only once waited on)
#: and a rank program must behave alike on every backend: two ranks that each send more than the
#: bound to the other before receiving wait for each other at it, on threads as on gloo, and the
#: wait's timeout says why (``in_flight_timeout``).  Eight frames cover a step's micro-batches to
#: one peer, so a stage still computes while they are on the wire; the oldest has been received
#: by the time a ninth is sent unless the link is the bottleneck, which then sets the pace anyway.
MAX_IN_FLIGHT_BYTES = 64 << 20
MAX_IN_FLIGHT_FRAMES = 8


def pack_frame_header(nbytes: int, taghash: int) -> bytes:
    return _FRAME_HEADER.pack(taghash, nbytes, FRAME_MAGIC)


def pack_frame_header_into(buf: memoryview, nbytes: int, taghash: int) -> None:
    """The header, written into the first ``FRAME_HEADER_NBYTES`` bytes of ``buf``."""
    _FRAME_HEADER.pack_into(buf, 0, taghash, nbytes, FRAME_MAGIC)


def parse_frame_header(raw: bytes, *, rank: int, src: int, taghash: int, max_frame_bytes: int) -> int:
    """The payload length announced by a received header, or CommError naming the peer."""
    if len(raw) != FRAME_HEADER_NBYTES:
        raise CommError(f"rank {rank}: frame header from rank {src} has {len(raw)} bytes, "
                        f"not {FRAME_HEADER_NBYTES}")
    got, n, magic = _FRAME_HEADER.unpack(raw)
    if magic != FRAME_MAGIC:
        raise CommError(f"rank {rank}: malformed frame header from rank {src} "
                        "(short, or not a commbench frame)")
    if got != taghash:
        raise CommError(f"rank {rank}: message from rank {src} has another tag than "
                        "the one received (the ranks' programs disagree)")
    if n > max_frame_bytes:
        raise CommError(f"rank {rank}: frame from rank {src} announces {n} bytes, more than "
                        f"the maximum frame size {max_frame_bytes} (max_frame_bytes, --max-frame-bytes)")
    return n


def check_frame_end(end: bytes, *, rank: int, src: int, nbytes: int) -> None:
    """CommError unless a body's last two bytes are the end marker."""
    if end != FRAME_END:
        raise CommError(f"rank {rank}: frame body from rank {src} is shorter than the "
                        f"{nbytes} bytes announced, or corrupt (no end marker)")


#: Writes a payload in place (:meth:`Comm.send_written`): ``write(view, address)``.
Writer = Callable[[memoryview, int], None]


#: Reads a payload where it lies (:meth:`Comm.recv_read`): ``read(view, address)``.
Reader = Callable[[memoryview, int], object]


def payload_view(data: torch.Tensor) -> tuple[memoryview, int]:
    """A host payload as a ``Reader`` takes it: a memoryview of its bytes, the first's address."""
    return memoryview(data.numpy()), data.data_ptr()


def read_payload(data: torch.Tensor, read: Reader):
    """``read`` of a payload received into a tensor of its own."""
    return read(*payload_view(data))


def written_payload(nbytes: int, write: Writer) -> torch.Tensor:
    """The payload ``write`` writes, in a tensor of its own (what ``send`` takes)."""
    out = torch.empty(nbytes, dtype=torch.uint8)
    write(memoryview(out.numpy()), out.data_ptr())
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (bit-preserving view), as a flat uint8 tensor."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def from_bytes(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return b.view(like.dtype).reshape(like.shape)


_REDUCE_OPS = ("sum", "mean", "max", "min")


class _AtWait:
    """A posted receive that a backend runs when it is waited on (the threads backend: its
    mailbox already holds the frame, so posting early has nothing to start)."""

    def __init__(self, recv_frame, src: int, taghash: int):
        self._recv = recv_frame
        self._src, self._taghash = src, taghash

    def result(self) -> torch.Tensor:
        return self._recv(self._src, self._taghash)


class PostedRecv:
    """A receive posted ahead of need (:meth:`Comm.irecv`): the next frame from ``src``,
    under ``tag``.  Waited on once, in posting order per peer; metered when waited on."""

    def __init__(self, comm: Comm, src: int, tag: str, pending):
        self.comm, self.src, self.tag = comm, src, tag
        self._pending = pending  # .result() -> payload, raising what the receive raised

    def wait(self) -> torch.Tensor:
        return self.comm._take(self)


class _Waiting:
    """``with comm._waiting:`` around a blocking operation: the rank is marked waiting on
    its progress board (if it has one) and a timeout inside names the stalled peer.  A plain
    object, not a generator context manager: it is entered on every send and receive."""

    def __init__(self, comm: Comm):
        self._comm = comm

    def __enter__(self) -> None:
        comm = self._comm
        if comm.board is not None:
            comm.board.mark(comm.rank, WAITING)

    def __exit__(self, kind, exc, tb) -> bool:
        comm = self._comm
        board = comm.board
        if board is None:
            return False
        if not isinstance(exc, CommTimeout):
            board.mark(comm.rank, COMPUTING)
            return False
        # A timed-out rank stays marked waiting: it made no progress, and a peer whose own
        # wait times out a moment later must not take it for a rank stuck computing.
        if exc.stalled_rank is None:
            found = board.stalled(comm.rank)
            if found is not None:
                raise CommTimeout(str(exc), found[0], found[1] + load_note()) from exc
        return False


class Comm(ABC):
    """SPMD communicator for one rank.  Subclasses provide the raw primitives."""

    backend: str = "?"

    def __init__(self, rank: int, world_size: int, *, timeout_s: float = 120.0,
                 latency_ms: float = 0.0, metered: bool = True,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, board: ProgressBoard | None = None,
                 bandwidth_bps: float | None = None, max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES,
                 max_in_flight_frames: int = MAX_IN_FLIGHT_FRAMES):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if latency_ms < 0:
            raise ValueError("latency_ms must be >= 0")
        if not isinstance(max_frame_bytes, int) or not 1 <= max_frame_bytes < 2**63:
            raise ValueError(f"max_frame_bytes must be an integer in 1..2**63-1, got {max_frame_bytes!r}")
        if max_in_flight_frames < 1 or max_in_flight_bytes < 1:
            raise ValueError("max_in_flight_frames and max_in_flight_bytes must be >= 1")
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight_bytes = max_in_flight_bytes
        self.max_in_flight_frames = max_in_flight_frames
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.latency_s = latency_ms / 1000.0
        self.meter = ByteMeter(rank, enabled=metered)
        self.board = board
        if board is not None:
            board.mark(rank, COMPUTING)
        # user-space shaping of this rank's link (net="pacer"; see pacer.py)
        self.pacer = LinkPacer(bandwidth_bps) if bandwidth_bps else None
        self._sender: PacedSender | None = None  # started by the first paced send
        # posted sends whose receives are not known to be posted, oldest first (each backend's
        # own record of one), and their bytes: held to the bound by _wait_to_the_bound
        self._sends: deque = deque()
        self._sends_bytes = 0
        self._posted: dict[int, deque[PostedRecv]] = {}  # per peer, oldest first
        # ``with self._waiting:`` around a blocking operation: the rank is marked waiting on the
        # board, and a timeout inside names the stalled peer (an attribute: entered per message)
        self._waiting = _Waiting(self)
        self._p2p_flows: dict[tuple[str, int, str], Flow] = {}  # per (direction, peer, tag)

    # ---- raw primitives -------------------------------------------------
    @abstractmethod
    def _send_frame(self, data: torch.Tensor, dst: int, taghash: int) -> None: ...

    def _send_written_frame(self, nbytes: int, write: Writer, dst: int, taghash: int) -> None:
        """``_send_frame`` of the payload that ``write`` writes (:meth:`send_written`).  Here it
        is written into a payload of its own; a backend that builds each frame in a buffer of its
        own has ``write`` fill the frame instead."""
        self._send_frame(written_payload(nbytes, write), dst, taghash)

    @abstractmethod
    def _recv_frame(self, src: int, taghash: int) -> torch.Tensor: ...

    def _post_recv_frame(self, src: int, taghash: int):
        """Start receiving the next frame from ``src``; an object whose ``result()`` is its
        payload.  Default: nothing starts before the wait."""
        return _AtWait(self._recv_frame, src, taghash)

    def _recv_any_frame(self, srcs: list[int], taghash: int) -> tuple[int, torch.Tensor]:
        """The next frame from whichever of ``srcs`` has one first: (source, payload)."""
        raise CommError(f"the {self.backend} backend has no receive-from-any")

    @abstractmethod
    def _all_gather_raw(self, data: torch.Tensor) -> list[torch.Tensor]:
        """All ranks pass uint8 tensors of equal length; returns them in rank order."""

    @abstractmethod
    def _broadcast_raw(self, data: torch.Tensor, src: int) -> torch.Tensor: ...

    @abstractmethod
    def _barrier(self) -> None: ...

    @abstractmethod
    def _gather_bytes_raw(self, data: bytes) -> list[bytes] | None: ...

    def close(self) -> None:
        """Release backend resources (and tell the board this rank is done)."""
        self._close_sends()
        if self.board is not None:
            self.board.mark(self.rank, FINISHED)

    # ---- control plane -----------------------------------------------------
    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """Control plane (not metered): rank 0 receives every rank's bytes, others None.

        Bytes only: what a peer sends is parsed by a validating decoder
        (``harness.rank_output_wire``), never unpickled.
        """
        with self._waiting:
            self._sync_sends()
            return self._gather_bytes_raw(bytes(data))

    # ---- helpers ---------------------------------------------------------
    def _check_peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size:
            raise ValueError(f"{what} {peer!r} is not a rank of a world of size {self.world_size}")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot {what.split()[0]} to/from itself")

    def _delay(self, messages: int) -> None:
        # Injected latency (tc netem is not available on the CI kernels): the
        # sender pays alpha per message before handing it to the transport.
        if self.latency_s and messages:
            time.sleep(self.latency_s * messages)

    def _pace(self, direction: str, payload: int, framing: int = 0) -> None:
        if self.pacer is not None:
            getattr(self.pacer, direction)(wire_bytes(payload, framing))

    def _collective_rounds(self) -> int:
        return max(1, math.ceil(math.log2(self.world_size))) if self.world_size > 1 else 0

    # ---- point to point ---------------------------------------------------
    def send(self, data: torch.Tensor, dst: int, tag: str = "") -> None:
        """Send a serialized payload (1-D uint8 tensor) to ``dst``."""
        self._check_peer(dst, "send to rank")
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise TypeError("Comm.send takes a serialized payload: a 1-D uint8 tensor")
        n = data.numel()
        self._check_frame_size(n, dst)
        if self.latency_s:  # tested here, not in _delay: a call per message
            self._delay(1)
        release = None if self.pacer is None else self.pacer.outgoing_release(wire_bytes(n, FRAME_HEADER_BYTES))
        if release is not None and (release > self.pacer.clock() or not self._sender_idle()):
            # the link delays the bytes, not the caller: the sender thread posts them at release
            self._paced_sender().put(release, data.detach().contiguous().clone(), dst, tag_hash(tag))
        else:  # unshaped, or covered by the bucket behind an idle sender: it leaves now, from here,
            with self._waiting:  # as through tbf (no hop through the sender thread)
                self._send_frame(data.contiguous(), dst, tag_hash(tag))
        self.meter.record(self._p2p_flow("sent", dst, tag), n, framing=FRAME_HEADER_BYTES)

    def send_written(self, nbytes: int, write: Writer, dst: int, tag: str = "") -> None:
        """``send`` of the ``nbytes``-byte payload that ``write(view, address)`` writes: ``view``
        is a memoryview of exactly those bytes and ``address`` where the first of them is.  A
        backend that builds each frame in a buffer of its own has it written there, so the payload
        is not made first and copied into the frame (a codec's ``Codec.writer``: a message's cost
        in a pipeline step is mostly per call, benchmarks/results/written-frames/).  ``write`` must
        write every byte and keep no reference to the view.  Checks, pacing and metering are
        ``send``'s."""
        self._check_peer(dst, "send to rank")
        self._check_frame_size(nbytes, dst)  # before anything is written
        if self.pacer is not None:  # the paced sender holds a payload of its own until its release
            self.send(written_payload(nbytes, write), dst, tag)
            return
        if self.latency_s:
            self._delay(1)
        with self._waiting:
            self._send_written_frame(nbytes, write, dst, tag_hash(tag))
        self.meter.record(self._p2p_flow("sent", dst, tag), nbytes, framing=FRAME_HEADER_BYTES)

    def _check_frame_size(self, n: int, dst: int) -> None:
        """A payload above the maximum frame size is refused here, before anything is posted."""
        if n > self.max_frame_bytes:
            raise CommError(f"rank {self.rank}: message of {n} bytes to rank {dst} exceeds "
                            f"the maximum frame size {self.max_frame_bytes} (raise it with "
                            f"--max-frame-bytes or --set max_frame_bytes=...)")

    def _p2p_flow(self, direction: str, peer: int, tag: str) -> Flow:
        """The meter's flow of the frames ``direction`` ("sent" or "received") ``peer`` under
        ``tag``, made once: a named tuple's constructor is Python code, and this runs on every
        message."""
        flow = self._p2p_flows.get((direction, peer, tag))
        if flow is None:
            ends = (self.rank, peer) if direction == "sent" else (peer, self.rank)
            flow = Flow(*ends, direction, tag, "send" if direction == "sent" else "recv")
            self._p2p_flows[direction, peer, tag] = flow
        return flow

    def _close_sends(self) -> None:
        """At close: post what the paced sender still holds (see :meth:`_finish_sends`)."""
        if self._sender is not None:
            self._finish_sends(self._sender.drain, self.timeout_s)
            self._sender.stop()
            self._sender = None

    def _finish_sends(self, flush, *args) -> None:
        """At close: deliver what is still posted (a program may end right after a send), as far
        as the peers take it.  A failure here is not raised: after a failed run the peers are
        gone, and the failure that matters was raised (and reported) before close."""
        try:
            flush(*args)
        except CommError:
            pass

    def _sender_idle(self) -> bool:
        """No paced send is queued or being posted (a failed one raises here)."""
        if self._sender is None:
            return True
        self._sender.check()
        return self._sender.idle()

    def _paced_sender(self) -> PacedSender:
        if self._sender is None:
            self._sender = PacedSender(self._send_frame, self.pacer.clock, f"rank{self.rank}-paced-send")
        self._sender.check()
        return self._sender

    def _past_the_bound(self, frames: int, nbytes: int) -> bool:
        """Whether ``frames`` sends of ``nbytes`` in all in flight are past the bound: the oldest
        is then waited on (never the last one alone, whatever its size)."""
        return frames > 1 and (nbytes > self.max_in_flight_bytes or frames > self.max_in_flight_frames)

    def _wait_to_the_bound(self, wait_oldest: Callable[[], None]) -> None:
        """After a send: while the sends in flight are past the bound, ``wait_oldest()`` (the
        backend's wait for its oldest send, which leaves ``_sends`` and ``_sends_bytes``); its
        timeout says why it was waited on."""
        while self._past_the_bound(len(self._sends), self._sends_bytes):
            frames, held = len(self._sends), self._sends_bytes
            try:
                wait_oldest()
            except CommTimeout as e:  # the wait a program can stop in (MAX_IN_FLIGHT_FRAMES)
                raise self.in_flight_timeout(e, frames, held) from e

    def in_flight_timeout(self, e: CommTimeout, frames: int, nbytes: int) -> CommTimeout:
        """The timeout of a wait at the bound, saying why a correct-looking program can stop
        there: the one wait the bound adds (``MAX_IN_FLIGHT_FRAMES``)."""
        return CommTimeout(
            f"{e}; it was waited on because {frames} frames ({nbytes} bytes) were in flight, "
            f"above max_in_flight_frames={self.max_in_flight_frames} or max_in_flight_bytes="
            f"{self.max_in_flight_bytes}, and a send completes only once its receive is posted "
            "(on every backend): a peer that sends to this rank past the bound before receiving "
            "waits for it in turn (receive between the sends, or raise the bound)")

    def _sync_sends(self) -> None:
        """A synchronisation point: every paced send queued before it has been posted."""
        if self._sender is not None and not self._sender.drain(self.timeout_s):
            raise CommTimeout(f"rank {self.rank}: paced sends were not posted within "
                              f"{self.timeout_s:g} s of their release")

    def irecv(self, src: int, tag: str = "") -> PostedRecv:
        """Post the receive of the next payload from ``src`` now, so its transfer overlaps what
        the caller computes meanwhile.  Receives from a peer complete in the order they were
        posted: a later ``recv(src)`` (or ``wait``) takes the oldest posted one first, whose tag
        must be the one it asks for.  Checks, timeout and metering are ``recv``'s."""
        self._check_peer(src, "recv from rank")
        posted = PostedRecv(self, src, tag, self._post_recv_frame(src, tag_hash(tag)))
        self._posted.setdefault(src, deque()).append(posted)
        return posted

    def recv(self, src: int, tag: str = "") -> torch.Tensor:
        """Receive the next payload from ``src``; the tag must match the sender's."""
        self._check_peer(src, "recv from rank")
        posted = self._posted.get(src)
        if posted:  # a receive posted earlier is the next one from this peer
            if posted[0].tag != tag:
                raise CommError(f"rank {self.rank}: receive from rank {src} under tag {tag!r} while "
                                f"one under {posted[0].tag!r} was posted before it (the program posts "
                                "receives it does not take in order)")
            return self._take(posted[0])
        with self._waiting:
            data = self._recv_frame(src, tag_hash(tag))
        return self._received(src, tag, data)

    def recv_read(self, src: int, read: Reader, tag: str = ""):
        """``read(view, address)`` of the next payload from ``src`` (``recv``'s), read where the
        backend received it: ``view`` is a memoryview of exactly its bytes and ``address`` where
        the first of them is.  A backend that receives a small frame into a buffer it reuses has
        it read there, so the payload is not copied out first (a codec's ``Codec.reader``).
        ``read`` must keep no reference to the view.  Returns what ``read`` returns; checks,
        timeout and metering are ``recv``'s."""
        self._check_peer(src, "recv from rank")
        if self._posted.get(src):  # a receive posted earlier is the next one: its payload, read
            return read_payload(self.recv(src, tag), read)
        with self._waiting:
            view, address = self._recv_in_place(src, tag_hash(tag))
        self._received_nbytes(src, tag, len(view))  # metered as it arrived, whatever read makes of it
        return read(view, address)

    def _recv_in_place(self, src: int, taghash: int) -> tuple[memoryview, int]:
        """The next frame's payload (:meth:`recv_read`) as a memoryview of its bytes and the
        address of the first, where the backend holds it: valid until this Comm's next receive.
        Here, a payload of its own as ``_recv_frame`` receives it."""
        return payload_view(self._recv_frame(src, taghash))

    def _take(self, posted: PostedRecv) -> torch.Tensor:
        queue = self._posted.get(posted.src)
        if not queue or queue[0] is not posted:
            raise CommError(f"rank {self.rank}: a posted receive from rank {posted.src} was waited on "
                            "twice or out of order (receives from a peer complete in posting order)")
        queue.popleft()
        with self._waiting:
            data = posted._pending.result()
        return self._received(posted.src, posted.tag, data)

    def _received(self, src: int, tag: str, data: torch.Tensor) -> torch.Tensor:
        self._received_nbytes(src, tag, data.numel())
        return data

    def _received_nbytes(self, src: int, tag: str, n: int) -> None:
        if self.pacer is not None:  # tested here, not in _pace: a call per message
            self._pace("incoming", n, FRAME_HEADER_BYTES)
        self.meter.record(self._p2p_flow("received", src, tag), n, framing=FRAME_HEADER_BYTES)

    def recv_any(self, srcs: list[int], tag: str = "") -> tuple[int, torch.Tensor]:
        """Receive the next payload from whichever rank of ``srcs`` sends first.

        Returns ``(source, payload)``.  Metered exactly like ``recv`` from that
        source; the tag must match the sender's; bounded by the timeout.
        """
        srcs = list(srcs)
        if not srcs:
            raise ValueError("recv_any needs at least one source rank")
        for src in srcs:
            self._check_peer(src, "recv from rank")
        if len(set(srcs)) != len(srcs):
            raise ValueError(f"recv_any sources {srcs} contain duplicates")
        if any(self._posted.get(src) for src in srcs):
            raise CommError(f"rank {self.rank}: receive from any of ranks {srcs} while a receive from "
                            "one of them is posted (it would take that receive's frame)")
        with self._waiting:
            src, data = self._recv_any_frame(srcs, tag_hash(tag))
        return src, self._received(src, tag, data)

    # ---- collectives --------------------------------------------------------
    def all_gather(self, tensor: torch.Tensor, tag: str = "") -> list[torch.Tensor]:
        """Every rank's tensor (same shape and dtype everywhere), in rank order."""
        raw = as_bytes(tensor)
        if self.world_size == 1:
            return [tensor.detach().clone()]
        self._delay(self._collective_rounds())
        peers = self.world_size - 1
        self._pace("outgoing", raw.numel() * peers)
        with self._waiting:
            self._sync_sends()
            parts = self._all_gather_raw(raw)
        self._pace("incoming", raw.numel() * peers)
        self.meter.record(Flow(self.rank, -1, "sent", tag, "all_gather"), raw.numel() * peers, peers)
        self.meter.record(Flow(-1, self.rank, "received", tag, "all_gather"), raw.numel() * peers, peers)
        return [from_bytes(p, tensor) for p in parts]

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", tag: str = "") -> torch.Tensor:
        """Reduce over ranks; returns a new tensor, identical on every rank.

        Implemented as an all-gather followed by a reduction in rank order, so
        the result is bit-identical on every backend and every rank.
        """
        if op not in _REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}; choose from {', '.join(_REDUCE_OPS)}")
        parts = self.all_gather(tensor, tag=tag)
        acc = parts[0].clone()
        for p in parts[1:]:
            if op in ("sum", "mean"):
                acc += p
            elif op == "max":
                acc = torch.maximum(acc, p)
            else:
                acc = torch.minimum(acc, p)
        if op == "mean":
            acc /= self.world_size
        return acc

    def broadcast(self, tensor: torch.Tensor, src: int, tag: str = "") -> torch.Tensor:
        """``src``'s tensor on every rank (others pass a tensor of the same shape and dtype)."""
        if not isinstance(src, int) or not 0 <= src < self.world_size:
            raise ValueError(f"broadcast source {src!r} is not a rank of a world of size {self.world_size}")
        if self.world_size == 1:
            return tensor.detach().clone()
        raw = as_bytes(tensor)
        peers = self.world_size - 1
        if self.rank == src:
            self._delay(self._collective_rounds())
            self._pace("outgoing", raw.numel() * peers)
        with self._waiting:
            self._sync_sends()
            out = self._broadcast_raw(raw.clone(), src)
        if self.rank != src:
            self._pace("incoming", raw.numel())
        if self.rank == src:
            self.meter.record(Flow(src, -1, "sent", tag, "broadcast"), raw.numel() * peers, peers)
        else:
            self.meter.record(Flow(src, self.rank, "received", tag, "broadcast"), raw.numel(), 1)
        return from_bytes(out, tensor).clone()

    def barrier(self) -> None:
        """Wait for every rank (not metered: it carries no payload)."""
        if self.world_size > 1:
            with self._waiting:
                self._sync_sends()
                self._barrier()
