"""Metered communication for SPMD rank programs (see base.Comm)."""

from .base import Comm, CommError, RankFailed, as_bytes, from_bytes
from .byte_meter import FRAME_HEADER_BYTES, ByteMeter, Flow, MeterSnapshot
from .threads import ThreadsComm, ThreadsWorld, run_threads

BACKENDS = ("threads", "gloo", "nccl")

__all__ = [
    "BACKENDS", "FRAME_HEADER_BYTES", "ByteMeter", "Comm", "CommError", "Flow", "MeterSnapshot", "RankFailed",
    "ThreadsComm", "ThreadsWorld", "as_bytes", "from_bytes", "run_threads",
]
