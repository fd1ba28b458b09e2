"""``ids:vocab=V``: token ids in ``[0, V-1]`` as the narrowest unsigned integers.

One rule for every family that sends token ids (SparQ's labels, the protocol
pipeline's ids beside ``C``): each id travels as an unsigned little-endian
integer of ``8``, ``16`` or ``32`` bits, the narrowest that holds ``V - 1``
(so OPT's 50 272 and GPT-2's 50 257 ids take 2 bytes).  ``V`` is in the
header, so the payload alone says how wide the ids are and which are valid.

Size (bytes): ``h0 + n * width(V)``, ``h0 = 18 + 4*ndim`` (parameters:
``V - 1`` as uint32, so any ``V`` in ``1..2**32``).  Floor: ``n * log2 V``
bits.  Lossless on integer tensors whose values lie in ``[0, V-1]``; anything
else is refused on encode (never wrapped), and a decoded id ``>= V`` is a
:class:`CodecError`.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from ._core import (
    FAMILY_IDS,
    INT_DTYPES,
    Codec,
    CodecError,
    Header,
    Payload,
    build_header,
    check_body_length,
    check_input,
    header_nbytes,
    make_payload,
)

MAX_VOCAB = 2**32
_WIRE = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def id_nbytes(vocab: int) -> int:
    """Bytes per id on the wire: 1, 2 or 4, the narrowest holding ``vocab - 1``."""
    if not 1 <= vocab <= MAX_VOCAB:
        raise CodecError(f"ids: vocab={vocab} out of range 1..{MAX_VOCAB}")
    return 1 if vocab <= 2**8 else 2 if vocab <= 2**16 else 4


def ids_nbytes(shape: tuple[int, ...], vocab: int) -> int:
    """Closed form of the payload: ``18 + 4*ndim + numel * id_nbytes(vocab)``."""
    return header_nbytes(len(shape), FAMILY_IDS) + math.prod(shape) * id_nbytes(vocab)


class IdsCodec(Codec):
    """Token ids of a ``V``-word vocabulary (``"ids:vocab=V"``); exact, deterministic."""

    family = FAMILY_IDS
    name = "ids"
    unbiased = True
    contraction = 0.0

    def __init__(self, vocab: int):
        self.width = id_nbytes(vocab)
        self.vocab = vocab

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> IdsCodec:
        if "vocab" not in opts:
            raise CodecError("ids: option vocab=V (the vocabulary size) is required")
        raw = opts.pop("vocab")
        try:
            vocab = int(raw)
        except ValueError:
            raise CodecError(f"ids: vocab={raw!r} is not an integer") from None
        return cls(vocab)

    def spec(self) -> str:
        return f"ids:vocab={self.vocab}"

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        return check_input(x, INT_DTYPES, "ids")

    def _in_range(self, x: torch.Tensor) -> bool:
        if x.numel() == 0:
            return True
        lo, hi = torch.aminmax(x.reshape(-1))
        return int(lo) >= 0 and int(hi) < self.vocab

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        return self._in_range(self._check(x))

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        return ids_nbytes(tuple(self._check(x).shape), self.vocab)

    def floor_bits(self, x: torch.Tensor) -> float:
        return self._check(x).numel() * math.log2(self.vocab)

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = self._check(x)
        if not self._in_range(x):
            raise CodecError(f"ids: token ids must lie in [0, {self.vocab - 1}] (vocab={self.vocab})")
        header = build_header(self.family, x.dtype, tuple(x.shape), struct.pack("<I", self.vocab - 1))
        out, body = make_payload(header, x.numel() * self.width)
        body.numpy()[:] = x.reshape(-1).numpy().astype(_WIRE[self.width]).view(np.uint8)
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        (top,) = struct.unpack("<I", hdr.params)
        vocab = top + 1  # V - 1 on the wire, so every uint32 is a valid V in 1..2**32
        if hdr.dtype not in INT_DTYPES:
            raise CodecError(f"corrupted header: ids payload for dtype {hdr.dtype}")
        width = id_nbytes(vocab)
        n = hdr.numel
        check_body_length(data, hdr, n * width)
        ids = np.frombuffer(data[hdr.nbytes :].numpy().tobytes(), dtype=_WIRE[width]).astype(np.int64)
        if n and int(ids.max()) >= vocab:
            raise CodecError(f"corrupted body: token id {int(ids.max())} >= vocab {vocab}")
        out = torch.from_numpy(ids)
        if hdr.dtype != torch.int64:
            if int(ids.max(initial=0)) > torch.iinfo(hdr.dtype).max:
                raise CodecError(f"corrupted payload: token id does not fit {hdr.dtype}")
            out = out.to(hdr.dtype)
        return out.reshape(hdr.shape)
