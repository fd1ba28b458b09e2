"""Blocked, multi-threaded drivers of the codecs' compiled kernels (``_kernels``): qstoch's
codes at 2 and 4 bits, qchannel's per-channel range and its codes (packed as they are made),
and the float32 range.  Each cuts its input into blocks of about 1 MiB of float32 and runs
them in the codec pool (``_rng.run_blocks``) once there are two, so small tensors stay on the
calling thread.  Below ``KERNEL_MIN_ELEMENTS`` the same arithmetic runs as a few numpy passes
per block (the end of this module), and flat ``max |x|`` is torch's reduction (``quant``).

The reference arithmetic (``quant.qstoch_grid`` + ``random_words`` + ``pack_bits``) runs as a
handful of whole-tensor passes; the kernel does the same per element in one pass, the block's
random words generated beside it.  The result is bit-identical; a check compares them.

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

from ._rng import block_states, block_words, elements_per_block, run_blocks

_local = threading.local()

# Below this many elements the codecs take their numpy / torch paths instead of the compiled
# kernels: loading the kernels costs about 1 s in a fresh process (numba's import and first
# dispatch, from its cache), more than they save on a small tensor, and a run whose messages
# are all small (the tiny models' activations) never loads numba.  Both paths give the same
# bits; checks/test_codecs.py runs with the kernels from 0 elements and compares the paths
# (the numpy ones too, at every size, with the threshold raised).
KERNEL_MIN_ELEMENTS = 1 << 16


def use_kernels(n: int) -> bool:
    return n >= KERNEL_MIN_ELEMENTS


def _scratch(name: str, size: int, dtype: type) -> np.ndarray:
    buf = getattr(_local, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), dtype=dtype)
        setattr(_local, name, buf)
    return buf[:size]


# Blocks of the random stream one qstoch kernel call takes (their generators advance side by side).
QSTOCH_GROUP = 4


def qstoch_pack_fast(
    xs: np.ndarray, bits: int, delta32: float, offset: int, seed: int, out: np.ndarray
) -> None:
    """Quantise float32 ``xs`` at ``bits`` in {2, 4} and write the packed codes to ``out``:
    one compiled pass per group of ``QSTOCH_GROUP`` blocks (``_kernels.qstoch_codes``), the
    blocks' random words made in the same call, groups in parallel in the codec pool."""
    n = xs.size
    dsc = np.float32(delta32 * 2.0**-16)
    shift_c = np.float32((offset + 0.5) * 2.0**16)
    if not use_kernels(n):
        _qstoch_pack_numpy(xs, bits, dsc, shift_c, seed, out)
        return
    from . import _kernels  # compiled on first use

    per = elements_per_block(16)
    nblocks = (n + per - 1) // per
    per_byte = 8 // bits

    def group(gi: int) -> None:
        first = gi * QSTOCH_GROUP
        lo, hi = first * per, min(n, (first + QSTOCH_GROUP) * per)
        states = np.zeros((QSTOCH_GROUP, 4), dtype=np.uint64)
        block_states(seed, first, states[: min(QSTOCH_GROUP, nblocks - first)])
        raw = _scratch("raw", QSTOCH_GROUP * _kernels.QSTOCH_STEP // 4, np.uint64)
        raw = raw.reshape(QSTOCH_GROUP, -1)
        o = out[lo // per_byte : (hi + per_byte - 1) // per_byte]
        _kernels.qstoch_codes(xs[lo:hi], per, dsc, shift_c, bits, states, raw, o)

    run_blocks(group, (nblocks + QSTOCH_GROUP - 1) // QSTOCH_GROUP)


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


def _row_blocks(rows: int, cols: int) -> tuple[int, int]:
    """(rows per block, number of blocks); an even row count keeps every block but the last
    an even number of elements, so 4-bit codes pack per block."""
    r = max(2, ROW_BLOCK_ELEMENTS // max(cols, 1))
    r += r % 2
    return r, (rows + r - 1) // r


def flat_absmax(xs: np.ndarray) -> float:
    """``max |x|`` of a contiguous 1-D float32 array (NaN if it holds one): the integer max
    of the floats' bits with the sign cleared (``_kernels.abs_bits_max``; for those patterns
    integer order is the order of ``|x|``), in pool blocks."""
    from . import _kernels  # compiled on first use

    n = xs.size
    per = ROW_BLOCK_ELEMENTS
    bits = xs.view(np.int32)
    m = max(run_blocks(lambda j: int(_kernels.abs_bits_max(bits[j * per : (j + 1) * per])),
                       max(1, (n + per - 1) // per)))
    return float(np.array(m, dtype=np.int32).view(np.float32))


def column_absmax(x2: np.ndarray) -> np.ndarray:
    """Per-column ``max |x|`` of a C-contiguous 2-D float32 array, one pass over memory.

    ``|x|`` is the float's bits without the sign, and for those bit patterns integer order
    is the order of the values: the integer max (no NaN handling, unlike the float one) is
    the max of ``|x|``, and a NaN in a column, whose pattern is above infinity's, comes out
    as a NaN.  Row blocks in the pool (``_kernels.column_abs_bits_max``), then their max."""
    rows, cols = x2.shape
    r, nb = _row_blocks(rows, cols)
    bits = x2.view(np.int32)

    if use_kernels(x2.size):
        from . import _kernels  # compiled on first use

        def block(j: int) -> np.ndarray:
            m = np.zeros(cols, dtype=np.int32)
            _kernels.column_abs_bits_max(bits[j * r : (j + 1) * r], m)
            return m
    else:  # the same integer max, as numpy passes over the block

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
    stream of the codes too, while each block is in cache (``_kernels.fixpoint_codes``, one
    pass per row block, blocks in the pool).  Returns the number of codes other than ``zero``."""
    if not use_kernels(x2.size):
        return _fixpoint_codes_numpy(x2, den, zero, codes, packed)
    from . import _kernels  # compiled on first use

    if den.size == 1:  # one scale: the rows are one flat run (tensor granularity has 1 column)
        x2 = x2.reshape(1, -1)
    rows, cols = x2.shape
    den2 = den.reshape(1, -1) if den.ndim == 1 else den.reshape(den.shape[0], -1)
    r, nb = _row_blocks(rows, cols)
    if rows == 1:  # one row: blocks of it
        per = ROW_BLOCK_ELEMENTS
        r, nb = 1, (cols + per - 1) // per
    no_pack = np.empty(0, dtype=np.uint8)

    def block(j: int) -> int:
        if rows == 1:
            lo, hi = j * ROW_BLOCK_ELEMENTS, min(cols, (j + 1) * ROW_BLOCK_ELEMENTS)
            xb, db = x2[:, lo:hi], den2[:, lo:hi] if den2.shape[1] > 1 else den2
        else:
            lo, hi = j * r * cols, min(rows, (j + 1) * r) * cols
            xb = x2[j * r : (j + 1) * r]
            db = den2[j * r : (j + 1) * r] if den2.shape[0] > 1 else den2
        m = hi - lo
        even = m - m % 2
        pk = packed[lo // 2 : lo // 2 + even // 2] if packed is not None else no_pack
        nz = _kernels.fixpoint_codes(np.ascontiguousarray(xb), db, zero, codes[lo:hi], pk,
                                     packed is not None)
        if packed is not None and even < m:  # odd total length: the stream's last byte holds one code
            packed[-1] = int(codes[hi - 1]) << 4
        return nz

    return sum(run_blocks(block, nb))


# ------------------------------------------------------------------------ numpy paths
# Below KERNEL_MIN_ELEMENTS: the kernels' arithmetic as a few numpy passes per block (the
# block in cache), bit-identical to both the kernels and the reference paths.  A small tensor
# neither loads numba nor pays the reference path's whole-tensor int64 passes (measured at
# 32K float32 elements: qstoch 4-bit 0.45 ms here against 0.67 ms on the reference path).
_MAGIC32 = np.float32(1.5 * 2.0**23)  # fl(y + M) = M + round_half_even(y) for |y| < 2**22


def _qstoch_pack_numpy(xs: np.ndarray, bits: int, dsc: np.float32, shift_c: np.float32,
                       seed: int, out: np.ndarray) -> None:
    n = xs.size
    per = elements_per_block(16)
    per_byte = 8 // bits

    def block(j: int) -> None:
        lo, hi = j * per, min(n, (j + 1) * per)
        m = hi - lo
        t = _scratch("t", m, np.float32)
        np.divide(xs[lo:hi], dsc, out=t)
        np.add(t, shift_c, out=t)
        np.add(t, block_words(seed, j, m, 16), out=t, casting="unsafe")
        c32 = t.view(np.int32)
        np.right_shift(c32, 16, out=c32)  # the code in the low bits (plus junk above them)
        c8 = _scratch("c8", m + 8, np.uint8)
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


def _fixpoint_codes_numpy(x2: np.ndarray, den: np.ndarray, zero: int, codes: np.ndarray,
                          packed: np.ndarray | None) -> int:
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
