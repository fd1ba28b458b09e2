"""The byte format a rank's output (``RankOutput``) crosses the control plane in.

Rank 0 builds the result record from every rank's output; what a peer sends
is data, not code, so it is never unpickled.  Layout::

    magic  b"CBRO2\\n"
    u64    length of the JSON header (little-endian)
    u32    CRC-32 of everything after it: the JSON header and the body
    JSON   every field but the parameters, and the parameters' indices and shapes
    body   the parameters' float32 values, concatenated, in the sender's byte order

``decode`` checks the checksum (a flipped bit is an error, not another value),
every field's type, the shapes against the body length (before allocating
anything) and the byte order, and raises ``RankOutputError`` naming what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib

import torch

from .context import RankOutput

MAGIC = b"CBRO2\n"
_LEN = struct.Struct("<QI")  # header length, CRC-32 of header and body
_F32 = 4
_MAX_DIM = 1 << 40  # a shape [0, 2**70] holds nothing yet must not reach torch


class RankOutputError(ValueError):
    """A rank's output bytes are malformed."""


def encode(out: RankOutput) -> bytes:
    params = [(int(i), p.detach().to("cpu", torch.float32).contiguous()) for i, p in out.params]
    header = {
        "byteorder": sys.byteorder,
        "rank": out.rank,
        "params": [[i, list(p.shape)] for i, p in params],
        "history": out.history,
        "step_times": out.step_times,
        "peak_memory_bytes": out.peak_memory_bytes,
        "peak_memory_growth_bytes": out.peak_memory_growth_bytes,
        "peak_memory_reset": out.peak_memory_reset,
        "peak_tensor_bytes": out.peak_tensor_bytes,
        "peak_tensor_growth_bytes": out.peak_tensor_growth_bytes,
        "sent_bytes": out.sent_bytes,
        "sent_messages": out.sent_messages,
        "received_bytes": out.received_bytes,
        "framing_bytes": out.framing_bytes,
        "bytes_by_tag": {k: list(v) for k, v in out.bytes_by_tag.items()},
        "tokens_per_step": out.tokens_per_step,
        "wire_tx_bytes": out.wire_tx_bytes,
        "wire_rx_bytes": out.wire_rx_bytes,
        "extra": {k: list(v) for k, v in out.extra.items()},
    }
    head = json.dumps(header).encode()  # NaN/inf allowed: a diverged loss is a result
    body = b"".join(p.reshape(-1).numpy().tobytes() for _, p in params)
    return MAGIC + _LEN.pack(len(head), zlib.crc32(body, zlib.crc32(head))) + head + body


