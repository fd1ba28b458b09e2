"""The sparse, top-k and rand-k codecs; their body layout is in :mod:`.sparse_body`."""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from ._core import (
    FAMILY_RANDK,
    FAMILY_SPARSE,
    FAMILY_TOPK,
    FLOAT_DTYPES,
    INT_DTYPES,
    Codec,
    CodecError,
    Header,
    NonFiniteInput,
    Payload,
    build_header,
    check_finite,
    check_input,
    header_nbytes,
    log2_binom,
    make_payload,
)
from ._fast import use_kernels
from ._rng import pool_workers, run_blocks
from .bitpack import pack_bits
from .sparse_body import (
    FLAG_INDEX32,
    FLAG_SIGNED,
    FMT_DENSE,
    body_nbytes,
    choose_format,
    count_true,
    encode_positions,
    format_options_spec,
    index_width,
    masked_select,
    pack_sparse_params,
    parse_format_options,
    read_sparse,
    section_nbytes,
    write_raw_sparse,
)

FLAG_SCALED = 2  # randk: values were scaled by n/k (informational)

ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)


def nonzero_mask(x: torch.Tensor) -> torch.Tensor:
    """Elements whose bit pattern is not all zeros (so -0.0 and NaN count as nonzero)."""
    flat = x.reshape(-1)
    if flat.dtype == torch.bool:
        return flat
    if flat.is_floating_point():
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        return flat.view(ints) != 0
    return flat != 0


def _sparse_floor(n: int, k: int, value_bits: float) -> float:
    return math.log2(n + 1) + log2_binom(n, k) + k * value_bits


