"""What crosses a SparQ split, and the closed form of its size.

Per evaluation (one unperturbed or perturbed forward) a split link carries
two messages: the FFN activation ``C(a)`` (tag ``act``: the absmax fixpoint
quantiser, one scale per tensor by default (see :data:`GRANULARITY`), + sparse body, or with ``bits=None`` the lossless sparse
encoding of the raw values; the quantiser's grid follows the activation's
sign, see :data:`SIGNED_MODES`) and the residual stream ``r`` (tag ``residual``:
dense, fp16 by default for quantised runs, raw for identity runs; the block's
``r + fc2(a)`` needs it, seed-sparq §7 A2).  Once per iteration the first
stage sends the labels to the last (tag ``labels``, the ``ids`` codec: 1, 2 or
4 bytes per token, the narrowest unsigned width holding the vocabulary),
unless ``labels=local``.  Backward, the last stage
broadcasts the ``P`` float32 scalars (tag ``scalars``).  Masks and positions
are recomputed on every stage from the sequence length (batches are never
padded), so they never cross.

Each message kind crosses through its own
:class:`~algorithms.codecs.channel.Channel` (the compressed pipelines' channel
abstraction).  The closed forms below are written from the payload layouts in
``algorithms.codecs`` (header ``h0``, scales, positions, packed values) and
checked against the Comm meter's count of the real payloads.
"""

from __future__ import annotations

import math

import torch

from algorithms.codecs import Codec, fixpoint_quantize, header_nbytes, make_codec, resolve_signed
from algorithms.codecs._core import FAMILY_DENSE, FAMILY_IDS, FAMILY_QCHANNEL
from algorithms.codecs.ids import id_nbytes
from algorithms.codecs.quant import GRANULARITIES as QUANT_GRANULARITIES

from .params import FORMATS, GRANULARITY, SIGNED_MODES  # noqa: F401  (re-exported)

# What one activation scale covers.  SparQ does not say (seed-sparq §7 A1); the default is
# the granularity that reproduces its Fig. 2 / §2.4 on real weights ("nearly all GELU-based
# activations fall under 5%" at 4 bits, SwiGLU "below 20%"): one absmax scale per tensor.
# `commbench reproduce sparq-activations` measures every candidate on all-MiniLM-L6-v2 (GELU)
# and Gemma-3-270M (GeGLU): per tensor keeps most layers' 4-bit codes under those limits,
# per token and per channel (AQ-SGD's) do not, and clipped scales (a percentile or k rms
# of |x|) only add non-zeros.  No candidate also has Table 1's bytes growing in proportion
# to the bits; that experiment's bytes-per-bit table shows why.
GRANULARITIES = QUANT_GRANULARITIES  # what SparQParams.granularity accepts: the codec's
# The activation quantiser's grid.  auto (the default): per message, unsigned levels
# when the activation has no negative entry, signed otherwise.  A split sits right
# after the FFN activation (SparQ §4), so with ReLU (OPT) every message is
# non-negative and gets all 2**b levels on [0, s]; the signed grid would spend half
# of them below zero and at 1 bit round every ReLU output to 0 (nothing sent).
# GELU / SwiGLU outputs have negative entries and keep the signed grid.  Deciding
# per message from the tensor itself needs no table of model families, and the
# choice travels in the qchannel header's signed flag, so the receiver needs no
# side information.  true / false force one grid (false clips negatives to 0).


def signed_option(signed: str | bool | None) -> bool | None:
    """``"auto"`` (or None) -> None (per message); ``"true"`` / ``"false"`` (or a bool) -> that grid."""
    if signed is None or isinstance(signed, bool):
        return signed
    if signed not in SIGNED_MODES:
        raise ValueError(f"signed must be one of {', '.join(SIGNED_MODES)}, got {signed!r}")
    return None if signed == "auto" else signed == "true"


def act_codec(bits: int | None, signed: str | bool | None = "auto", fmt: str = "auto",
              granularity: str = GRANULARITY) -> Codec:
    if bits is None:
        return make_codec(f"sparse:format={fmt}")
    s = signed_option(signed)
    return make_codec(f"qchannel:bits={bits},signed={'auto' if s is None else str(s).lower()},"
                      f"granularity={granularity},format={fmt}")


