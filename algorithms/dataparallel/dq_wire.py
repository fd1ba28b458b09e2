"""The parameter server's message layouts: real payload bytes, with the paper's bit counts beside.

Every message is a 1-D uint8 payload; :class:`Msg` keeps the payload together
with the number of bits the paper charges for it (spec seed-double-quant §1.3, §2.5):

=============  =========================================  ==========================================
kind           bytes actually sent                        paper bits
=============  =========================================  ==========================================
flag           1 byte (``x_D = x̃``: the worker has it)    1
dense b-bit    ``qstoch:bits=b`` codec payload            ``32 + b·d``
               (``15 + 4 + ⌈b·d/8⌉`` for a 1-D vector)
sparse b-bit   ``sparse-qstoch:bits=b`` codec payload     ``32 + nnz·(w + b)``, ``w = ⌈log₂ d⌉``
               (``27 + ⌈nnz·b/8⌉`` + the cheapest
               positions: ``⌈nnz·w/8⌉``, ``⌈d/8⌉``
               or Elias–Fano's, or all ``⌈d·b/8⌉``
               codes, 1-D)
full           ``fp32`` / ``fp64`` codec payload           ``32·d``
=============  =========================================  ==========================================

The sparse message is the codec ``sparse-qstoch`` (``algorithms/codecs/sparse_qstoch.py``):
the shared CRC-protected header carries δ (float32), nnz, b and the layout, then
the positions (nnz ``w``-bit indices, a ``d``-bit bitmap or Elias–Fano's low fields and
unary high parts, the cheapest) and the nnz offset-binary codes (``b`` bits each),
MSB-first, or all ``d`` codes when that is cheaper.  The nnz field is needed because byte padding would make the count
ambiguous; the paper's count leaves it and the header out, and we report both.

The unbiased quantiser is the codec ``qstoch`` (``algorithms/codecs/quant.py``);
its exact law (:func:`qstoch_law`) gives the exact ``E‖Q(x) − x‖²`` used to
check the precision constraint (2) without sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from algorithms.codecs import CodecError, Payload, make_codec, qstoch_law
from algorithms.codecs import decode as codec_decode
from algorithms.codecs._core import parse_header
from algorithms.codecs.sparse_qstoch import PARAMS as SPARSE_PARAMS
from algorithms.codecs.sparse_qstoch import SparseQStochCodec, sparse_qstoch_nbytes

FULL = 32  # "bits" value meaning full precision (no quantisation)
FLAG_BYTE = torch.tensor([1], dtype=torch.uint8)


@dataclass(frozen=True)
class Msg:
    data: torch.Tensor  # the payload that is sent (uint8, 1-D)
    paper_bits: int
    kind: str  # flag | dense | sparse | full
    nnz: int = -1  # sparse messages only

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())


def check_bits(bits: int, what: str) -> None:
    if bits != FULL and not 2 <= bits <= 16:
        raise ValueError(f"{what} must be 2..16 bits (or {FULL} = full precision), got {bits}")


def index_width(d: int) -> int:
    return max(1, math.ceil(math.log2(d)))


# ---- closed forms ------------------------------------------------------------
def dense_paper_bits(d: int, b: int) -> int:
    return 32 * d if b == FULL else 32 + b * d


def sparse_paper_bits(d: int, nnz: int, b: int) -> int:
    return 32 + nnz * (index_width(d) + b)


def sparse_nbytes(d: int, nnz: int, b: int) -> int:
    """The codec header of a 1-D vector (``23 + 4``, CRCs included), then the cheapest of
    ``⌈nnz·w/8⌉ + ⌈nnz·b/8⌉`` (index list), ``⌈d/8⌉ + ⌈nnz·b/8⌉`` (bitmap), ``⌈d·b/8⌉`` (all codes)
    and Elias–Fano positions before the codes (``algorithms/codecs/elias_fano.py``)."""
    return sparse_qstoch_nbytes(d, nnz, b)


# ---- encoders ----------------------------------------------------------------
def flag() -> Msg:
    return Msg(FLAG_BYTE.clone(), 1, "flag")


def full(x: torch.Tensor) -> Msg:
    """Full precision in the run's dtype (fp32 runs send float32, fp64 runs float64)."""
    codec = make_codec("fp64" if x.dtype == torch.float64 else "fp32")
    return Msg(codec.encode(x).data, 32 * x.numel(), "full")


