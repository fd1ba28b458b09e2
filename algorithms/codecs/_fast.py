"""Blocked, multi-threaded fast path of the 2- and 4-bit stochastic quantiser.

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
        t += shift_c
        np.add(t, w[:m], out=t, casting="unsafe")
        c32 = t.view(np.int32)
        np.right_shift(c32, 16, out=c32)
        c8 = _scratch("c8", m + 8, np.uint8)
        np.copyto(c8[:m], c32, casting="unsafe")  # low byte holds the code (plus junk bits)
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
