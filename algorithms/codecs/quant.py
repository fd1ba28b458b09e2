"""Quantisers: ``qstoch`` (double-quantisation, unbiased) and ``qchannel`` (SparQ / AQ-SGD fixpoint).

qstoch: unbiased stochastic b-bit quantiser
-------------------------------------------
``δ = ‖x‖∞ / L`` with ``L = 2**(b-1) - 1``; each coordinate is rounded to
``k δ``, ``k ∈ {-L..L}``, up with probability ``frac(x/δ)`` (spec
seed-double-quant §2.1).  On the wire: ``δ`` as float32 and the ``n`` codes
offset-binary (``k + 2**(b-1)``), ``b`` bits each, MSB-first.

Implementation (all vectorised).  ``y = x / δ`` is computed in float32 (inputs
of 32 bits or fewer, ``b <= 8``) or float64 (float64 inputs, ``b > 8``) and
shifted by a constant ``O`` into the binade ``[2**E, 2**(E+1))`` whose spacing is
``2**-R``; there ``y`` is rounded to the grid ``2**-R`` and adding ``R``-bit
uniform integers scaled by ``2**-R`` is exact, so ``trunc`` rounds up with
probability exactly ``frac`` of the gridded ``y``:

* float32: ``E = max(7, b+1)``, ``R = 23 - E`` (16 for ``b <= 6``; 15, 14 for 7, 8),
  16 random bits per element;
* float64: ``E = 20``, ``R = 32``, 32 random bits per element.

Consequences (tested): inputs already on the grid (``x = c k`` with ``c``
representable and ``max|k| = L``) round-trip exactly with probability 1, the
max-magnitude coordinate is always exact, and
``|E[Q(x)] - x| <= δ 2**-(R+1) + 2**-23 |x|`` per coordinate (the second term is
the float32 ``δ`` on the wire).  :func:`qstoch_law` returns the exact law the
sampler follows, so tests compute ``E[Q]`` and ``E‖Q-x‖²`` without sampling.
For ``b`` in {2, 4} the encoder runs the same arithmetic block by block in a
thread pool (``_fast.qstoch_pack_fast``), bit-identical to the whole-tensor
reference path (``QStochCodec._encode(..., fast=False)``).

qchannel: absmax fixpoint quantiser (SparQ §2.7)
-----------------------------------------------
``s_h = fp16(max |x_h|)`` over each group ``h`` of the ``granularity``:
``channel`` (the default, AQ-SGD's): a scale per last-dimension channel, the
max over all other dimensions; ``token``: a scale per row (everything but the
last dimension indexes a row, the max runs along the last); ``tensor``: one
scale.  0-/1-D inputs have one scale whatever the granularity;
``y = x / (s_h + 1e-6) * 2**(b-1)``, ``q = clip(round_half_even(y), -2**(b-1),
2**(b-1)-1)``, ``x̂ = q / 2**(b-1) * s_h``.  ``signed=false``:
``q = clip(round(x / (s_h + 1e-6) * (2**b-1)), 0, 2**b-1)``, ``x̂ = q s_h / (2**b-1)``.
``signed=auto`` chooses per message: unsigned when the tensor has no negative
entry (a ReLU output), signed otherwise; the choice is the header's signed flag,
so the decoder needs no side information.  The signed grid spends half its
levels below zero and at 1 bit rounds every non-negative value to 0 (the codes
are -1 and 0), so on a non-negative tensor the unsigned grid is the one that
sends its values.
Arithmetic is float32 (float64 for float64 inputs).  The codes are then sent
with the sparse body (dense / bitmap / index list, cheapest by default) after
the ``H`` fp16 scales; the zero code is the one left implicit.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Self

import numpy as np
import torch

from ._core import (
    FAMILY_QCHANNEL,
    FAMILY_QSTOCH,
    FLOAT_DTYPES,
    Codec,
    CodecError,
    Header,
    NonFiniteInput,
    Payload,
    build_header,
    check_body_length,
    check_finite,
    check_input,
    from_raw_bytes,
    header_nbytes,
    log2_binom,
    make_payload,
    parse_bool,
    raw_bytes,
)
from ._fast import column_absmax, fixpoint_codes_fast, flat_absmax, qstoch_pack_fast, use_kernels
from ._rng import draw_seed, random_words
from .bitpack import pack_bits, packed_nbytes, unpack_bits
from .sparse_body import (
    FLAG_INDEX32,
    FMT_DENSE,
    body_nbytes,
    check_format_code,
    choose_format,
    decode_positions,
    encode_positions,
    format_options_spec,
    index_width,
    masked_select,
    parse_format_options,
    section_nbytes,
)

FLT32_MIN_NORMAL = 2.0**-126
FLT32_MAX = float(torch.finfo(torch.float32).max)


# The qstoch grid's code widths: L = 2**(b-1) - 1 >= 1 needs b >= 2; the float32 sampler plan
# covers b <= 16 (module docstring).  qstoch and sparse-qstoch share it (_QStochBits).
QSTOCH_BITS = (2, 16)


def _check_bits(codec: str, bits: int, lo: int, hi: int) -> int:
    if not lo <= bits <= hi:
        raise CodecError(f"{codec}: bits={bits} out of range {lo}..{hi}")
    return bits


def _parse_bits(codec: str, opts: dict[str, str], default: int, lo: int, hi: int) -> int:
    """Pop the ``bits`` option of a spec string (``default`` when absent) and check its range."""
    raw = opts.pop("bits", str(default))
    try:
        bits = int(raw)
    except ValueError:
        raise CodecError(f"{codec}: bits={raw!r} is not an integer") from None
    return _check_bits(codec, bits, lo, hi)


# =========================================================================== qstoch
@dataclass(frozen=True)
class _QPlan:
    dtype: torch.dtype  # compute dtype
    E: int  # binade exponent of the shifted values
    R: int  # grid resolution 2**-R (bits of randomness used per element)
    word_bits: int  # 16 or 32 random bits drawn per element


def _qstoch_plan(dtype: torch.dtype, bits: int) -> _QPlan:
    if dtype != torch.float64 and bits <= 8:
        E = max(7, bits + 1)
        return _QPlan(torch.float32, E, 23 - E, 16)
    return _QPlan(torch.float64, 20, 32, 32)


@dataclass(frozen=True)
class QStochGrid:
    """``y'' = fl(O + 0.5 + fl(x / δ))`` in the compute dtype, or None when ``x = 0``."""

    shifted: torch.Tensor | None
    delta: float  # the float32 δ that travels (0.0 for x = 0)
    offset: int  # O = 3 * 2**(E-1) + 2**(b-1)
    plan: _QPlan


@dataclass(frozen=True)
class _QScale:
    flat: torch.Tensor  # x flattened, in the compute dtype
    delta: float  # float32 δ (0.0 for x = 0)
    delta64: float
    offset: int
    plan: _QPlan


def _qstoch_scale(x: torch.Tensor, bits: int) -> _QScale:
    _check_bits("qstoch", bits, *QSTOCH_BITS)
    plan = _qstoch_plan(x.dtype, bits)
    L = 2 ** (bits - 1) - 1
    offset = 3 * 2 ** (plan.E - 1) + 2 ** (bits - 1)
    xc = x.reshape(-1)
    if xc.dtype != plan.dtype:
        xc = xc.to(plan.dtype)
    m = 0.0
    if xc.numel() and xc.dtype == torch.float32 and use_kernels(xc.numel()):
        m = flat_absmax(xc.numpy())  # NaN propagates
    elif xc.numel():
        mn, mx = torch.aminmax(xc)  # NaN propagates
        m = max(-float(mn), float(mx))
    if not math.isfinite(m):
        raise NonFiniteInput("qstoch: input contains NaN or infinity")
    if m == 0.0:
        return _QScale(xc, 0.0, 0.0, offset, plan)
    delta64 = m / L
    delta32 = float(torch.tensor(delta64, dtype=torch.float32))
    if not (FLT32_MIN_NORMAL <= delta32 <= FLT32_MAX):
        raise CodecError(f"qstoch: scale δ = ‖x‖∞/{L} = {delta64:g} is not a normal float32")
    return _QScale(xc, delta32, delta64, offset, plan)


def qstoch_grid(x: torch.Tensor, bits: int) -> QStochGrid:
    """The deterministic half of the qstoch quantiser (shared by encode and the law)."""
    sc = _qstoch_scale(x, bits)
    if sc.delta == 0.0:
        return QStochGrid(None, 0.0, sc.offset, sc.plan)
    cd = sc.plan.dtype
    dc = torch.tensor(sc.delta if cd == torch.float32 else sc.delta64, dtype=cd)
    shifted = torch.addcdiv(torch.tensor(sc.offset + 0.5, dtype=cd), sc.flat, dc)
    return QStochGrid(shifted, sc.delta, sc.offset, sc.plan)


@dataclass(frozen=True)
class QStochLaw:
    """Exact law of the implemented sampler: ``k = k_lo + Bernoulli(p)``, value ``k δ``."""

    k_lo: torch.Tensor  # int64, shape of x
    p: torch.Tensor  # float64 in [0, 1), multiples of 2**-R
    delta: float  # float32 δ sent on the wire
    resolution_bits: int  # R

    def mean(self) -> torch.Tensor:
        return self.delta * (self.k_lo.to(torch.float64) + self.p)

    def mse(self, x: torch.Tensor) -> float:
        """``E‖Q(x) − x‖²`` exactly (float64 arithmetic)."""
        xd = x.to(torch.float64)
        lo = self.delta * self.k_lo.to(torch.float64)
        hi = lo + self.delta
        return float((self.p * (hi - xd) ** 2 + (1 - self.p) * (lo - xd) ** 2).sum())


def qstoch_law(x: torch.Tensor, bits: int) -> QStochLaw:
    """The exact distribution of ``qstoch`` codes for ``x`` (no sampling)."""
    x = check_input(x, FLOAT_DTYPES, "qstoch")
    g = qstoch_grid(x, bits)
    if g.shifted is None:
        zeros = torch.zeros(x.shape, dtype=torch.int64)
        return QStochLaw(zeros, torch.zeros(x.shape, dtype=torch.float64), 0.0, g.plan.R)
    z = g.shifted - 0.5  # exact: same binade, on the grid
    lo = torch.floor(z)
    p = (z - lo).to(torch.float64).reshape(x.shape)
    k_lo = (lo.to(torch.int64) - g.offset).reshape(x.shape)
    return QStochLaw(k_lo, p, g.delta, g.plan.R)


def qstoch_round_probs(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The paper's law in float64: ``(floor(x/δ), frac(x/δ), δ)`` with ``δ = ‖x‖∞/L``."""
    xd = x.detach().to(torch.float64)
    L = 2 ** (bits - 1) - 1
    m = float(xd.abs().max()) if xd.numel() else 0.0
    if m == 0.0:
        return torch.zeros_like(xd), torch.zeros_like(xd), 0.0
    delta = m / L
    y = (xd / delta).clamp(-L, L)
    lo = torch.floor(y)
    return lo, y - lo, delta


