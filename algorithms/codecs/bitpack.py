"""Vectorised MSB-first bit packing.

A sequence of ``m`` unsigned integers of ``width`` bits is written as one bit
stream, each value most significant bit first; stream bit ``j`` is bit
``7 - j % 8`` of byte ``j // 8`` (the order of ``numpy.packbits``).  The stream
takes ``ceil(m * width / 8)`` bytes and the padding bits of the last byte are 0.
For ``width = 4`` byte ``i`` is ``(v[2i] << 4) | v[2i+1]``; for ``width = 1``
(bitmaps) element ``i`` is bit ``7 - i % 8`` of byte ``i // 8``.

There are no Python loops over elements: widths 2, 4 and 8 use shifts on
``uint8`` (4 in parallel blocks); width 1 is ``numpy.packbits``; any other
width goes through a bit matrix of the values' big-endian bytes
(``numpy.unpackbits`` / ``numpy.packbits``).
"""

from __future__ import annotations

import numpy as np
import torch

from ._core import LITTLE_ENDIAN, CodecError
from ._fast import pack4_fast


def packed_nbytes(count: int, width: int) -> int:
    return (count * width + 7) // 8


def _check_width(width: int) -> None:
    if not 1 <= width <= 63:
        raise CodecError(f"bit width {width} out of range 1..63")


def pack_bits(values: torch.Tensor, width: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack a 1-D integer tensor of values in ``[0, 2**width)``.

    Values are not range-checked: bits above ``width`` are dropped (negative
    values are not supported).  ``out`` is an optional uint8 destination of
    exactly ``packed_nbytes(len(values), width)`` bytes.
    """
    _check_width(width)
    m = values.numel()
    nbytes = packed_nbytes(m, width)
    if out is None:
        out = torch.empty(nbytes, dtype=torch.uint8)
    elif out.numel() != nbytes or out.dtype != torch.uint8:  # pragma: no cover - programming error
        raise AssertionError("pack_bits: bad output buffer")
    if m == 0:
        return out
    values = values.reshape(-1)
    if width == 8:
        out.copy_(values)
    elif width == 4:
        _pack4(values if values.dtype == torch.uint8 else values.to(torch.uint8), out)
    elif width == 1:
        bits = (
            values.numpy()
            if values.dtype in (torch.bool, torch.uint8)
            else values.to(torch.uint8).numpy()
        )
        out.numpy()[:] = np.packbits(bits & 1 if bits.dtype == np.uint8 else bits)
    elif width == 2:
        _pack_small(values if values.dtype == torch.uint8 else values.to(torch.uint8), width, out)
    elif width < 8:  # eight values per ``width`` bytes; a partial last group by the bit matrix
        v, full = values.to(torch.int64).numpy(), m // 8
        _pack_octets(v[: 8 * full], width, out.numpy()[: full * width])
        _pack_matrix(v[8 * full :], width, out.numpy()[full * width :])
    else:
        _pack_matrix(values.to(torch.int64).numpy(), width, out.numpy())
    return out


def _word(width: int) -> np.dtype:
    """The narrowest big-endian unsigned word that holds ``width`` bits: the bit matrix of the
    generic path has one row of this many bits per value, so narrow fields cost less."""
    return np.dtype(next(w for w in ("u1", ">u2", ">u4", ">u8") if width <= 8 * np.dtype(w).itemsize))


def _pack_matrix(v: np.ndarray, width: int, out: np.ndarray) -> None:
    """Any width: big-endian words of the values -> bit matrix -> the low ``width`` columns."""
    if v.size:
        bits = np.unpackbits(v.astype(_word(width)).view(np.uint8)).reshape(v.size, -1)[:, -width:]
        out[:] = np.packbits(bits)


def _pack_octets(v: np.ndarray, width: int, out: np.ndarray) -> None:
    """Whole groups of eight values below 8 bits: a group is ``width`` whole bytes, so its
    values are shifted into one 64-bit word (the first highest) whose low ``width`` bytes,
    big-endian, are the group's stream."""
    groups = v.reshape(-1, 8) & ((1 << width) - 1)
    acc = groups[:, 0].copy()
    for j in range(1, 8):
        acc <<= width
        acc |= groups[:, j]
    out[:] = acc.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width :].reshape(-1)


