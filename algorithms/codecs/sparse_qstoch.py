"""``sparse-qstoch:bits=B``: the nonzeros of a tensor, each as (index, unbiased ``B``-bit code).

The message of the double-quantisation paper's sparsified gradient (spec
seed-double-quant §2.4, eq. 4 then the quantiser Q): the encoder keeps the
positions of the nonzero entries and stochastically rounds their values on
the ``qstoch`` grid ``δ = max|x_nz| / (2**(B-1) - 1)`` (:func:`qstoch_law`),
one float64 uniform per survivor from the caller's generator.  Zeros stay
exactly zero.

Layout: the shared header (parameters: ``B | layout << 6`` u8, ``δ`` float32,
``nnz`` u32), then the positions and the codes, each section MSB-first
(:mod:`.bitpack`), in the cheapest of four layouts (ties: the first listed):

* index list (layout 0): the ``nnz`` flat indices (``w = max(1, ceil(log2 n))``
  bits each, strictly increasing), then the ``nnz`` offset-binary codes
  ``k + 2**(B-1)`` (``B`` bits each, ``k in [-L, L]``);
* bitmap (layout 1): one bit per entry (``nnz`` set), then the ``nnz`` codes;
* dense (layout 2): ``n`` codes, the zeros as the code of ``k = 0``;
* Elias–Fano (layout 3): the positions as ``nnz`` low fields of ``l =
  floor(log2(n/nnz))`` bits and an upper stream of ``nnz + ((n-1) >> l)`` bits
  (:mod:`.elias_fano`), then the ``nnz`` codes.

Size (bytes): ``h0 + min(ceil(nnz*w/8), ceil(n/8), ceil(nnz*l/8) + ceil((nnz + ((n-1) >> l))/8))
+ ceil(nnz*B/8)``, or ``h0 + ceil(n*B/8)`` when that is smaller, ``h0 = 23 + 4*ndim``;
the paper counts ``32 + nnz*(w + B)`` bits (δ, then (index, code) pairs: the nnz
field is ours, byte padding would make the count ambiguous without it).
Floor: ``32 + log2 C(n, nnz) + nnz*log2(2**B - 1)`` bits.  Elias–Fano keeps the
positions within about two bits per survivor of ``log2 C(n, nnz)`` at every
density, where the index list and the bitmap each come near it at one end only.
Unbiased; ``E‖Q(x)−x‖² = δ²Σ_nz f(1−f)``, within qstoch's bound for ``n``
coordinates.  Lossless on ``x`` whose nonzeros sit exactly on their grid.
``δ`` must be a normal float32 (0 when nothing survives): NaN, infinity and
overflowing scales are refused when encoding and when decoding.
"""

from __future__ import annotations

import math
import struct

import numpy as np
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
from ._rng import pool_workers, run_blocks
from .bitpack import pack_bits, unpack_bits
from .quant import FLT32_MAX, FLT32_MIN_NORMAL, QSTOCH_BITS, _QStochBits, qstoch_law
from .sparse_body import (
    FMT_BITMAP,
    FMT_COO,
    FMT_DENSE,
    FMT_EF,
    decode_positions,
    encode_positions,
    index_width,
    section_nbytes,
)

PARAMS = struct.Struct("<BfI")  # B | layout << 6, δ, nnz
LAYOUT_INDEX, LAYOUT_BITMAP, LAYOUT_DENSE, LAYOUT_EF = 0, 1, 2, 3
LAYOUTS = (LAYOUT_INDEX, LAYOUT_BITMAP, LAYOUT_DENSE, LAYOUT_EF)
LAYOUT_SHIFT = 6
PARALLEL_MIN_ELEMENTS = 1 << 16  # below this the pool's hand-off costs more than it saves


#: Each layout's positions, as the sparse bodies' formats write them.
_POSITIONS = {LAYOUT_INDEX: FMT_COO, LAYOUT_BITMAP: FMT_BITMAP, LAYOUT_DENSE: FMT_DENSE, LAYOUT_EF: FMT_EF}


def _sections(n: int, nnz: int, bits: int, layout: int) -> tuple[int, int]:
    """(positions bytes, codes bytes) of a body in ``layout``."""
    return section_nbytes(n, nnz, bits, _POSITIONS[layout], index_width(n))


def choose_layout(n: int, nnz: int, bits: int) -> int:
    """The cheapest layout for ``nnz`` survivors among ``n`` (ties: the order of ``LAYOUTS``)."""
    costs = [sum(_sections(n, nnz, bits, lay)) for lay in LAYOUTS]
    return costs.index(min(costs))


