"""Natural compression (Horváth et al.), ``"natural"``: unbiased rounding to powers of two.

Every entry ``t != 0`` becomes a signed power of two that brackets it: with
``a = floor(log2|t|)`` the output is ``sign(t) 2^a`` with probability
``(2^(a+1) - |t|) / 2^a`` and ``sign(t) 2^(a+1)`` otherwise, so ``E[C(t)] = t``
and ``Var = (|t| - 2^a)(2^(a+1) - |t|) <= |t|^2 / 8`` (the maximum ratio is at
``|t| = 4/3 2^a``).  Hence unbiased with ``ω = sqrt(1/8)``.

Payload body: one code per entry, ``sign << E | e`` packed at ``1 + E`` bits, where
``e = 0`` means zero and ``e = a - emin + 1`` otherwise, and ``E`` is the
exponent width of the input dtype: 1 + 8 = 9 bits for float32 / bfloat16,
1 + 5 = 6 bits for float16 (the paper's 37.5 %), 1 + 11 = 12 for float64.
Size (bytes): ``h0 + ceil(n (1 + E) / 8)`` with ``h0 = 15 + 4*ndim``.

Range edges (documented, not hidden): powers of two below the smallest normal
``2^emin`` are not representable, so a subnormal ``|t|`` rounds to ``0`` or
``2^emin`` with the unbiased probabilities (still unbiased, but the ``1/8``
bound holds only for entries with ``|t| >= 2^emin``); ``|t| >= 2^emax``
maps to ``2^emax`` (no overflow to infinity).  The declared contraction
therefore covers inputs without subnormal entries (:meth:`contraction_bound`).
"""

from __future__ import annotations

import math
import struct

import torch

from . import _core
from ._core import FAMILY_NATURAL, Codec, CodecError, Payload
from .bitpack import pack_bits, packed_nbytes, unpack_bits


def exponent_range(dtype: torch.dtype) -> tuple[int, int]:
    """``(emin, emax)``: the smallest and largest normal powers of two of ``dtype``."""
    fi = torch.finfo(dtype)
    return int(math.log2(fi.tiny)), int(math.floor(math.log2(fi.max)))


def code_width(dtype: torch.dtype) -> int:
    """Bits per entry: a sign bit plus an exponent code for zero and ``emin..emax``."""
    emin, emax = exponent_range(dtype)
    return 1 + math.ceil(math.log2(emax - emin + 2))


class NaturalCodec(Codec):
    """Natural compression (``"natural"``): unbiased rounding to signed powers of two."""

    family = FAMILY_NATURAL
    name = "natural"
    unbiased = True
    stochastic = True
    contraction = math.sqrt(1 / 8)

    def spec(self) -> str:
        return "natural"

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        x = _core.check_input(x, _core.FLOAT_DTYPES, self.name)
        _core.check_finite(x, self.name)
        return x

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        """Signed powers of two in the normal range (and zeros) round-trip exactly."""
        x = self._check(x)
        emin, emax = exponent_range(x.dtype)
        a = x[x != 0].abs().double()
        if a.numel() == 0:
            return True
        m, e = torch.frexp(a)
        return bool(((m == 0.5) & (e - 1 >= emin) & (e - 1 <= emax)).all())

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        return self.header_nbytes(x) + packed_nbytes(x.numel(), code_width(x.dtype))

    def floor_bits(self, x: torch.Tensor) -> float:
        """Sign and exponent of every entry: ``n (1 + E)`` bits (no entropy coding)."""
        x = self._check(x)
        return float(x.numel() * code_width(x.dtype))

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        emin, emax = exponent_range(x.dtype)
        ebits = code_width(x.dtype) - 1
        flat = x.reshape(-1).double()  # float64 holds every power of two of the narrower dtypes
        mag = flat.abs()
        nz = mag > 0
        _, e = torch.frexp(torch.where(nz, mag, torch.ones_like(mag)))
        a = (e - 1).clamp(min=emin)  # floor(log2|t|); subnormals share the bottom bracket
        width = torch.ldexp(torch.ones_like(mag), a)  # high - low, also for [0, 2^emin]
        sub = mag < width  # subnormal: the bracket is [0, 2^emin]
        low = torch.where(sub, torch.zeros_like(width), width)
        up_prob = (mag - low) / width
        u = torch.rand(flat.shape, generator=generator, dtype=torch.float64)
        up = u < up_prob
        # exponent of the chosen power; "low == 0" (subnormal rounded down) is the zero code
        expo = torch.where(up, torch.where(sub, a, a + 1), a).clamp(max=emax)
        zero = ~nz | (~up & (low == 0))
        ecode = torch.where(zero, torch.zeros_like(expo), expo - emin + 1)
        sign = (flat < 0) & ~zero
        codes = (sign.long() << ebits) | ecode.long()
        header = _core.build_header(self.family, x.dtype, tuple(x.shape), struct.pack("<B", ebits + 1))
        out, body = _core.make_payload(header, packed_nbytes(x.numel(), ebits + 1))
        pack_bits(codes, ebits + 1, out=body)
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: _core.Header) -> torch.Tensor:
        if hdr.dtype not in _core.FLOAT_DTYPES:
            raise CodecError("corrupted header: natural compression carries floating-point values")
        width = code_width(hdr.dtype)
        if hdr.params[0] != width:
            raise CodecError(f"corrupted header: code width {hdr.params[0]} for {hdr.dtype} (expected {width})")
        n = hdr.numel
        _core.check_body_length(data, hdr, packed_nbytes(n, width))
        codes = unpack_bits(data[hdr.nbytes:], width, n).long()
        emin, emax = exponent_range(hdr.dtype)
        ecode = codes & ((1 << (width - 1)) - 1)
        if bool((ecode > emax - emin + 1).any()):
            raise CodecError("corrupted body: exponent code out of range")
        sign = codes >> (width - 1)
        mag = torch.ldexp(torch.ones(n, dtype=torch.float64), ecode + emin - 1)
        vals = torch.where(ecode == 0, torch.zeros_like(mag), mag) * (1 - 2 * sign).double()
        return vals.to(hdr.dtype).reshape(hdr.shape)

