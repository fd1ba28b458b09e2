"""Codecs: tensors to real bytes and back, with declared, tested properties.

``encode(x) -> Payload`` (a CPU uint8 tensor: a versioned, CRC-protected header
followed by the body) and ``decode(Payload) -> tensor``; what is sent is what
is counted, and decoding reads only the payload.  Build codecs from spec
strings with :func:`make_codec`:

=========================  ==================================================
spec                       codec
=========================  ==================================================
``identity``               raw bytes of the input dtype (bit-exact)
``fp32`` ``fp16``          cast to the transmit dtype and back
``bf16`` ``fp64``
``qstoch:bits=B``          unbiased stochastic quantiser (double quantisation)
``qchannel:bits=B``        per-channel absmax fixpoint quantiser + sparse body
                           (``signed``, ``granularity``, ``format``, ``index``)
``topk:k=K|ratio=R``       top-k magnitudes
``randk:k=K,scaled=true``  random k coordinates (scaled: unbiased)
``sparse``                 lossless bitmap / index-list / dense, cheapest
                           (``bits``, ``signed``, ``format``, ``index``)
``natural``                unbiased rounding to signed powers of two
=========================  ==================================================

Each codec's class docstring gives the closed form of its size and its floor.
"""

from ._core import Codec, CodecError, NonFiniteInput, Payload, header_nbytes
from .bitpack import pack_bits, packed_nbytes, unpack_bits
from .dense import DenseCodec
from .natural import NaturalCodec
from .quant import (
    FixpointCodes,
    QChannelCodec,
    QStochCodec,
    QStochLaw,
    fixpoint_dequantize,
    fixpoint_quantize,
    qstoch_law,
    qstoch_paper_mse,
    qstoch_round_probs,
    resolve_signed,
)
from .registry import CODECS, EXAMPLE_SPECS, decode, make_codec, register_codec
from .sparse import RandKCodec, SparseCodec, TopKCodec, topk_mask

__all__ = [
    "CODECS",
    "EXAMPLE_SPECS",
    "Codec",
    "CodecError",
    "NonFiniteInput",
    "DenseCodec",
    "FixpointCodes",
    "NaturalCodec",
    "Payload",
    "QChannelCodec",
    "QStochCodec",
    "QStochLaw",
    "RandKCodec",
    "SparseCodec",
    "TopKCodec",
    "decode",
    "fixpoint_dequantize",
    "fixpoint_quantize",
    "header_nbytes",
    "make_codec",
    "pack_bits",
    "packed_nbytes",
    "qstoch_law",
    "qstoch_paper_mse",
    "qstoch_round_probs",
    "register_codec",
    "resolve_signed",
    "topk_mask",
    "unpack_bits",
]