def qstoch_paper_mse(x: torch.Tensor, bits: int) -> float:
    """``δ² Σ f_i (1 − f_i)`` (spec §2.1): the exact variance of the ideal quantiser."""
    _, f, delta = qstoch_round_probs(x, bits)
    return float(delta**2 * (f * (1 - f)).sum())


class _QStochBits(Codec):
    """What ``qstoch`` and ``sparse-qstoch`` share: the ``bits`` option of the qstoch grid
    (``QSTOCH_BITS``, default 4) parsed and checked in one place, the spec string, the input
    check, and the contraction bound (sparse-qstoch's error is within qstoch's for ``n``
    coordinates, its zeros being exact)."""

    unbiased = True
    stochastic = True

    def __init__(self, bits: int = 4):
        self.bits = _check_bits(self.name, bits, *QSTOCH_BITS)

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> Self:
        return cls(_parse_bits(cls.name, opts, 4, *QSTOCH_BITS))

    def spec(self) -> str:
        return f"{self.name}:bits={self.bits}"

    def contraction_bound(self, numel: int) -> float | None:
        L = 2 ** (self.bits - 1) - 1
        d = max(1, numel)
        return math.sqrt(min(d / (4 * L * L), math.sqrt(d) / L))

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        x = check_input(x, FLOAT_DTYPES, self.name)
        check_finite(x, self.name)
        return x

    def _certain_law(self, x: torch.Tensor) -> QStochLaw | None:
        """The codes' law on ``x`` when no code is random (else None: not lossless)."""
        try:
            law = qstoch_law(x, self.bits)
        except CodecError:
            return None
        return None if bool((law.p != 0).any()) else law