def sparse_qstoch_nbytes(n: int, nnz: int, bits: int, ndim: int = 1) -> int:
    """Closed form of the payload of ``nnz`` survivors among ``n`` entries (cheapest layout)."""
    body = sum(_sections(n, nnz, bits, choose_layout(n, nnz, bits)))
    return header_nbytes(ndim, FAMILY_SPARSE_QSTOCH) + body


def _scale_ok(delta: float, nnz: int) -> bool:
    return delta == 0.0 if nnz == 0 else FLT32_MIN_NORMAL <= delta <= FLT32_MAX


def _nonzero_positions(a: np.ndarray) -> torch.Tensor:
    """``torch.nonzero`` of a flat array (-0.0 counts as zero) as numpy's compare and
    flatnonzero, in blocks on the codec pool: 6.9 / 3.7 ms against 10.4 / 5.3 ms on 4M float32
    at 1 / 2 threads (2-core VM)."""
    workers = pool_workers() if a.size >= PARALLEL_MIN_ELEMENTS else 1
    per = -(-a.size // workers)
    parts = run_blocks(lambda j: np.flatnonzero(a[j * per: (j + 1) * per] != 0) + j * per, workers)
    return torch.from_numpy(parts[0] if workers == 1 else np.concatenate(parts))


def _values(codes: torch.Tensor, bits: int, delta: float, dtype: torch.dtype) -> torch.Tensor:
    """``(code - 2**(B-1)) * δ`` in float64, then cast to ``dtype``."""
    return ((codes - 2 ** (bits - 1)).to(torch.float64) * delta).to(dtype)


class SparseQStochCodec(_QStochBits):
    """Sparse (index, ``B``-bit code) pairs of the nonzeros (``"sparse-qstoch:bits=B"``), ``2 <= B <= 16``."""

    family = FAMILY_SPARSE_QSTOCH
    name = "sparse-qstoch"

    def _survivors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.detach().reshape(-1)
        if flat.device.type == "cpu" and flat.dtype != torch.bfloat16:
            idx = _nonzero_positions(flat.numpy())
        else:  # numpy has no bfloat16
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
        return self._encode(x, generator, None)

    def _encode(self, x: torch.Tensor, generator: torch.Generator | None, layout: int | None) -> Payload:
        """``layout`` forces one (checks compare them); None picks the cheapest."""
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
        if layout is None:
            layout = choose_layout(n, nnz, b)
        params = PARAMS.pack(b | layout << LAYOUT_SHIFT, delta, nnz)
        header = build_header(self.family, x.dtype, tuple(x.shape), params)
        ib, cb = _sections(n, nnz, b, layout)
        out, body = make_payload(header, ib + cb)
        if layout != LAYOUT_DENSE:
            encode_positions(_POSITIONS[layout], n, index_width(n), None, idx, body[:ib])
        else:
            full = torch.full((n,), 2 ** (b - 1), dtype=torch.int64)
            full[idx] = codes
            codes = full
        pack_bits(codes, b, body[ib:])
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        raw_b, delta, nnz = PARAMS.unpack(hdr.params)
        b, layout = raw_b & 0x1F, raw_b >> LAYOUT_SHIFT
        n = hdr.numel
        if raw_b & 0x20:
            raise CodecError(f"corrupted header: sparse-qstoch bits byte {raw_b:#x}")
        if not QSTOCH_BITS[0] <= b <= QSTOCH_BITS[1]:
            raise CodecError(f"corrupted header: sparse-qstoch bits={b}")
        if hdr.dtype not in FLOAT_DTYPES:
            raise CodecError(f"corrupted header: sparse-qstoch payload for dtype {hdr.dtype}")
        if nnz > n:
            raise CodecError(f"corrupted header: sparse-qstoch nnz={nnz} > {n} entries")
        if not _scale_ok(delta, nnz):
            raise CodecError(f"corrupted header: sparse-qstoch scale {delta!r} with nnz={nnz}")
        ib, cb = _sections(n, nnz, b, layout)
        check_body_length(data, hdr, ib + cb)
        body = data[hdr.nbytes :]
        if layout == LAYOUT_DENSE:
            codes = unpack_bits(body, b, n).to(torch.int64)
            if n and int(codes.min()) == 0:
                raise CodecError(f"corrupted body: sparse-qstoch code 0 is outside [-L, L] for bits={b}")
            return _values(codes, b, delta, hdr.dtype).reshape(hdr.shape)
        idx = decode_positions(_POSITIONS[layout], n, nnz, index_width(n), body[:ib])
        codes = unpack_bits(body[ib:], b, nnz).to(torch.int64)
        if nnz and int(codes.min()) == 0:
            raise CodecError(f"corrupted body: sparse-qstoch code 0 is outside [-L, L] for bits={b}")
        out = torch.zeros(n, dtype=hdr.dtype)
        out[idx] = _values(codes, b, delta, hdr.dtype)
        return out.reshape(hdr.shape)