# ---- validation -----------------------------------------------------------
def _int(v, what: str, lo: int | None = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
        raise RankOutputError(f"{what} must be an integer{'' if lo is None else f' >= {lo}'}, got {v!r:.60}")
    return v


def _num(v, what: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise RankOutputError(f"{what} must be a number, got {v!r:.60}")
    return v


def _dict(v, what: str) -> dict:
    if not isinstance(v, dict):
        raise RankOutputError(f"{what} must be an object")
    return v


def _list(v, what: str, n: int | None = None) -> list:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise RankOutputError(f"{what} must be a list{'' if n is None else f' of {n}'}")
    return v


def decode(data: bytes, expect_rank: int) -> RankOutput:
    """The RankOutput in ``data``, which must come from rank ``expect_rank``."""
    data = memoryview(bytes(data))
    fixed = len(MAGIC) + _LEN.size
    if len(data) < fixed or bytes(data[:len(MAGIC)]) != MAGIC:
        raise RankOutputError(f"rank {expect_rank}: not a rank output (bad magic or too short)")
    hlen, crc = _LEN.unpack_from(data, len(MAGIC))
    if hlen > len(data) - fixed:
        raise RankOutputError(f"rank {expect_rank}: header of {hlen} bytes exceeds the {len(data)} received")
    if zlib.crc32(data[fixed:]) != crc:
        raise RankOutputError(f"rank {expect_rank}: checksum mismatch (CRC-32): the output was corrupted")
    try:
        h = json.loads(bytes(data[fixed:fixed + hlen]))
    except (ValueError, RecursionError) as e:
        raise RankOutputError(f"rank {expect_rank}: header is not JSON ({e})") from None
    body = data[fixed + hlen:]
    h = _dict(h, "header")
    if h.get("byteorder") != sys.byteorder:
        raise RankOutputError(f"rank {expect_rank}: byte order {h.get('byteorder')!r} is not this host's")
    if _int(h.get("rank"), "rank") != expect_rank:
        raise RankOutputError(f"rank {expect_rank}: output claims to be rank {h.get('rank')}")

    params, off = [], 0
    for k, item in enumerate(_list(h.get("params"), "params")):
        idx, shape = _list(item, f"params[{k}]", 2)
        _int(idx, f"params[{k}] index")
        dims = [_int(d, f"params[{k}] dimension") for d in _list(shape, f"params[{k}] shape")]
        if any(d > _MAX_DIM for d in dims):
            raise RankOutputError(f"rank {expect_rank}: params[{k}] shape {dims} has a dimension over {_MAX_DIM}")
        numel = math.prod(dims)
        nbytes = numel * _F32
        if nbytes > len(body) - off:  # checked before any allocation
            raise RankOutputError(f"rank {expect_rank}: params[{k}] declares {numel} values, "
                                  f"more than the {len(body) - off} body bytes left")
        t = torch.frombuffer(bytearray(body[off:off + nbytes]), dtype=torch.float32) if nbytes else \
            torch.empty(0, dtype=torch.float32)
        params.append((idx, t.reshape(dims)))
        off += nbytes
    if off != len(body):
        raise RankOutputError(f"rank {expect_rank}: {len(body) - off} body bytes follow the last parameter")

    history = {}
    for k, v in _dict(h.get("history"), "history").items():
        history[k] = [_num(x, f"history[{k!r}]") for x in _list(v, f"history[{k!r}]")]
    bytes_by_tag = {}
    for k, v in _dict(h.get("bytes_by_tag"), "bytes_by_tag").items():
        a, b = _list(v, f"bytes_by_tag[{k!r}]", 2)
        bytes_by_tag[k] = (_int(a, f"bytes_by_tag[{k!r}]"), _int(b, f"bytes_by_tag[{k!r}]"))
    extra = {}
    for k, v in _dict(h.get("extra"), "extra").items():
        value, unit = _list(v, f"extra[{k!r}]", 2)
        if not isinstance(unit, str):
            raise RankOutputError(f"extra[{k!r}] unit must be a string")
        extra[k] = (_num(value, f"extra[{k!r}]"), unit)
    if not isinstance(h.get("peak_memory_reset"), bool):
        raise RankOutputError("peak_memory_reset must be true or false")
    wire = {k: None if h.get(k) is None else _int(h.get(k), k) for k in ("wire_tx_bytes", "wire_rx_bytes")}
    tensor = {k: None if h.get(k) is None else _int(h.get(k), k, lo=None)
              for k in ("peak_tensor_bytes", "peak_tensor_growth_bytes")}
    return RankOutput(
        rank=expect_rank,
        params=params,
        history=history,
        step_times=[_num(x, "step_times") for x in _list(h.get("step_times"), "step_times")],
        peak_memory_bytes=_int(h.get("peak_memory_bytes"), "peak_memory_bytes"),
        peak_memory_growth_bytes=_int(h.get("peak_memory_growth_bytes"), "peak_memory_growth_bytes"),
        peak_memory_reset=h["peak_memory_reset"],
        sent_bytes=_int(h.get("sent_bytes"), "sent_bytes"),
        sent_messages=_int(h.get("sent_messages"), "sent_messages"),
        received_bytes=_int(h.get("received_bytes"), "received_bytes"),
        framing_bytes=_int(h.get("framing_bytes"), "framing_bytes"),
        bytes_by_tag=bytes_by_tag,
        tokens_per_step=_int(h.get("tokens_per_step"), "tokens_per_step"),
        extra=extra,
        **wire,
        **tensor,
    )