class QStochCodec(_QStochBits):
    """Unbiased stochastic ``b``-bit quantiser of the double-quantisation paper (``"qstoch:bits=B"``).

    ``δ = ‖x‖∞/(2**(b-1)-1)``, codes ``k ∈ [-L, L]`` (see the module docstring
    for the exact sampler and its ``2**-R`` resolution).  ``2 <= b <= 16``.

    Size (bytes): ``h0 + ceil(n*b/8)``, ``h0 = 19 + 4*ndim`` (the float32 δ is in
    the header); the paper counts ``32 + b*n`` bits.
    Floor: ``32 + n*log2(2**b - 1)`` bits (δ plus one of the ``2**b-1`` levels
    actually used per coordinate).
    Unbiased; ``E‖Q(x)−x‖² = δ²Σf(1−f) ≤ min(d/(4L²), √d/L)‖x‖²`` (Lemma 4 and
    ``δ‖x‖₁``), hence ``ω = sqrt(min(d/(4L²), √d/L))``.  Lossless on ``x``
    whose codes are deterministic and decode exactly (e.g. ``x = c k``).
    """

    family = FAMILY_QSTOCH
    name = "qstoch"

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        return header_nbytes(x.dim(), self.family) + packed_nbytes(x.numel(), self.bits)

    def floor_bits(self, x: torch.Tensor) -> float:
        x = self._check(x)
        return 32.0 + x.numel() * math.log2(2.0**self.bits - 1)

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        law = self._certain_law(x)
        if law is None:
            return False
        return bool(
            torch.equal(
                _qstoch_values(law.k_lo.reshape(-1), law.delta, x.dtype).reshape(x.shape), x
            )
        )

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        return self._encode(x, generator, fast=True)

    def _encode(self, x: torch.Tensor, generator: torch.Generator | None, fast: bool) -> Payload:
        """``fast=False`` runs the whole-tensor reference arithmetic (bit-identical)."""
        x = check_input(x, FLOAT_DTYPES, "qstoch")
        b = self.bits
        sc = _qstoch_scale(x, b)  # also rejects NaN / infinity
        n = x.numel()
        header = build_header(self.family, x.dtype, tuple(x.shape), struct.pack("<Bf", b, sc.delta))
        out, body = make_payload(header, packed_nbytes(n, b))
        if sc.delta == 0.0:
            pack_bits(torch.full((n,), 2 ** (b - 1), dtype=torch.int64), b, body)
            return Payload(out)
        plan = sc.plan
        if fast and b in (2, 4) and plan.E == 7 and sc.delta >= 2.0**-100:
            seed = draw_seed(generator)
            qstoch_pack_fast(sc.flat.numpy(), b, sc.delta, sc.offset, seed, body.numpy())
            return Payload(out)
        g = qstoch_grid(x, b)
        t = g.shifted
        words = random_words(n, plan.word_bits, generator)
        if plan.R < plan.word_bits:
            words = words >> (plan.word_bits - plan.R)
        t.add_(words, alpha=2.0**-plan.R)  # exact; trunc(t) = floor(y + u), u ~ U{0..2^R-1}/2^R
        if plan.E <= 7:
            codes = t.to(torch.uint8)
            if b != 4:
                codes &= (1 << b) - 1
        else:
            codes = t.to(torch.int32) & ((1 << b) - 1)
        pack_bits(codes, b, body)  # width 4 keeps the low nibble
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        b, delta = struct.unpack("<Bf", hdr.params)
        if not QSTOCH_BITS[0] <= b <= QSTOCH_BITS[1]:
            raise CodecError(f"corrupted header: qstoch bits={b}")
        if hdr.dtype not in FLOAT_DTYPES:
            raise CodecError(f"corrupted header: qstoch payload for dtype {hdr.dtype}")
        if not (delta == 0.0 or FLT32_MIN_NORMAL <= delta <= FLT32_MAX):
            raise CodecError(f"corrupted header: qstoch scale {delta!r}")
        n = hdr.numel
        check_body_length(data, hdr, packed_nbytes(n, b))
        codes = unpack_bits(data[hdr.nbytes :], b, n)
        return _qstoch_values(codes, delta, hdr.dtype, offset=2 ** (b - 1)).reshape(hdr.shape)