def _pack_small(v: torch.Tensor, width: int, out: torch.Tensor) -> None:
    """Widths dividing 8: ``per = 8 // width`` values per byte (uint8 input)."""
    per = 8 // width
    m = v.numel()
    full = m // per
    mask = (1 << width) - 1
    if full:
        cols = v[: full * per].view(full, per)
        acc = (cols[:, 0] & mask) << (8 - width)
        for j in range(1, per):
            acc |= (cols[:, j] & mask) << (8 - width * (j + 1))
        out[:full].copy_(acc)
    rem = m - full * per
    if rem:
        tail = 0
        for j, val in enumerate(v[full * per :].tolist()):
            tail |= (int(val) & mask) << (8 - width * (j + 1))
        out[full] = tail


def _pack4(v: torch.Tensor, out: torch.Tensor) -> None:
    """Two 4-bit values per byte; only the low nibble of each input byte is used.

    Word-parallel: four input bytes ``b0..b3`` of an int32 word become the two
    output bytes ``b0<<4|b1`` and ``b2<<4|b3`` with one mask, two shifts and an or.
    """
    m = v.numel()
    if m >= 1 << 16 and LITTLE_ENDIAN and v.is_contiguous():  # blocked numpy, in parallel
        even = m - m % 2
        pack4_fast(v[:even].numpy(), out[: even // 2].numpy())
        if even < m:
            out[-1] = (int(v[-1]) & 0x0F) << 4
        return
    q = m // 4 if (LITTLE_ENDIAN and v.is_contiguous() and v.storage_offset() % 4 == 0) else 0
    if q:
        w = v[: 4 * q].view(torch.int32) & 0x0F0F0F0F
        r = (w << 4) | (w >> 8)
        out[: 2 * q].copy_(r.view(torch.int16))  # int16 -> uint8 keeps the low byte
    if 4 * q < m:
        _pack_small(v[4 * q :], 4, out[2 * q :])


def unpack_bits(
    buf: torch.Tensor, width: int, count: int, *, check_padding: bool = True
) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``count`` values as int64 (uint8 for width <= 8).

    ``buf`` must hold exactly ``packed_nbytes(count, width)`` bytes.  With
    ``check_padding`` the unused bits of the last byte must be zero.
    """
    _check_width(width)
    if buf.numel() != packed_nbytes(count, width):  # pragma: no cover - programming error
        raise AssertionError("unpack_bits: wrong buffer length")
    if count == 0:
        return torch.empty(0, dtype=torch.uint8 if width <= 8 else torch.int64)
    if check_padding:
        used = (count * width) % 8
        if used and int(buf[-1]) & ((1 << (8 - used)) - 1):
            raise CodecError("corrupted body: nonzero padding bits")
    if width == 8:
        return buf.clone()
    if width == 1:
        return torch.from_numpy(np.unpackbits(buf.numpy(), count=count))
    if width in (2, 4):
        per = 8 // width
        mask = (1 << width) - 1
        cols = [(buf >> (8 - width * (j + 1))) & mask for j in range(per)]
        return torch.stack(cols, dim=1).reshape(-1)[:count]
    if width < 8:  # eight values per ``width`` bytes; a partial last group by the bit matrix
        full = count // 8
        head = _unpack_octets(buf[: full * width].numpy(), width, full)
        return torch.from_numpy(np.concatenate([head, _unpack_matrix(buf[full * width :].numpy(), width, count - 8 * full)]))
    return torch.from_numpy(_unpack_matrix(buf.numpy(), width, count))


def _unpack_matrix(buf: np.ndarray, width: int, count: int) -> np.ndarray:
    """Any width: the bit matrix of the stream, widened to whole words (uint8 for width <= 8)."""
    word = _word(width)
    cols = 8 * word.itemsize
    bits = np.unpackbits(buf, count=count * width).reshape(count, width)
    full = np.zeros((count, cols), dtype=np.uint8)
    full[:, cols - width :] = bits
    vals = np.packbits(full).view(word)
    return vals if width <= 8 else vals.astype(np.int64)


def _unpack_octets(buf: np.ndarray, width: int, groups: int) -> np.ndarray:
    """Inverse of :func:`_pack_octets` for whole groups: each ``width`` bytes widened to a
    64-bit word, then shifted apart (uint8 values)."""
    words = np.zeros((groups, 8), dtype=np.uint8)
    words[:, 8 - width :] = buf.reshape(groups, width)
    acc = words.view(">u8").reshape(-1)
    out = np.empty((groups, 8), dtype=np.uint8)
    for j in range(8):
        out[:, j] = (acc >> np.uint64(width * (7 - j))) & np.uint64((1 << width) - 1)
    return out.reshape(-1)