def residual_codec(spec: str, bits: int | None, half: str = "fp16") -> Codec:
    """``auto``: raw when the activations are raw, else ``half``, the model family's 16-bit
    float (:attr:`harness.models.families.FamilySpec.half_dtype`)."""
    if spec == "auto":
        spec = "identity" if bits is None else half
    return make_codec(spec)


def label_codec(vocab_size: int) -> Codec:
    """Token ids of the vocabulary, each in the narrowest unsigned width (``algorithms.codecs.ids``)."""
    return make_codec(f"ids:vocab={vocab_size}")


# --------------------------------------------------------------------------- closed forms
def _packed(count: int, bits: int) -> int:
    return math.ceil(count * bits / 8)


def sparse_body_nbytes(n: int, k: int, vbits: int, fmt: str = "auto") -> int:
    """Positions + values of ``k`` of ``n`` values of ``vbits`` bits (cheapest format for auto)."""
    w = max(1, (n - 1).bit_length())  # packed index width, ceil(log2 n)
    sizes = {"dense": _packed(n, vbits),
             "bitmap": _packed(n, 1) + _packed(k, vbits),
             "coo": _packed(k, w) + _packed(k, vbits)}
    return min(sizes.values()) if fmt == "auto" else sizes[fmt]


def dense_nbytes(shape: tuple[int, ...], transmit_itemsize: int) -> int:
    """Dense codec: ``h0 = 15 + 4 ndim`` (body CRC on) plus the values."""
    return header_nbytes(len(shape), FAMILY_DENSE) + math.prod(shape) * transmit_itemsize


def labels_nbytes(shape: tuple[int, ...], vocab_size: int) -> int:
    """ids codec: ``h0 = 18 + 4 ndim`` (``V - 1`` as uint32) plus 1, 2 or 4 bytes per token."""
    return header_nbytes(len(shape), FAMILY_IDS) + math.prod(shape) * id_nbytes(vocab_size)


def scale_count(shape: tuple[int, ...], granularity: str = GRANULARITY) -> int:
    """``H`` fp16 scales: 1 per tensor, one per token (row), one per channel (last dimension)."""
    if granularity == "tensor" or len(shape) <= 1:
        return 1
    return shape[-1] if granularity == "channel" else math.prod(shape[:-1])


def act_nbytes(shape: tuple[int, ...], k: int, bits: int | None, itemsize: int, fmt: str = "auto",
               granularity: str = GRANULARITY) -> int:
    """qchannel: ``h0 + 2H + body(n, k, b)``; identity (sparse, raw values): ``h0 + body(n, k, 8 itemsize)``."""
    h0 = header_nbytes(len(shape), FAMILY_QCHANNEL)  # 21 + 4 ndim; sparse's is the same size
    n = math.prod(shape)
    if bits is None:
        return h0 + sparse_body_nbytes(n, k, 8 * itemsize, fmt)
    return h0 + 2 * scale_count(shape, granularity) + sparse_body_nbytes(n, k, bits, fmt)


def act_nnz(a: torch.Tensor, bits: int | None, signed: str | bool | None = "auto",
            granularity: str = GRANULARITY) -> int:
    """What the act message's body counts as nonzero: quantised codes, or nonzero bit patterns."""
    if bits is None:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return int(torch.count_nonzero(a.detach().reshape(-1).view(ints)))
    x = a.detach().cpu()
    return fixpoint_quantize(x, bits, resolve_signed(x, signed_option(signed)), granularity).nnz


def residual_nbytes(shape: tuple[int, ...], codec: Codec, run_itemsize: int) -> int:
    if getattr(codec, "name", "") not in ("identity", "fp32", "fp16", "bf16", "fp64"):
        raise ValueError(f"no closed form for residual codec {codec.spec()}")
    send = codec.transmit_dtype  # a DenseCodec's; None: the run dtype (identity)
    return dense_nbytes(shape, run_itemsize if send is None else torch.empty((), dtype=send).element_size())


def scalars_nbytes(P: int, world_size: int) -> int:
    """Backward: one float32 per perturbation, broadcast to the M-1 other stages."""
    return 4 * P * (world_size - 1)