def _qstoch_values(
    k: torch.Tensor, delta: float, dtype: torch.dtype, offset: int = 0
) -> torch.Tensor:
    """``(k - offset) * δ`` computed in float32 (float64 for float64), then cast to ``dtype``."""
    cd = torch.float64 if dtype == torch.float64 else torch.float32
    v = k.to(cd)
    if offset:
        v.sub_(offset)
    return v.mul_(delta).to(dtype)


# =========================================================================== qchannel
FLAG_SIGNED = 2
FLAG_TENSOR = 4
FLAG_TOKEN = 8
EPS = 1e-6
GRANULARITIES = ("channel", "tensor", "token")
_FLAG_OF = {"channel": 0, "tensor": FLAG_TENSOR, "token": FLAG_TOKEN}


def granularity_name(granularity: str | bool) -> str:
    """A granularity of :data:`GRANULARITIES`; a bool is the older flag (True: tensor, False: channel)."""
    if isinstance(granularity, bool):
        return "tensor" if granularity else "channel"
    if granularity not in GRANULARITIES:
        raise CodecError(f"qchannel: granularity={granularity!r} is not one of {', '.join(GRANULARITIES)}")
    return granularity


def channels_of(shape: tuple[int, ...], granularity: str | bool) -> int:
    """Number of scales ``H``: the last dimension (channel), the rows (token), or 1 (tensor, 0-/1-D)."""
    g = granularity_name(granularity)
    if g == "tensor" or len(shape) <= 1:
        return 1
    return shape[-1] if g == "channel" else math.prod(shape[:-1])


