"""Metered communication for SPMD rank programs (see base.Comm).

Byte vocabulary, one meaning per word across the code and the result records:

payload
    The serialized bytes of one message as a rank program hands them to the
    Comm (a codec's output, header included).  The byte meter
    (:mod:`.byte_meter`) counts them once as sent and once as received; a
    run's ``payload_bytes_per_step`` sums the ranks' sent payloads.
framing
    The Comm's own per-message header, ``FRAME_HEADER_BYTES`` (length and
    tag hash, :mod:`.torchdist`), counted apart as ``framing_bytes_per_step``
    on every backend, also on ``threads`` where no header is sent, so that
    backends agree.
wire bytes
    What the kernel counted on a rank's network interface in the measured
    window; only in ``net="netns"`` runs (:mod:`harness.netns`).  Payload and
    framing plus the transport's own bytes (Ethernet/IP/TCP headers,
    acknowledgements): ``wire_bytes_per_step``, ``wire_to_payload_ratio``
    (against payload plus framing).  "Wire" alone means this and nothing else.
codec header
    The fixed fields at the head of a codec's payload (magic, version, family
    id, dtype, shape, codec parameters, CRC; ``algorithms/codecs/_core.py``);
    part of the payload, not of the framing.
transmit dtype
    The dtype a codec carries values in (``fp16`` sends float16;
    ``DenseCodec.transmit_dtype``).  Protocol's ``wire`` parameter, a user-facing
    run parameter kept for the records and the command line, names one too.
message layout
    What an algorithm puts in its payloads and the closed form of their size:
    SparQ's ``algorithms/zo/wire.py`` and the parameter server's
    ``algorithms/dataparallel/dq_wire.py`` (module names kept).
boundary map
    Protocol's ``Wire`` class (``algorithms/protocol/subspace.py``): the
    lossless map between a stage's activations and the coefficients it sends;
    a transform, not a byte count.
"""

from .base import Comm, CommError, CommTimeout, RankFailed, as_bytes, from_bytes
from .byte_meter import FRAME_HEADER_BYTES, ByteMeter, Flow, MeterSnapshot
from .threads import ThreadsComm, ThreadsWorld, run_threads

BACKENDS = ("threads", "gloo", "nccl")

__all__ = [
    "BACKENDS", "FRAME_HEADER_BYTES", "ByteMeter", "Comm", "CommError", "CommTimeout", "Flow", "MeterSnapshot", "RankFailed",
    "ThreadsComm", "ThreadsWorld", "as_bytes", "from_bytes", "run_threads",
]
