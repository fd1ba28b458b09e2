"""Compiled (numba) loops of the codecs' hot paths: one pass where numpy needs several.

Each kernel reads its block once, keeps the intermediate values in registers and writes only
the result; they release the GIL, so the codec pool (``_rng.run_blocks``) runs blocks in
parallel.  Every kernel computes what a numpy or torch formulation elsewhere computes, bit for
bit, and checks/test_codecs.py compares the two (each codec's fast path with its reference
path, the generators with numpy's):

* :func:`sfc64_block_states` - the SFC64 states numpy's ``SeedSequence(seed, spawn_key=(j,))``
  seeds (``_rng.block_state``), about 300x faster than building the generators;
* :func:`sfc64_raw4` - numpy's ``SFC64.random_raw`` from given states, four streams at once
  (the generator the stochastic codecs draw from, ``_rng.block_words``);
* :func:`qstoch_codes` - qstoch's codes at 2 or 4 bits, packed (``_fast`` docstring has the
  arithmetic), the blocks' random words generated in the same call;
* :func:`abs_bits_max` - ``max |x|`` of float32 as the integer max of the unsigned bits;
* :func:`abs_bits_histogram`, :func:`mask_above`, :func:`mask_first_ties`, :func:`compact` -
  top-k's threshold by a two-digit radix select on those bits, and the selection (mask and
  values) with the tie rule;
* :func:`column_abs_bits_max`, :func:`fixpoint_codes` - qchannel's per-channel range and its
  codes, packed while they are made.

Compiled on first use and cached next to this file (``cache=True``), so a rank process pays
the compile once per installation, not once per run.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U11, _U3, _U24, _U40, _U1 = (np.uint64(v) for v in (11, 3, 24, 40, 1))
_ABS = np.int32(0x7FFFFFFF)


@njit(nogil=True, cache=True)
def _sfc64_step(a, b, c, w):  # pragma: no cover - compiled
    """One SFC64 output and the next state: the small fast chaotic generator (C. Doty-Humphrey,
    PractRand) as numpy's ``SFC64`` implements it."""
    tmp = a + b + w
    return tmp, b ^ (b >> _U11), c + (c << _U3), ((c << _U24) | (c >> _U40)) + tmp, w + _U1


# numpy's SeedSequence (M. O'Neill's seed_seq design, numpy/random/bit_generator.pyx): its
# hash and mix constants, a pool of 4 words, 32-bit arithmetic.
_INIT_A, _MULT_A = np.uint32(0x43B0D7E5), np.uint32(0x931E8875)
_INIT_B, _MULT_B = np.uint32(0x8B51F9DD), np.uint32(0x58F38DED)
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_X16 = np.uint32(16)


@njit(nogil=True, cache=True)
def _hashmix(value, h):  # pragma: no cover - compiled
    # numba widens integer arithmetic to 64 bits: every step is cut back to 32
    value = np.uint32(value ^ h)
    h = np.uint32(h * _MULT_A)
    value = np.uint32(value * h)
    return np.uint32(value ^ (value >> _X16)), h


@njit(nogil=True, cache=True)
def _mix(x, y):  # pragma: no cover - compiled
    r = np.uint32(np.uint32(_MIX_L * x) - np.uint32(_MIX_R * y))
    return np.uint32(r ^ (r >> _X16))