def _rows_view(x: torch.Tensor, g: str) -> torch.Tensor:
    """``x`` as 2-D with the scales along dim 1 (channel, tensor) or dim 0 (token)."""
    H = channels_of(tuple(x.shape), g)
    if g == "token":
        return x.reshape(H, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)
    return x.reshape(-1, H) if H else x.reshape(0, 0)


def _scale_column(factor: torch.Tensor, g: str) -> torch.Tensor:
    """The scales shaped to broadcast over :func:`_rows_view`."""
    return factor.reshape(-1, 1) if g == "token" else factor


@dataclass(frozen=True)
class FixpointCodes:
    codes: torch.Tensor  # flat wire codes in [0, 2**b): offset-binary (signed) or q (unsigned)
    scales: torch.Tensor  # (H,) float16
    zero_code: int
    nnz: int
    signed: bool = True  # the grid these codes are on (the header's signed flag)
    granularity: str = "channel"  # what each scale covers (the header's tensor / token flags)
    packed: bool = False  # fixpoint_quantize also wrote the 4-bit packed codes to its ``packed``


def resolve_signed(x: torch.Tensor, signed: bool | None) -> bool:
    """The grid for ``x``: ``signed`` as given, or with ``None`` (auto) signed iff ``x`` has a
    negative entry (``-0.0`` is not negative; it maps to the zero code on either grid)."""
    if signed is not None:
        return signed
    return bool(x.numel()) and bool((x < 0).any())


def _absmax_channels(x2: torch.Tensor) -> torch.Tensor:
    N, H = x2.shape
    if N == 0:
        return torch.zeros(H, dtype=x2.dtype)
    if H == 1:
        mn, mx = torch.aminmax(x2.reshape(-1))
        return torch.maximum(-mn, mx).reshape(1)
    # numpy's column reductions are ~2x torch's amin / amax(dim=0); the values are the same
    xn = x2.numpy()
    if xn.dtype == np.float32 and xn.flags.c_contiguous:
        a = column_absmax(xn)  # one pass, NaN propagates
    else:
        a = np.maximum(-xn.min(axis=0), xn.max(axis=0))  # NaN propagates
    if not a.all():  # an all-zero column: whether it gets +0 or -0 is torch's (layout-dependent) rule
        return _absmax_columns_torch(x2)
    return torch.from_numpy(a)


def _absmax_columns_torch(x2: torch.Tensor) -> torch.Tensor:
    return torch.maximum(-x2.amin(dim=0), x2.amax(dim=0))  # aminmax(dim=0) is much slower