# --------------------------------------------------------------------------- sparse
class SparseCodec(Codec):
    """Lossless sparse encoding of any tensor (``"sparse"``).

    The selection is the set of elements whose bit pattern is nonzero (so the
    round trip is bit-exact, -0.0 and NaN included), ``k = nnz(x)``.  Values are
    raw (``vb = 8*itemsize``) or, with ``bits=B``, ``B``-bit integer codes
    (two's complement with ``signed=true``, the default, else unsigned); the
    input must then be an integer tensor whose values fit.

    Size (bytes), ``n = numel``, ``h0 = 21 + 4*ndim``:
    ``h0 + min(ceil(n*vb/8), ceil(n/8) + ceil(k*vb/8), ceil(k*w/8) + ceil(k*vb/8))``
    with ``format=auto`` (one term when a format is forced).

    Floor: ``log2(n+1) + log2 C(n,k) + k*log2(2**vb - 1)`` bits: name ``k``, the
    support, and each value among the nonzero ``vb``-bit patterns.
    """

    family = FAMILY_SPARSE
    name = "sparse"
    unbiased = True
    contraction = 0.0

    def __init__(
        self,
        bits: int | None = None,
        signed: bool = True,
        fmt: int | None = None,
        int32: bool = False,
    ):
        if bits is not None and not 1 <= bits <= 63:
            raise CodecError(f"sparse: bits={bits} out of range 1..63")
        self.bits = bits
        self.signed = signed
        self.fmt = fmt
        self.int32 = int32

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> SparseCodec:
        from ._core import parse_bool

        fmt, int32 = parse_format_options(opts, "sparse")
        bits = None
        if "bits" in opts:
            bits = _parse_int("sparse", "bits", opts.pop("bits"))
        signed = parse_bool("signed", opts.pop("signed", "true"))
        return cls(bits, signed, fmt, int32)

    def spec(self) -> str:
        parts = []
        if self.bits is not None:
            parts.append(f"bits={self.bits}")
            if not self.signed:
                parts.append("signed=false")
        parts += format_options_spec(self.fmt, self.int32)
        return "sparse" + (":" + ",".join(parts) if parts else "")

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        x = check_input(x, ALL_DTYPES if self.bits is None else INT_DTYPES, "sparse")
        if self.bits is not None and self.bits > 8 * x.element_size():
            raise CodecError(f"sparse: bits={self.bits} is wider than dtype {x.dtype}")
        return x

    def _range_ok(self, x: torch.Tensor) -> bool:
        if self.bits is None or x.numel() == 0:
            return True
        lo, hi = (
            (-(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1)
            if self.signed
            else (0, 2**self.bits - 1)
        )
        mn, mx = torch.aminmax(x.reshape(-1))
        return lo <= int(mn) and int(mx) <= hi

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        return self._range_ok(x)

    def _layout(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int, int, int]:
        mask = nonzero_mask(x)
        k = count_true(mask)
        n = x.numel()
        vbits = self.bits if self.bits is not None else 8 * x.element_size()
        iw = index_width(n, self.int32)
        return mask, k, vbits, iw, choose_format(n, k, vbits, iw, self.fmt)

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        _, k, vbits, iw, fmt = self._layout(x)
        return header_nbytes(x.dim(), self.family) + body_nbytes(x.numel(), k, vbits, fmt, iw)

    def floor_bits(self, x: torch.Tensor) -> float:
        x = self._check(x)
        _, k, vbits, _, _ = self._layout(x)
        return _sparse_floor(x.numel(), k, math.log2(2.0**vbits - 1))

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        if not self._range_ok(x):
            raise CodecError(
                f"sparse: values do not fit in {self.bits} {'signed' if self.signed else 'unsigned'} bits"
            )
        mask, k, vbits, iw, fmt = self._layout(x)
        flags = (FLAG_INDEX32 if self.int32 else 0) | (
            FLAG_SIGNED if self.signed and self.bits else 0
        )
        if self.bits is None:
            return write_raw_sparse(self.family, x, fmt, iw, flags, k, mask, None, None)
        n = x.numel()
        pos_n, val_n = section_nbytes(n, k, vbits, fmt, iw)
        header = build_header(
            self.family, x.dtype, tuple(x.shape), pack_sparse_params(vbits, flags, fmt, k)
        )
        out, body = make_payload(header, pos_n + val_n)
        encode_positions(fmt, n, iw, mask, None, body[:pos_n])
        flat = x.reshape(-1).to(torch.int64)
        vals = flat if fmt == FMT_DENSE else masked_select(flat, mask)
        pack_bits(vals & ((1 << vbits) - 1), vbits, body[pos_n:])
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        out = read_sparse(data, hdr, FLAG_INDEX32 | FLAG_SIGNED)
        vbits, _, fmt, k = struct.unpack("<BBBI", hdr.params)
        if fmt == FMT_DENSE and count_true(nonzero_mask(out)) != k:
            raise CodecError("corrupted payload: dense body nnz differs from the header's k")
        return out


def _parse_int(codec: str, key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CodecError(f"{codec}: {key}={value!r} is not an integer") from None


def _parse_k_ratio(codec: str, opts: dict[str, str]) -> tuple[int | None, float | None]:
    if ("k" in opts) == ("ratio" in opts):
        raise CodecError(f"{codec}: give exactly one of k=INT or ratio=FLOAT")
    if "k" in opts:
        k = _parse_int(codec, "k", opts.pop("k"))
        if k < 1:
            raise CodecError(f"{codec}: k={k} must be at least 1")
        return k, None
    raw = opts.pop("ratio")
    try:
        ratio = float(raw)
    except ValueError:
        raise CodecError(f"{codec}: ratio={raw!r} is not a number") from None
    if not 0.0 < ratio <= 1.0:
        raise CodecError(f"{codec}: ratio={ratio} must be in (0, 1]")
    return None, ratio


class _KSparsifier(Codec):
    """Common parts of top-k and rand-k: exactly ``k`` entries are sent.

    ``k`` is fixed (``k=K``) or ``ceil(ratio*n)`` (at least 1; a 1e-9 guard
    absorbs floating error, so ratio=0.1 of 30 is 3).  ``k > n`` is a
    :class:`CodecError`.  The ``k`` selected entries travel with raw values of
    the input dtype, so the size depends only on ``n``, ``k``, dtype and ndim:
    ``h0 + min(ceil(n*vb/8), ceil(n/8) + k*vb/8, ceil(k*w/8) + k*vb/8)`` with
    ``h0 = 21 + 4*ndim``, ``vb = 8*itemsize`` (one term if a format is forced).
    """

    def __init__(
        self, k: int | None, ratio: float | None, fmt: int | None = None, int32: bool = False
    ):
        if (k is None) == (ratio is None):
            raise CodecError(f"{self.name}: give exactly one of k or ratio")
        if k is not None and k < 1:
            raise CodecError(f"{self.name}: k={k} must be at least 1")
        if ratio is not None and not 0.0 < ratio <= 1.0:
            raise CodecError(f"{self.name}: ratio={ratio} must be in (0, 1]")
        self.k = k
        self.ratio = ratio
        self.fmt = fmt
        self.int32 = int32

    def k_for(self, n: int) -> int:
        """Entries sent for an ``n``-element input (CodecError if k > n)."""
        if self.k is not None:
            k = self.k
        else:
            k = max(1, math.ceil(self.ratio * n - 1e-9))
        if k > n:
            raise CodecError(f"{self.name}: k={k} exceeds the number of elements d={n}")
        return k

    def _kspec(self) -> list[str]:
        return [f"k={self.k}"] if self.k is not None else [f"ratio={self.ratio!r}"]

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        x = check_input(x, FLOAT_DTYPES, self.name)
        check_finite(x, self.name)
        return x

    def _layout(self, x: torch.Tensor) -> tuple[int, int, int, int]:
        n = x.numel()
        k = self.k_for(n)
        vbits = 8 * x.element_size()
        iw = index_width(n, self.int32)
        return k, vbits, iw, choose_format(n, k, vbits, iw, self.fmt)

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        k, vbits, iw, fmt = self._layout(x)
        return header_nbytes(x.dim(), self.family) + body_nbytes(x.numel(), k, vbits, fmt, iw)

    def floor_bits(self, x: torch.Tensor) -> float:
        """``log2 C(n,k) + k*vb``: which ``k`` of ``n`` positions, and their values."""
        x = self._check(x)
        k, vbits, _, _ = self._layout(x)
        return log2_binom(x.numel(), k) + k * vbits


def topk_mask(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` largest ``|x|`` of a finite ``flat``, ties broken toward the
    lower index (:func:`topk_select`'s mask)."""
    return topk_select(flat, k, "topk")[0]


def topk_select(flat: torch.Tensor, k: int, codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask of the ``k`` largest ``|x|`` and the selected values in index order (-0.0 as
    +0.0); :class:`NonFiniteInput` if ``flat`` holds NaN or infinity.

    The threshold is the ``k``-th largest ``|x|``; everything above it is kept, and of the
    entries tied at it the first ``need`` in index order (:func:`topk_mask_reference` is the
    whole-tensor formulation of the same rule).  float32 finds it by a radix select on the
    bits of ``|x|`` read as integers (their order is that of ``|x|`` for finite values, -0
    and +0 alike): a histogram of the high 16 bits picks the threshold's bucket, a second of
    the low 16 bits within that bucket the threshold itself, and a third pass writes the mask
    and values (``_kernels``: three reads of ``x``, no copy, no sort).  Other dtypes, and
    tensors too small for the kernels (``_fast.use_kernels``), use a partition (numpy's
    introselect) of ``|x|``.
    """
    n = flat.numel()
    x = flat.reshape(-1)
    if x.dtype == torch.float32 and 0 < k < n and use_kernels(n):
        return _topk_select_float32(x, k, codec)
    check_finite(x, codec)
    if k >= n:
        mask = torch.ones(n, dtype=torch.bool)
    elif k <= 0:
        mask = torch.zeros(n, dtype=torch.bool)
    else:
        a = np.abs(x.numpy() if x.dtype == torch.float64 else x.float().numpy())  # exact
        part = a.copy()
        part.partition(n - k)
        thr = part[n - k]
        del part
        m = a >= thr
        if int(np.count_nonzero(m)) != k:  # ties at the threshold: keep the lowest indices
            m = a > thr
            need = k - int(np.count_nonzero(m))
            m[np.flatnonzero(a == thr)[:need]] = True
        mask = torch.from_numpy(m)
    vals = masked_select(x, mask)
    return mask, torch.where(vals == 0, torch.zeros_like(vals), vals)


def _digit_at(hist: np.ndarray, rank: int) -> tuple[int, int]:
    """The bucket holding the ``rank``-th largest (1-based) of a histogram's counts, and how
    many counts lie in the buckets above it."""
    from_top = np.cumsum(hist[::-1])
    r = int(np.searchsorted(from_top, rank))  # the first bucket from the top reaching rank
    digit = hist.size - 1 - r
    return digit, int(from_top[r]) - int(hist[digit])


FLOAT32_INF_BITS = 0x7F800000  # |x|'s bits at or above this pattern: infinity or a NaN
TOPK_PARALLEL_MIN = 1 << 18  # elements below which top-k runs in one piece on the calling thread


def _topk_select_float32(x: torch.Tensor, k: int, codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    from . import _kernels  # compiled on first use

    xs = x.numpy()
    bits = xs.view(np.int32)
    n = xs.size
    # one piece per pool worker: each counts into its own histogram, masks and compacts its
    # own range (the values at the offsets the pieces' counts give)
    pieces = pool_workers() if n >= TOPK_PARALLEL_MIN else 1
    step = -(-n // pieces)
    cut = [(j * step, min(n, (j + 1) * step)) for j in range(pieces)]

    def histogram(prefix: int) -> tuple[np.ndarray, int]:
        def piece(j: int) -> tuple[np.ndarray, int]:
            h = np.zeros(1 << 16, dtype=np.int64)
            return h, int(_kernels.abs_bits_histogram(bits[cut[j][0] : cut[j][1]], prefix, h))

        parts = run_blocks(piece, pieces)
        return sum(h for h, _ in parts), max(m for _, m in parts)

    hist, top = histogram(-1)
    if top >= FLOAT32_INF_BITS:
        raise NonFiniteInput(f"{codec}: input contains NaN or infinity")
    hi, above = _digit_at(hist, k)
    hist, _ = histogram(hi)
    lo, above_lo = _digit_at(hist, k - above)
    ties = k - above - above_lo  # of the entries at the threshold, the first this many are kept
    thr = np.int32(hi << 16 | lo)
    every_tie = ties == int(hist[lo])
    mask = np.empty(n, dtype=np.uint8)
    counts = run_blocks(
        lambda j: _kernels.mask_above(bits[cut[j][0] : cut[j][1]], thr, every_tie,
                                      mask[cut[j][0] : cut[j][1]]), pieces)
    if not every_tie:
        _kernels.mask_first_ties(bits, thr, ties, mask)
        counts = [int(np.count_nonzero(mask[a:b])) for a, b in cut]
    offsets = np.cumsum([0, *counts])
    if offsets[-1] != k:  # pragma: no cover - an error in the select, never an input's
        raise AssertionError(f"top-k select kept {offsets[-1]} of k={k}")
    # each piece compacts into its own slice, one slot longer than its count (the kernel
    # stores every value and advances past the kept ones, so it writes one slot beyond)
    spare = np.empty(k + pieces, dtype=np.float32)
    parts = [spare[offsets[j] + j : offsets[j + 1] + j + 1] for j in range(pieces)]
    run_blocks(lambda j: _kernels.compact(xs[cut[j][0] : cut[j][1]], mask[cut[j][0] : cut[j][1]],
                                          parts[j]), pieces)
    vals = parts[0][:-1] if pieces == 1 else np.concatenate([p[:-1] for p in parts])
    return torch.from_numpy(mask.view(np.bool_)), torch.from_numpy(vals)


def topk_mask_reference(flat: torch.Tensor, k: int) -> torch.Tensor:
    """The same mask from ``torch.topk`` and a cumulative count of the ties (slow; for checks)."""
    n = flat.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool)
    a = flat.abs() if flat.dtype in (torch.float32, torch.float64) else flat.float().abs()
    thr = torch.topk(a, k, sorted=False).values.min()
    gt = a > thr
    need = k - int(gt.sum())
    eq = a == thr
    return gt | (eq & (eq.cumsum(0) <= need))


class TopKCodec(_KSparsifier):
    """Top-k (``"topk:k=K"`` or ``"topk:ratio=R"``): keep the ``k`` largest ``|x_i|``.

    Deterministic and biased.  Contraction: ``‖C(x)−x‖² ≤ (1 − k/d)‖x‖²``, so
    ``ω = sqrt(1 − k/d)``.  Lossless on ``nnz(x) ≤ k``.  Ties at the threshold go
    to the lower flat index.  Size and floor: see :class:`_KSparsifier`.
    """

    family = FAMILY_TOPK
    name = "topk"
    unbiased = False

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> TopKCodec:
        k, ratio = _parse_k_ratio("topk", opts)
        fmt, int32 = parse_format_options(opts, "topk")
        return cls(k, ratio, fmt, int32)

    def spec(self) -> str:
        return "topk:" + ",".join(self._kspec() + format_options_spec(self.fmt, self.int32))

    def contraction_bound(self, numel: int) -> float | None:
        return math.sqrt(max(0.0, 1.0 - self.k_for(numel) / numel))

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        return int((x != 0).sum()) <= self.k_for(x.numel())

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = check_input(x, FLOAT_DTYPES, self.name)
        k, _, iw, fmt = self._layout(x)
        mask, vals = topk_select(x, k, self.name)  # also rejects NaN / infinity
        flags = FLAG_INDEX32 if self.int32 else 0
        return write_raw_sparse(self.family, x, fmt, iw, flags, k, mask, None, vals)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        if hdr.params[0] != 0 or hdr.dtype not in FLOAT_DTYPES:
            raise CodecError("corrupted header: top-k payloads carry raw floating-point values")
        return read_sparse(data, hdr, FLAG_INDEX32)


class RandKCodec(_KSparsifier):
    """Rand-k (``"randk:k=K,scaled=true"``): ``k`` uniformly random distinct coordinates.

    Each coordinate is kept with probability ``k/d``.  ``scaled=true`` (default)
    multiplies kept values by ``d/k`` (rounded once into the input dtype):
    unbiased, ``E‖C(x)−x‖² = (d/k − 1)‖x‖²``, ``ω = sqrt(d/k − 1)``.
    ``scaled=false``: biased (``E[C(x)] = (k/d) x``), contractive,
    ``E‖C(x)−x‖² = (1 − k/d)‖x‖²``, ``ω = sqrt(1 − k/d)``.  Lossless only when
    ``k = d`` or ``x = 0``.  The positions come from ``torch.randperm`` with the
    given generator.  Size and floor: see :class:`_KSparsifier`.
    """

    family = FAMILY_RANDK
    name = "randk"
    stochastic = True

    def __init__(
        self,
        k: int | None,
        ratio: float | None,
        scaled: bool = True,
        fmt: int | None = None,
        int32: bool = False,
    ):
        super().__init__(k, ratio, fmt, int32)
        self.scaled = scaled
        self.unbiased = scaled

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> RandKCodec:
        from ._core import parse_bool

        k, ratio = _parse_k_ratio("randk", opts)
        scaled = parse_bool("scaled", opts.pop("scaled", "true"))
        fmt, int32 = parse_format_options(opts, "randk")
        return cls(k, ratio, scaled, fmt, int32)

    def spec(self) -> str:
        parts = self._kspec() + [f"scaled={'true' if self.scaled else 'false'}"]
        return "randk:" + ",".join(parts + format_options_spec(self.fmt, self.int32))

    def contraction_bound(self, numel: int) -> float | None:
        k = self.k_for(numel)
        return math.sqrt(numel / k - 1.0) if self.scaled else math.sqrt(max(0.0, 1.0 - k / numel))

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        return self.k_for(x.numel()) == x.numel() or not bool((x != 0).any())

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        k, _, iw, fmt = self._layout(x)
        n = x.numel()
        flat = x.reshape(-1)
        idx = torch.randperm(n, generator=generator)[:k].sort().values
        vals = flat[idx]
        if self.scaled and k != n:
            vals = (vals.to(torch.float64) * (n / k)).to(x.dtype)
            if not bool(torch.isfinite(vals).all()):
                raise CodecError(f"randk: value scaled by d/k={n / k:g} overflows {x.dtype}")
        vals = torch.where(vals == 0, torch.zeros_like(vals), vals)
        flags = (FLAG_INDEX32 if self.int32 else 0) | (FLAG_SCALED if self.scaled else 0)
        return write_raw_sparse(self.family, x, fmt, iw, flags, k, None, idx, vals)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        if hdr.params[0] != 0 or hdr.dtype not in FLOAT_DTYPES:
            raise CodecError("corrupted header: rand-k payloads carry raw floating-point values")
        return read_sparse(data, hdr, FLAG_INDEX32 | FLAG_SCALED)