def quantized(x: torch.Tensor, b: int, gen: torch.Generator) -> Msg:
    """Unbiased b-bit stochastic rounding with δ = ‖x‖∞/(2^{b−1}−1) (or full when b = 32)."""
    if b == FULL:
        return full(x)
    return Msg(make_codec(f"qstoch:bits={b}").encode(x, generator=gen).data, 32 + b * x.numel(), "dense")


def exact_mse(x: torch.Tensor, b: int) -> float:
    """E‖Q(x) − x‖² of the implemented b-bit quantiser, exactly (0 for full precision)."""
    return 0.0 if b == FULL else qstoch_law(x, b).mse(x)


def sparsify_law(alpha: torch.Tensor, phi: float) -> tuple[torch.Tensor, float, float]:
    """The sparsifier's exact law: keep probabilities p, survivor magnitude ‖α‖₁/φ_t, and φ_t.

    Budget φ_t = phi·‖α‖₁/‖α‖∞ (phi ∈ (0, 1]; phi = 1 is the paper's experiment),
    ``p_i = |α_i| φ_t / ‖α‖₁ = phi |α_i| / ‖α‖∞ ≤ 1``, so ``Σ p_i = φ_t = E[nnz]``.
    """
    if not 0 < phi <= 1:
        raise ValueError(f"phi must be in (0, 1] (a fraction of the budget ‖α‖₁/‖α‖∞), got {phi}")
    a = alpha.abs().to(torch.float64)
    amax = float(a.max()) if a.numel() else 0.0
    if amax == 0.0:
        return torch.zeros_like(a), 0.0, 0.0
    l1 = float(a.sum())
    phi_t = phi * l1 / amax
    return (a / amax * phi).clamp(max=1.0), l1 / phi_t, phi_t  # a/amax: the argmax gets exactly 1


def sparsify(alpha: torch.Tensor, phi: float, gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """Unbiased magnitude-proportional sparsification (eq. 4); returns (β, φ_t).

    Survivors are ``α_i / p_i = sign(α_i) ‖α‖₁/φ_t``, written as that constant so
    every survivor has exactly the same magnitude (which makes the following
    b-bit quantisation lossless, spec §2.4).
    """
    p, mag, phi_t = sparsify_law(alpha, phi)
    keep = torch.rand(alpha.shape, generator=gen, dtype=torch.float64) < p
    return torch.where(keep, torch.sign(alpha) * mag, torch.zeros_like(alpha)), phi_t


def sparse_quantized(alpha: torch.Tensor, b: int, phi: float, gen: torch.Generator) -> Msg:
    """Sparsify, then b-bit quantise the survivors; send (index, code) pairs."""
    beta, _ = sparsify(alpha, phi, gen)
    nnz = int(torch.count_nonzero(beta))
    data = SparseQStochCodec(b).encode(beta, generator=gen).data  # same scale as Q on the whole β
    return Msg(data, sparse_paper_bits(alpha.numel(), nnz, b), "sparse", nnz)


# ---- decoders ----------------------------------------------------------------
def is_flag(data: torch.Tensor) -> bool:
    return data.numel() == 1


def decode_dense(data: torch.Tensor, d: int) -> torch.Tensor:
    """A codec payload (qstoch, fp32 or fp64) back to its ``d``-vector (the receiver's
    expectation bounds what a peer's header may make it allocate)."""
    return codec_decode(Payload(data), max_numel=d)


def sparse_nnz(data: torch.Tensor, d: int) -> int:
    """The survivor count of a sparse message of a ``d``-vector, from its (CRC-checked) header."""
    hdr = parse_header(data, expect_family=SparseQStochCodec.family, max_numel=d)
    return SPARSE_PARAMS.unpack(hdr.params)[2]


def decode_sparse(data: torch.Tensor, d: int, dtype: torch.dtype) -> torch.Tensor:
    g = SparseQStochCodec().decode(Payload(data), max_numel=d)
    if tuple(g.shape) != (d,):
        raise CodecError(f"sparse gradient message of shape {tuple(g.shape)}, expected ({d},)")
    return g.to(dtype)