def fixpoint_scales(x: torch.Tensor, granularity: str | bool = "channel") -> torch.Tensor:
    """``fp16(max |x|)`` per group (CodecError if a group overflows float16)."""
    g = granularity_name(granularity)
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    x2 = _rows_view(x, g)
    if x2.dtype != cd:
        x2 = x2.to(cd)
    a = _absmax_channels(x2.T if g == "token" else x2)  # NaN propagates through amax / amin
    if not bool(torch.isfinite(a).all()):
        raise NonFiniteInput("qchannel: input contains NaN or infinity")
    s16 = a.to(torch.float16)
    if not bool(torch.isfinite(s16).all()):
        raise CodecError(
            "qchannel: a channel's max |x| exceeds the float16 range of the scales (65504)"
        )
    return s16


def fixpoint_quantize(
    x: torch.Tensor,
    bits: int,
    signed: bool = True,
    granularity: str | bool = "channel",
    fast: bool = True,
    packed: torch.Tensor | None = None,
) -> FixpointCodes:
    """Quantise ``x`` (any float dtype) to flat wire codes and fp16 scales.

    ``granularity``: channel, tensor or token (a bool: True is tensor, False
    channel).  ``fast=False`` forces the plain reference arithmetic (round,
    clamp, add); the fast path must produce identical codes (checked in the tests).
    ``packed``: a uint8 tensor of ``packed_nbytes(n, 4)`` bytes that the fast path
    fills with the 4-bit packed codes while it computes them (``FixpointCodes.packed``
    says whether it did: 4 bits, signed, float32).
    """
    if not 1 <= bits <= 16:
        raise CodecError(f"qchannel: bits={bits} out of range 1..16")
    g = granularity_name(granularity)
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    n = x.numel()
    s16 = fixpoint_scales(x, g)
    if n == 0:
        return FixpointCodes(
            torch.empty(0, dtype=torch.uint8), s16, 2 ** (bits - 1) if signed else 0, 0, signed, g
        )
    x2 = _rows_view(x, g)
    if x2.dtype != cd:
        x2 = x2.to(cd)
    d = _scale_column(s16.to(cd) + torch.tensor(EPS, dtype=cd), g)  # s_h + 1e-6, in the compute dtype
    if signed:
        zero = 2 ** (bits - 1)
        den = d * 2.0 ** (1 - bits)  # exact: y = x / den = fl(x / d) * 2**(b-1)
        if fast and cd == torch.float32 and bits <= 7:
            # fl(M + fl(x / den)) = M + round_half_even(y), block by block in cache (_fast)
            codes = torch.empty(n, dtype=torch.uint8)
            pk = packed.numpy() if packed is not None and bits == 4 else None
            nnz = fixpoint_codes_fast(x2.contiguous().numpy(), den.numpy(), zero, codes.numpy(), pk)
            return FixpointCodes(codes, s16, zero, nnz, True, g, packed=pk is not None)
        q = torch.round(x2 / den).clamp_(-zero, zero - 1)
    else:
        zero = 0
        q = torch.round((x2 / d) * float(2**bits - 1)).clamp_(0, 2**bits - 1)
    nnz = int(torch.count_nonzero(q))
    if signed:
        q += zero
    codes = q.to(torch.uint8 if bits <= 8 else torch.int32).reshape(-1)
    return FixpointCodes(codes, s16, zero, nnz, signed, g)


