"""``sparse-qstoch:bits=B``: the nonzeros of a tensor, each as (index, unbiased ``B``-bit code).

The message of the double-quantisation paper's sparsified gradient (spec
seed-double-quant §2.4, eq. 4 then the quantiser Q): the encoder keeps the
positions of the nonzero entries and stochastically rounds their values on
the ``qstoch`` grid ``δ = max|x_nz| / (2**(B-1) - 1)`` (:func:`qstoch_law`),
one float64 uniform per survivor from the caller's generator.  Zeros stay
exactly zero.

Layout: the shared header (parameters: ``B`` u8, ``δ`` float32, ``nnz`` u32),
then the ``nnz`` flat indices (``w = max(1, ceil(log2 n))`` bits each,
strictly increasing) and the ``nnz`` offset-binary codes ``k + 2**(B-1)``
(``B`` bits each, ``k in [-L, L]``), both MSB-first (:mod:`.bitpack`).

Size (bytes): ``h0 + ceil(nnz*w/8) + ceil(nnz*B/8)``, ``h0 = 23 + 4*ndim``; the
paper counts ``32 + nnz*(w + B)`` bits (δ, then (index, code) pairs: the nnz
field is ours, byte padding would make the count ambiguous without it).
Floor: ``32 + log2 C(n, nnz) + nnz*log2(2**B - 1)`` bits.
Unbiased; ``E‖Q(x)−x‖² = δ²Σ_nz f(1−f)``, within qstoch's bound for ``n``
coordinates.  Lossless on ``x`` whose nonzeros sit exactly on their grid.
``δ`` must be a normal float32 (0 when nothing survives): NaN, infinity and
overflowing scales are refused when encoding and when decoding.
"""

from __future__ import annotations

import math
import struct

import torch

from ._core import (
    FAMILY_SPARSE_QSTOCH,
    FLOAT_DTYPES,
    CodecError,
    Header,
    Payload,
    build_header,
    check_body_length,
    header_nbytes,
    log2_binom,
    make_payload,
)
from .bitpack import pack_bits, packed_nbytes, unpack_bits
from .quant import FLT32_MAX, FLT32_MIN_NORMAL, QSTOCH_BITS, _QStochBits, qstoch_law

PARAMS = struct.Struct("<BfI")  # B, δ, nnz


def index_width(n: int) -> int:
    """``max(1, ceil(log2 n))``: bits per flat index."""
    return max(1, (n - 1).bit_length())


def sparse_qstoch_nbytes(n: int, nnz: int, bits: int, ndim: int = 1) -> int:
    """Closed form of the payload of ``nnz`` survivors among ``n`` entries."""
    body = packed_nbytes(nnz, index_width(n)) + packed_nbytes(nnz, bits)
    return header_nbytes(ndim, FAMILY_SPARSE_QSTOCH) + body


def _scale_ok(delta: float, nnz: int) -> bool:
    return delta == 0.0 if nnz == 0 else FLT32_MIN_NORMAL <= delta <= FLT32_MAX


def _values(codes: torch.Tensor, bits: int, delta: float, dtype: torch.dtype) -> torch.Tensor:
    """``(code - 2**(B-1)) * δ`` in float64, then cast to ``dtype``."""
    return ((codes - 2 ** (bits - 1)).to(torch.float64) * delta).to(dtype)


class SparseQStochCodec(_QStochBits):
    """Sparse (index, ``B``-bit code) pairs of the nonzeros (``"sparse-qstoch:bits=B"``), ``2 <= B <= 16``."""

    family = FAMILY_SPARSE_QSTOCH
    name = "sparse-qstoch"

    def _survivors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1)
        idx = torch.nonzero(flat).reshape(-1)
        return idx, flat[idx]

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = self._check(x)
        return sparse_qstoch_nbytes(x.numel(), int(torch.count_nonzero(x)), self.bits, x.dim())

    def floor_bits(self, x: torch.Tensor) -> float:
        x = self._check(x)
        n, k = x.numel(), int(torch.count_nonzero(x))
        return 32.0 + log2_binom(n, k) + k * math.log2(2.0**self.bits - 1)

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = self._check(x)
        _, vals = self._survivors(x)
        if not vals.numel():
            return True
        law = self._certain_law(vals)
        if law is None:
            return False
        codes = law.k_lo + 2 ** (self.bits - 1)
        return bool(torch.equal(_values(codes, self.bits, law.delta, x.dtype), vals))

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        b, n = self.bits, x.numel()
        idx, vals = self._survivors(x)
        nnz = idx.numel()
        delta, codes = 0.0, torch.zeros(0, dtype=torch.int64)
        if nnz:
            law = qstoch_law(vals, b)
            up = torch.rand(nnz, generator=generator, dtype=torch.float64) < law.p
            codes, delta = law.k_lo + up.to(torch.int64) + 2 ** (b - 1), law.delta
        if not _scale_ok(delta, nnz):  # qstoch_law refuses these already; the wire must never carry one
            raise CodecError(f"sparse-qstoch: scale δ = {delta!r} is not a normal float32")
        header = build_header(self.family, x.dtype, tuple(x.shape), PARAMS.pack(b, delta, nnz))
        ib = packed_nbytes(nnz, index_width(n))
        out, body = make_payload(header, ib + packed_nbytes(nnz, b))
        pack_bits(idx, index_width(n), body[:ib])
        pack_bits(codes, b, body[ib:])
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        b, delta, nnz = PARAMS.unpack(hdr.params)
        n = hdr.numel
        if not QSTOCH_BITS[0] <= b <= QSTOCH_BITS[1]:
            raise CodecError(f"corrupted header: sparse-qstoch bits={b}")
        if hdr.dtype not in FLOAT_DTYPES:
            raise CodecError(f"corrupted header: sparse-qstoch payload for dtype {hdr.dtype}")
        if nnz > n:
            raise CodecError(f"corrupted header: sparse-qstoch nnz={nnz} > {n} entries")
        if not _scale_ok(delta, nnz):
            raise CodecError(f"corrupted header: sparse-qstoch scale {delta!r} with nnz={nnz}")
        w = index_width(n)
        ib = packed_nbytes(nnz, w)
        check_body_length(data, hdr, ib + packed_nbytes(nnz, b))
        body = data[hdr.nbytes :]
        idx = unpack_bits(body[:ib], w, nnz).to(torch.int64)
        codes = unpack_bits(body[ib:], b, nnz).to(torch.int64)
        if nnz and (int(idx.max()) >= n or bool((idx[1:] <= idx[:-1]).any())):
            raise CodecError("corrupted body: sparse-qstoch indices out of range or not increasing")
        if nnz and int(codes.min()) == 0:
            raise CodecError(f"corrupted body: sparse-qstoch code 0 is outside [-L, L] for bits={b}")
        out = torch.zeros(n, dtype=hdr.dtype)
        out[idx] = _values(codes, b, delta, hdr.dtype)
        return out.reshape(hdr.shape)
