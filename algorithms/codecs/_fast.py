"""Blocked, multi-threaded fast paths of the quantisers: qstoch at 2 and 4 bits, qchannel's
per-channel range and its codes (packed as they are made), and the float32 range of qstoch
on the pool.  Each runs in blocks of about 1 MiB of float32 so that a block's later passes
read it from cache; blocks run in the codec pool (``_rng.run_blocks``) once there are two,
so small tensors stay on the calling thread.

The reference arithmetic (``quant.qstoch_grid`` + ``random_words`` + ``pack_bits``)
runs as a handful of whole-tensor passes.  Here the same computation is done
block by block (``elements_per_block(16)`` elements, ~1 MiB of float32): the
block's random words are generated, added and packed while the block is in
cache, and blocks run in parallel in the codec thread pool (numpy releases the
GIL).  The result is bit-identical to the reference path; a check compares them.

Arithmetic, for the float32 plan ``E = 7, R = 16`` (``b <= 6``), scaled by
``2**16`` so that everything lives in the binade ``[2**23, 2**24)`` where the
spacing is 1:

* ``t = fl(x / (δ 2**-16))``               = ``2**16 fl(x/δ)`` (exact scaling)
* ``t = fl(t + (O + 1/2) 2**16)``         -> the gridded ``y + O + 1/2``
* ``t = t + w``, ``w`` uniform int16       -> exact integer addition
* ``code = (bits(t) >> 16) & (2**b - 1)``  -> ``trunc(y + O + u) mod 2**b``
"""

from __future__ import annotations

import threading

import numpy as np

from ._rng import block_words, elements_per_block, run_blocks

_local = threading.local()


def _scratch(name: str, size: int, dtype: type) -> np.ndarray:
    buf = getattr(_local, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), dtype=dtype)
        setattr(_local, name, buf)
    return buf[:size]


