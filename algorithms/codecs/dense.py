"""Dense codecs: ``identity`` (raw bytes) and the casts ``fp32``, ``fp16``, ``bf16``, ``fp64``."""

from __future__ import annotations

import struct

import torch

from ._core import (
    CODE_DTYPES,
    DTYPE_CODES,
    FAMILY_DENSE,
    FLOAT_DTYPES,
    INT_DTYPES,
    Codec,
    CodecError,
    Header,
    Payload,
    build_header,
    check_body_length,
    check_input,
    from_raw_bytes,
    header_nbytes,
    make_payload,
    raw_bytes,
)

ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
CAST_NAMES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


class DenseCodec(Codec):
    """Dense values in a wire dtype, decoded back to the input's dtype.

    ``identity`` sends the raw bytes of the input's own dtype (bit-exact for
    every supported dtype, NaN and -0.0 included).  ``fp32`` / ``fp16`` /
    ``bf16`` / ``fp64`` cast to that dtype (round to nearest even) and back.

    Size (bytes): ``h0 + n * itemsize(wire)`` with ``h0 = 15 + 4*ndim``.
    Floor: ``8 * itemsize(wire) * n`` bits (n values of the wire width).
    Lossless on: identity: everything; casts: ``x.to(wire).to(x.dtype) == x``.
    Casts are deterministic and biased (round to nearest) and claim no
    contraction bound (overflow to inf is possible); identity has ω = 0.
    """

    family = FAMILY_DENSE

    def __init__(self, name: str):
        if name == "identity":
            self.wire = None
            self.unbiased = True
            self.contraction = 0.0
        elif name in CAST_NAMES:
            self.wire = CAST_NAMES[name]
            self.unbiased = False
            self.contraction = None
        else:  # pragma: no cover - guarded by the registry
            raise CodecError(f"unknown dense codec {name!r}")
        self.name = name

    def spec(self) -> str:
        return self.name

    def _wire(self, x: torch.Tensor) -> torch.dtype:
        return x.dtype if self.wire is None else self.wire

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = check_input(x, ALL_DTYPES, self.name)
        if self.wire is None or self.wire == x.dtype:
            return True
        return bool(torch.equal(x.to(self.wire).to(x.dtype), x))

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = check_input(x, ALL_DTYPES, self.name)
        size = torch.empty((), dtype=self._wire(x)).element_size()
        return header_nbytes(x.dim(), self.family) + x.numel() * size

    def floor_bits(self, x: torch.Tensor) -> float:
        x = check_input(x, ALL_DTYPES, self.name)
        return float(8 * torch.empty((), dtype=self._wire(x)).element_size() * x.numel())

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = check_input(x, ALL_DTYPES, self.name)
        wire = self._wire(x)
        y = x if wire == x.dtype else x.to(wire)
        header = build_header(
            self.family, x.dtype, tuple(x.shape), struct.pack("<B", DTYPE_CODES[wire])
        )
        out, body = make_payload(header, y.numel() * y.element_size())
        body.copy_(raw_bytes(y))
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        (wcode,) = struct.unpack("<B", hdr.params)
        if wcode not in CODE_DTYPES:
            raise CodecError(f"corrupted header: unknown wire dtype code {wcode}")
        wire = CODE_DTYPES[wcode]
        n = hdr.numel
        check_body_length(data, hdr, n * torch.empty((), dtype=wire).element_size())
        vals = from_raw_bytes(data[hdr.nbytes :], wire, n)
        return vals.to(hdr.dtype).reshape(hdr.shape)