def fixpoint_dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    signed: bool,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    idx: torch.Tensor | None = None,
    granularity: str | bool = "channel",
) -> torch.Tensor:
    """Values from wire codes (all ``n`` of them, or the ones at ``idx``; the rest are 0)."""
    g = granularity_name(granularity)
    cd = torch.float64 if dtype == torch.float64 else torch.float32
    n = math.prod(shape)
    H = scales.numel()
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    s = scales.to(cd)
    # x̂ = q 2^(1-b) s = (c - z) * (s 2^(1-b))  (both products exact, one rounding)
    factor = s * 2.0 ** (1 - bits) if signed else s
    v = codes.to(cd)
    if signed:
        v.sub_(2 ** (bits - 1))
    if idx is None:
        v = v.reshape(H, -1) if g == "token" else v.reshape(-1, H)
        f = _scale_column(factor, g)
        vals = v.mul_(f) if signed else v.mul_(f).div_(float(2**bits - 1))
        return vals.to(dtype).reshape(shape)
    if H == 1:
        sc = factor.expand(idx.numel())
    else:  # a token's scale covers n / H consecutive elements; a channel's, every H-th
        sc = factor[idx // (n // H)] if g == "token" else factor[idx % H]
    vals = v.mul_(sc) if signed else v.mul_(sc).div_(float(2**bits - 1))
    out = torch.zeros(n, dtype=cd)
    out[idx] = vals
    return out.to(dtype).reshape(shape)


class QChannelCodec(Codec):
    """Absmax fixpoint quantiser + sparse encoding (``"qchannel:bits=B"``).

    The SparQ compressor C (AQ-SGD ``fixpoint`` quantiser, deterministic, round
    half to even).  Options: ``bits`` (1..16, default 4), ``signed`` (true,
    false or auto: per message, unsigned iff no entry is negative; default
    true), ``granularity=channel|tensor|token`` (default channel, AQ-SGD's),
    ``format=auto|dense|bitmap|coo``, ``index=packed|int32``.  See the module
    docstring for the formulas.

    Size (bytes), ``n`` elements, ``k = nnz(q)``, ``H`` scales (:func:`channels_of`:
    the last dimension, the rows, or 1), ``w`` index bits:
    ``h0 + 2H + min(ceil(n*b/8), ceil(n/8) + ceil(k*b/8), ceil(k*w/8) + ceil(k*b/8))``
    with ``h0 = 21 + 4*ndim`` (one term when a format is forced).
    Floor: ``log2(n+1) + log2 C(n,k) + k*log2(2**b-1) + 16H`` bits.
    Deterministic, biased; no contraction bound is claimed (every coordinate
    satisfies ``|x - x̂| <= |x|``, so ``‖C(x)-x‖ <= ‖x‖``, strictly for b >= 2).
    Lossless on inputs that are fixed points of the quantiser.
    """

    family = FAMILY_QCHANNEL
    name = "qchannel"
    unbiased = False
    contraction = None

    def __init__(
        self,
        bits: int = 4,
        signed: bool | None = True,
        granularity: str = "channel",
        fmt: int | None = None,
        int32: bool = False,
    ):
        if not 1 <= bits <= 16:
            raise CodecError(f"qchannel: bits={bits} out of range 1..16")
        self.bits = bits
        self.signed = signed
        self.granularity = granularity_name(granularity)
        self.fmt = fmt
        self.int32 = int32

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> QChannelCodec:
        bits = _parse_bits("qchannel", opts, 4, 1, 16)
        sv = opts.pop("signed", "true")
        signed = None if sv.strip().lower() == "auto" else parse_bool("signed", sv)
        gran = opts.pop("granularity", "channel").strip().lower()
        fmt, int32 = parse_format_options(opts, "qchannel")
        return cls(bits, signed, gran, fmt, int32)

    def spec(self) -> str:
        parts = [f"bits={self.bits}"]
        if self.signed is None:
            parts.append("signed=auto")
        elif not self.signed:
            parts.append("signed=false")
        if self.granularity != "channel":
            parts.append(f"granularity={self.granularity}")
        return "qchannel:" + ",".join(parts + format_options_spec(self.fmt, self.int32))

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        return check_input(x, FLOAT_DTYPES, "qchannel")  # NaN / inf are caught by the scales

    def quantize(self, x: torch.Tensor) -> FixpointCodes:
        """Codes and scales of ``x`` (NaN / inf / fp16-overflowing channels: CodecError)."""
        x = check_input(x, FLOAT_DTYPES, "qchannel")
        signed = resolve_signed(x, self.signed)
        return fixpoint_quantize(x, self.bits, signed, self.granularity)

    def dequantize(
        self, fc: FixpointCodes, shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        return fixpoint_dequantize(fc.codes, fc.scales, self.bits, fc.signed, shape, dtype, None, fc.granularity)

    def _layout(self, n: int, k: int) -> tuple[int, int]:
        iw = index_width(n, self.int32)
        return iw, choose_format(n, k, self.bits, iw, self.fmt)

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        fc = self.quantize(x)
        n = x.numel()
        iw, fmt = self._layout(n, fc.nnz)
        return (
            header_nbytes(x.dim(), self.family)
            + 2 * fc.scales.numel()
            + body_nbytes(n, fc.nnz, self.bits, fmt, iw)
        )

    def floor_bits(self, x: torch.Tensor) -> float:
        x = self._check(x)
        fc = self.quantize(x)
        n = x.numel()
        return (
            math.log2(n + 1)
            + log2_binom(n, fc.nnz)
            + fc.nnz * math.log2(2.0**self.bits - 1)
            + 16 * fc.scales.numel()
        )

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        try:
            fc = self.quantize(x)
        except CodecError:
            return False
        return bool(torch.equal(self.dequantize(fc, tuple(x.shape), x.dtype), x))

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        n, b = x.numel(), self.bits
        H = channels_of(tuple(x.shape), self.granularity)
        h0 = header_nbytes(x.dim(), self.family)
        # The dense layout's payload, its codes packed while they are computed (one pass
        # fewer); kept when the dense format is the cheapest, as it is for most 4-bit tensors.
        dense = None
        if b == 4 and n and self.fmt in (None, FMT_DENSE):
            dense = torch.empty(h0 + 2 * H + packed_nbytes(n, b), dtype=torch.uint8)
        signed = resolve_signed(x, self.signed)
        fc = fixpoint_quantize(x, b, signed, self.granularity,
                               packed=None if dense is None else dense[h0 + 2 * H :])
        k = fc.nnz
        iw, fmt = self._layout(n, k)
        flags = (FLAG_INDEX32 if self.int32 else 0) | (FLAG_SIGNED if fc.signed else 0)
        flags |= _FLAG_OF[self.granularity]
        header = build_header(
            self.family, x.dtype, tuple(x.shape), struct.pack("<BBBI", b, flags, fmt, k)
        )
        if dense is not None and fc.packed and fmt == FMT_DENSE:
            dense[:h0] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
            dense[h0 : h0 + 2 * H].copy_(raw_bytes(fc.scales))
            return Payload(dense)
        pos_n, val_n = section_nbytes(n, k, b, fmt, iw)
        out, body = make_payload(header, 2 * H + pos_n + val_n)
        body[: 2 * H].copy_(raw_bytes(fc.scales))
        if fmt == FMT_DENSE:
            pack_bits(fc.codes, b, body[2 * H + pos_n :])
        else:
            mask = fc.codes != fc.zero_code
            encode_positions(fmt, n, iw, mask, None, body[2 * H : 2 * H + pos_n])
            pack_bits(masked_select(fc.codes, mask), b, body[2 * H + pos_n :])
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        b, flags, fmt, k = struct.unpack("<BBBI", hdr.params)
        if not 1 <= b <= 16:
            raise CodecError(f"corrupted header: qchannel bits={b}")
        if flags & ~(FLAG_INDEX32 | FLAG_SIGNED | FLAG_TENSOR | FLAG_TOKEN):
            raise CodecError(f"corrupted header: unknown flag bits {flags:#x}")
        if flags & FLAG_TENSOR and flags & FLAG_TOKEN:
            raise CodecError("corrupted header: qchannel granularity both tensor and token")
        gran = "tensor" if flags & FLAG_TENSOR else "token" if flags & FLAG_TOKEN else "channel"
        if hdr.dtype not in FLOAT_DTYPES:
            raise CodecError(f"corrupted header: qchannel payload for dtype {hdr.dtype}")
        n = hdr.numel
        if k > n:
            raise CodecError(f"corrupted header: {k} nonzeros for {n} elements")
        check_format_code(fmt)
        pos_n, val_n = section_nbytes(n, k, b, fmt, index_width(n, bool(flags & FLAG_INDEX32)))
        H = channels_of(hdr.shape, gran)
        check_body_length(data, hdr, 2 * H + pos_n + val_n)
        body = data[hdr.nbytes :]
        scales = from_raw_bytes(body[: 2 * H], torch.float16, H)
        if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
            raise CodecError("corrupted body: qchannel scale is negative or not finite")
        iw = index_width(n, bool(flags & FLAG_INDEX32))
        idx = decode_positions(fmt, n, k, iw, body[2 * H : 2 * H + pos_n])
        count = n if idx is None else k
        codes = unpack_bits(body[2 * H + pos_n :], b, count)
        return fixpoint_dequantize(
            codes, scales, b, bool(flags & FLAG_SIGNED), hdr.shape, hdr.dtype, idx, gran
        )