def qstoch_pack_fast(
    xs: np.ndarray, bits: int, delta32: float, offset: int, seed: int, out: np.ndarray
) -> None:
    """Quantise float32 ``xs`` at ``bits`` in {2, 4} and write the packed codes to ``out``."""
    n = xs.size
    per = elements_per_block(16)
    dsc = np.float32(delta32 * 2.0**-16)
    shift_c = np.float32((offset + 0.5) * 2.0**16)
    per_byte = 8 // bits

    def block(j: int) -> None:
        lo = j * per
        hi = min(n, lo + per)
        chunk(lo, hi, block_words(seed, j, hi - lo, 16))

    def chunk(lo: int, hi: int, w: np.ndarray) -> None:
        m = hi - lo
        t = _scratch("t", m, np.float32)
        np.divide(xs[lo:hi], dsc, out=t)
        np.add(t, shift_c, out=t)
        np.add(t, w[:m], out=t, casting="unsafe")
        c32 = t.view(np.int32)
        np.right_shift(c32, 16, out=c32)
        c8 = _scratch("c8", m + 8, np.uint8)
        # the low byte holds the code (plus junk bits); a shift straight into uint8 (a casting
        # ufunc loop) measured slower than the two passes
        np.copyto(c8[:m], c32, casting="unsafe")
        full = m - m % per_byte
        nb = full // per_byte
        o = out[lo // per_byte : lo // per_byte + nb]
        if bits == 4:
            _pack4_into(c8[: 2 * nb], o)
        else:  # bits == 2: byte quads read as little-endian uint32
            c4 = c8[: 4 * nb].view(np.uint32)
            c4 &= 0x03030303
            u = _scratch("u32", nb, np.uint32)
            v = _scratch("v32", nb, np.uint32)
            np.left_shift(c4, 6, out=u)  # c0 -> bits 6-7
            np.right_shift(c4, 4, out=v)  # c1 (bits 8-9) -> bits 4-5
            np.bitwise_or(u, v, out=u)
            np.right_shift(c4, 14, out=v)  # c2 (bits 16-17) -> bits 2-3
            np.bitwise_or(u, v, out=u)
            np.right_shift(c4, 24, out=v)  # c3 (bits 24-25) -> bits 0-1
            np.bitwise_or(u, v, out=u)
            np.copyto(o, u, casting="unsafe")
        if full < m:  # last, partial byte of the stream
            tail = 0
            for i, c in enumerate(c32[full:m].tolist()):
                tail |= (int(c) & ((1 << bits) - 1)) << (8 - bits * (i + 1))
            out[(lo + full) // per_byte] = tail

    run_blocks(block, (n + per - 1) // per)


def _pack4_into(c8: np.ndarray, o: np.ndarray) -> None:
    """Low nibbles of byte pairs (c0, c1) -> ``c0 << 4 | c1`` (even length input)."""
    nb = o.size
    c16 = c8.view(np.uint16)  # little-endian: c0 | c1 << 8
    u = _scratch("u16", nb, np.uint16)
    v = _scratch("v16", nb, np.uint16)
    np.left_shift(c16, 4, out=u)
    np.right_shift(c16, 8, out=v)
    np.bitwise_and(v, 0x0F, out=v)
    np.bitwise_or(u, v, out=u)
    np.copyto(o, u, casting="unsafe")  # low byte


PACK_BLOCK = 1 << 18


def pack4_fast(c8: np.ndarray, out: np.ndarray) -> None:
    """Pack the low nibbles of an even-length uint8 array, in parallel blocks."""
    n = c8.size

    def block(j: int) -> None:
        lo = j * PACK_BLOCK
        hi = min(n, lo + PACK_BLOCK)
        _pack4_into(c8[lo:hi], out[lo // 2 : hi // 2])

    run_blocks(block, (n + PACK_BLOCK - 1) // PACK_BLOCK)


# --------------------------------------------------------------------------- qchannel
# Elements per block of the fixpoint passes (~1 MiB of float32, as qstoch's blocks): a block's
# second and later passes read it from cache, not memory; smaller blocks measured slower on
# a loaded 2-core machine (more calls, more switches between them).
ROW_BLOCK_ELEMENTS = 1 << 18
_MAGIC32 = np.float32(1.5 * 2.0**23)  # fl(y + M) = M + round_half_even(y) for |y| < 2**22


def _row_blocks(rows: int, cols: int) -> tuple[int, int]:
    """(rows per block, number of blocks); an even row count keeps every block but the last
    an even number of elements, so 4-bit codes pack per block."""
    r = max(2, ROW_BLOCK_ELEMENTS // max(cols, 1))
    r += r % 2
    return r, (rows + r - 1) // r


def flat_absmax(xs: np.ndarray) -> float:
    """``max |x|`` of a contiguous 1-D float32 array (NaN if it holds one), in pool blocks;
    the integer order of the unsigned bits, as in :func:`column_absmax`.  For the codec pool
    (2 threads or more) only: torch's reduction is one pass to this function's two on one
    thread, but its OpenMP workers would still be spinning for the cores when the pool's
    blocks start."""
    n = xs.size
    per = ROW_BLOCK_ELEMENTS
    bits = xs.view(np.int32)

    def block(j: int) -> int:
        b = bits[j * per : (j + 1) * per]
        a = _scratch("absbits", b.size, np.int32)
        np.bitwise_and(b, 0x7FFFFFFF, out=a)
        return int(a.max())

    m = max(run_blocks(block, (n + per - 1) // per))
    return float(np.array(m, dtype=np.int32).view(np.float32))


def column_absmax(x2: np.ndarray) -> np.ndarray:
    """Per-column ``max |x|`` of a C-contiguous 2-D float32 array, one pass over memory.

    ``|x|`` is the float's bits without the sign, and for those bit patterns integer order
    is the order of the values: the integer max (no NaN handling, unlike the float one) is
    the max of ``|x|``, and a NaN in a column, whose pattern is above infinity's, comes out
    as a NaN."""
    rows, cols = x2.shape
    r, nb = _row_blocks(rows, cols)
    bits = x2.view(np.int32)

    def block(j: int) -> np.ndarray:
        b = bits[j * r : (j + 1) * r]
        a = _scratch("absbits", b.size, np.int32).reshape(b.shape)
        np.bitwise_and(b, 0x7FFFFFFF, out=a)
        return a.max(axis=0)  # reads the block from cache

    parts = run_blocks(block, nb)
    m = parts[0]
    for p in parts[1:]:
        np.maximum(m, p, out=m)
    return m.view(np.float32)


def fixpoint_codes_fast(
    x2: np.ndarray, den: np.ndarray, zero: int, codes: np.ndarray, packed: np.ndarray | None
) -> int:
    """Signed fixpoint codes of float32 ``x2`` (2-D, C-contiguous) over ``den`` (broadcast
    per block: a row vector, a column of ``x2``'s rows, or one value), offset by ``zero``
    (at most 64), written to the flat uint8 ``codes``; with ``packed``, the 4-bit packed
    stream of the codes too, while each block is in cache.  Returns the number of codes
    other than ``zero``."""
    rows, cols = x2.shape
    r, nb = _row_blocks(rows, cols)
    per_row_den = den.ndim == 2 and den.shape[0] == rows and rows > 1

    def block(j: int) -> int:
        lo, hi = j * r, min(rows, (j + 1) * r)
        m = (hi - lo) * cols
        t = _scratch("qt", m, np.float32).reshape(hi - lo, cols)
        np.divide(x2[lo:hi], den[lo:hi] if per_row_den else den, out=t)
        np.add(t, _MAGIC32, out=t)  # low byte of the float's bits = round_half_even(y) as int8
        c = codes[lo * cols : hi * cols].view(np.int8)
        np.copyto(c, t.reshape(-1).view(np.int32), casting="unsafe")
        np.clip(c, -zero, zero - 1, out=c)
        nnz = int(np.count_nonzero(c))
        cu = c.view(np.uint8)
        np.add(cu, zero, out=cu)  # offset binary, below 128
        if packed is not None:
            full = m - m % 2
            _pack4_into(cu[:full], packed[lo * cols // 2 : lo * cols // 2 + full // 2])
            if full < m:  # odd total length: the stream's last byte holds one code
                packed[-1] = int(cu[-1]) << 4
        return nnz

    return sum(run_blocks(block, nb))