@njit(nogil=True, cache=True)
def sfc64_block_states(run_words: np.ndarray, first: int, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[g]`` = the state of ``numpy.random.SFC64(SeedSequence(seed, spawn_key=(first + g,)))``
    as (a, b, c, counter), for the seed whose entropy words (32-bit, little end first, padded
    with zeros to the pool's 4) are ``run_words`` and spawn keys below 2**32: the sequence's
    pool mixed from the 5 entropy words, 6 words drawn from it (3 uint64, low word first),
    then SFC64's seeding (counter 1, 12 outputs discarded)."""
    ent = np.zeros(5, dtype=np.uint32)
    for g in range(out.shape[0]):
        ent[:4] = run_words
        ent[4] = np.uint32(first + g)
        pool = np.zeros(4, dtype=np.uint32)
        h = _INIT_A
        for i in range(4):
            pool[i], h = _hashmix(ent[i], h)
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    v, h = _hashmix(pool[src], h)
                    pool[dst] = _mix(pool[dst], v)
        for dst in range(4):  # the fifth entropy word (the spawn key)
            v, h = _hashmix(ent[4], h)
            pool[dst] = _mix(pool[dst], v)
        hb = _INIT_B
        words = np.zeros(6, dtype=np.uint32)
        for i in range(6):
            v = np.uint32(pool[i % 4] ^ hb)
            hb = np.uint32(hb * _MULT_B)
            v = np.uint32(v * hb)
            words[i] = v ^ (v >> _X16)
        st = words.view(np.uint64)
        a, b, c, w = st[0], st[1], st[2], _U1
        for _ in range(12):
            _, a, b, c, w = _sfc64_step(a, b, c, w)
        out[g, 0], out[g, 1], out[g, 2], out[g, 3] = a, b, c, w


@njit(nogil=True, cache=True)
def sfc64_raw4(states: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Row ``g`` of ``out`` (uint64, 4 rows) = the SFC64 outputs following ``states[g]`` =
    (a, b, c, counter), which is advanced past them.  One stream is a serial chain of
    dependent additions; four advanced side by side keep the core busy (about 3x one at a
    time)."""
    a0, b0, c0, w0 = states[0, 0], states[0, 1], states[0, 2], states[0, 3]
    a1, b1, c1, w1 = states[1, 0], states[1, 1], states[1, 2], states[1, 3]
    a2, b2, c2, w2 = states[2, 0], states[2, 1], states[2, 2], states[2, 3]
    a3, b3, c3, w3 = states[3, 0], states[3, 1], states[3, 2], states[3, 3]
    for i in range(out.shape[1]):
        out[0, i], a0, b0, c0, w0 = _sfc64_step(a0, b0, c0, w0)
        out[1, i], a1, b1, c1, w1 = _sfc64_step(a1, b1, c1, w1)
        out[2, i], a2, b2, c2, w2 = _sfc64_step(a2, b2, c2, w2)
        out[3, i], a3, b3, c3, w3 = _sfc64_step(a3, b3, c3, w3)
    states[0, 0], states[0, 1], states[0, 2], states[0, 3] = a0, b0, c0, w0
    states[1, 0], states[1, 1], states[1, 2], states[1, 3] = a1, b1, c1, w1
    states[2, 0], states[2, 1], states[2, 2], states[2, 3] = a2, b2, c2, w2
    states[3, 0], states[3, 1], states[3, 2], states[3, 3] = a3, b3, c3, w3


@njit(nogil=True, cache=True, error_model="numpy")
def _qstoch_code(x: np.float32, dsc: np.float32, shift: np.float32, w: np.int16, mask: int) -> int:  # pragma: no cover - compiled
    """``t = fl(fl(fl(x / dsc) + shift) + w)`` lies in ``[2**23, 2**24)``, where float32 spacing
    is 1: ``int(t)`` is exact and its bits 16 and up are the float's mantissa bits 16 and up,
    so the code is ``(int(t) >> 16) mod 2**bits`` (``mask = 2**bits - 1``)."""
    return (np.int32((x / dsc + shift) + np.float32(w)) >> 16) & mask


@njit(nogil=True, cache=True, error_model="numpy")
def _qstoch_pack(xs, dsc, shift, bits, w, out) -> None:  # pragma: no cover - compiled
    """Packed ``bits``-bit (2 or 4) codes of ``xs`` with the int16 words ``w``, MSB first."""
    m = xs.size
    mask = (1 << bits) - 1
    per = 8 // bits
    full = m // per
    if bits == 4:  # the two widths unrolled: loops the compiler can vectorise
        for j in range(full):
            i = 2 * j
            hi = _qstoch_code(xs[i], dsc, shift, w[i], 15)
            out[j] = np.uint8((hi << 4) | _qstoch_code(xs[i + 1], dsc, shift, w[i + 1], 15))
    else:
        for j in range(full):
            i = 4 * j
            byte = _qstoch_code(xs[i], dsc, shift, w[i], 3) << 6
            byte |= _qstoch_code(xs[i + 1], dsc, shift, w[i + 1], 3) << 4
            byte |= _qstoch_code(xs[i + 2], dsc, shift, w[i + 2], 3) << 2
            out[j] = np.uint8(byte | _qstoch_code(xs[i + 3], dsc, shift, w[i + 3], 3))
    if full * per < m:  # the stream's last, partial byte; padding bits 0
        byte = 0
        for s in range(per):
            i = full * per + s
            code = _qstoch_code(xs[i], dsc, shift, w[i], mask) if i < m else 0
            byte = (byte << bits) | code
        out[full] = np.uint8(byte)


# Elements of each block a qstoch kernel step takes: the four blocks' words and inputs of one
# step (4 x (32 KiB + 64 KiB)) stay in a core's L2 cache between the generator and the codes.
QSTOCH_STEP = 1 << 14


@njit(nogil=True, cache=True, error_model="numpy")
def qstoch_codes(
    xs: np.ndarray, per: int, dsc: np.float32, shift: np.float32, bits: int,
    states: np.ndarray, raw: np.ndarray, out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """qstoch's packed codes (``bits`` 2 or 4) of up to four consecutive blocks of ``per``
    elements (a multiple of ``QSTOCH_STEP``) in ``xs``; block ``g``'s int16 random words are
    the SFC64 stream from ``states[g]`` (rows past the last block are unused; ``states`` is
    advanced).  ``raw`` is uint64 scratch of shape (4, ``QSTOCH_STEP // 4``)."""
    m = xs.size
    per_byte = 8 // bits
    nblocks = (m + per - 1) // per
    for lo in range(0, min(per, m), QSTOCH_STEP):
        sfc64_raw4(states, raw)
        for g in range(nblocks):
            a = g * per + lo
            b = min(m, a + QSTOCH_STEP, (g + 1) * per)
            if a < b:
                w = raw[g, : (b - a + 3) // 4].view(np.int16)
                _qstoch_pack(xs[a:b], dsc, shift, bits, w, out[a // per_byte : (b + per_byte - 1) // per_byte])


@njit(nogil=True, cache=True)
def abs_bits_max(bits: np.ndarray) -> np.int32:  # pragma: no cover - compiled
    """``max(bits & 0x7fffffff)`` of int32 float bits: ``max |x|``'s pattern (a NaN's is above
    infinity's, so a NaN anywhere comes out as a NaN)."""
    m = np.int32(0)
    for i in range(bits.size):
        m = max(m, bits[i] & _ABS)
    return m


@njit(nogil=True, cache=True)
def abs_bits_histogram(bits: np.ndarray, prefix: int, hist: np.ndarray) -> np.int32:  # pragma: no cover - compiled
    """One digit of a radix select on ``|bits|`` (int32 float bits, sign cleared): with
    ``prefix < 0`` count the high 16 bits of every element into ``hist``; else count the low
    16 bits of the elements whose high 16 bits are ``prefix``.  Returns the largest
    ``|bits|`` seen (a non-finite value shows as one at or above infinity's pattern)."""
    m = np.int32(0)
    if prefix < 0:
        for i in range(bits.size):
            a = bits[i] & _ABS
            m = max(m, a)
            hist[a >> 16] += 1
    else:
        for i in range(bits.size):
            a = bits[i] & _ABS
            m = max(m, a)
            if (a >> 16) == prefix:
                hist[a & 0xFFFF] += 1
    return m


@njit(nogil=True, cache=True)
def mask_above(bits: np.ndarray, thr: np.int32, inclusive: bool, mask: np.ndarray) -> int:  # pragma: no cover - compiled
    """``mask[i] = |bits[i]| > thr`` (``>=`` when ``inclusive``), as uint8; returns the count.
    No data-dependent branch: a tenth of the elements kept at random places would mispredict
    one often."""
    if inclusive:
        for i in range(bits.size):
            mask[i] = (bits[i] & _ABS) >= thr
    else:
        for i in range(bits.size):
            mask[i] = (bits[i] & _ABS) > thr
    n = 0
    for i in range(bits.size):
        n += np.int64(mask[i])
    return n


@njit(nogil=True, cache=True)
def mask_first_ties(bits: np.ndarray, thr: np.int32, ties: int, mask: np.ndarray) -> None:  # pragma: no cover - compiled
    """Set ``mask`` at the first ``ties`` elements (index order) with ``|bits| == thr``; the
    scan stops at the last one taken."""
    i = 0
    while ties > 0:
        if (bits[i] & _ABS) == thr:
            mask[i] = 1
            ties -= 1
        i += 1


@njit(nogil=True, cache=True)
def compact(values: np.ndarray, mask: np.ndarray, out: np.ndarray) -> int:  # pragma: no cover - compiled
    """Append ``values[mask]`` to ``out`` (one slot longer than the number kept), -0.0 sent
    as +0.0; returns the number kept.  Every value is stored and the write position advanced
    by the mask bit, so there is no branch."""
    n = 0
    for i in range(values.size):
        out[n] = values[i] + np.float32(0.0)  # -0.0 + 0.0 = +0.0; any other value unchanged
        n += np.int64(mask[i])
    return n


@njit(nogil=True, cache=True)
def column_abs_bits_max(bits: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[c] = max(out[c], max_r bits[r, c] & 0x7fffffff)`` over a C-contiguous 2-D int32
    array of float bits, row by row (the inner loop runs along a row, as memory does)."""
    rows, cols = bits.shape
    for r in range(rows):
        for c in range(cols):
            out[c] = max(out[c], bits[r, c] & _ABS)


_MAGIC32 = np.float32(1.5 * 2.0**23)
_MAGIC_INT = np.int32(3 << 22)


# error_model="numpy": a float division by an array element is then an IEEE division (inf or
# NaN for 0) instead of a ZeroDivisionError check per element, which keeps the loop vectorised.
@njit(nogil=True, cache=True, error_model="numpy")
def fixpoint_codes(
    x2: np.ndarray, den: np.ndarray, zero: int, codes: np.ndarray, packed: np.ndarray, pack: bool,
) -> int:  # pragma: no cover - compiled
    """qchannel's offset codes ``clip(round_half_even(fl(x / den)), -zero, zero - 1) + zero``
    of the float32 rows ``x2`` over ``den`` (2-D: one row, or one per row of ``x2``; one
    column, or one per column), written to the flat uint8 ``codes``; with ``pack``, their
    4-bit stream to ``packed`` too (an even count of codes).  Returns the number of codes
    other than ``zero``.

    For ``|y| < 2**22``, ``fl(y + 1.5 * 2**23) = 1.5 * 2**23 + round_half_even(y)`` exactly,
    and the clip bounds are integers of that binade, so clipping the float clips the code."""
    rows, cols = x2.shape
    lo = _MAGIC32 - np.float32(zero)
    hi = _MAGIC32 + np.float32(zero - 1)
    off = np.int32(zero) - _MAGIC_INT
    for r in range(rows):
        xr = x2[r]
        cr = codes[r * cols : (r + 1) * cols]
        dr = den[r if den.shape[0] > 1 else 0]
        if den.shape[1] > 1:
            for c in range(cols):
                cr[c] = np.uint8(np.int32(min(max(xr[c] / dr[c] + _MAGIC32, lo), hi)) + off)
        else:
            d = dr[0]
            for c in range(cols):
                cr[c] = np.uint8(np.int32(min(max(xr[c] / d + _MAGIC32, lo), hi)) + off)
    n = rows * cols
    nz = 0
    for i in range(n):
        nz += np.int64(codes[i] != zero)
    if pack:
        for j in range(n // 2):
            packed[j] = (codes[2 * j] << 4) | codes[2 * j + 1]
    return nz
