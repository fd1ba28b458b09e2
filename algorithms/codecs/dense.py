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
    new_payload,
    write_raw,
)

ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
CAST_NAMES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


class DenseCodec(Codec):
    """Dense values in a transmit dtype, decoded back to the input's dtype.

    ``identity`` sends the raw bytes of the input's own dtype (bit-exact for
    every supported dtype, NaN and -0.0 included).  ``fp32`` / ``fp16`` /
    ``bf16`` / ``fp64`` cast to that dtype (round to nearest even) and back.

    Size (bytes): ``h0 + n * itemsize(transmit_dtype)`` with ``h0 = 15 + 4*ndim``.
    Floor: ``8 * itemsize(transmit_dtype) * n`` bits (n values of that width).
    Lossless on: identity: everything; casts: ``x.to(transmit_dtype).to(x.dtype) == x``.
    Casts are deterministic and biased (round to nearest) and claim no
    contraction bound (overflow to inf is possible); identity has ω = 0.
    """

    family = FAMILY_DENSE
    # The dtype the values travel in ("transmit dtype", harness/comm/__init__.py); None: the
    # input's own (identity).  Not "wire": that word is kept for kernel-counted bytes.
    transmit_dtype: torch.dtype | None

    def __init__(self, name: str):
        if name == "identity":
            self.transmit_dtype = None
            self.unbiased = True
            self.contraction = 0.0
        elif name in CAST_NAMES:
            self.transmit_dtype = CAST_NAMES[name]
            self.unbiased = False
            self.contraction = None
        else:  # pragma: no cover - guarded by the registry
            raise CodecError(f"unknown dense codec {name!r}")
        self.name = name

    def spec(self) -> str:
        return self.name

    def _send_dtype(self, x: torch.Tensor) -> torch.dtype:
        return x.dtype if self.transmit_dtype is None else self.transmit_dtype

    def is_lossless_on(self, x: torch.Tensor) -> bool:
        x = check_input(x, ALL_DTYPES, self.name)
        if self.transmit_dtype is None or self.transmit_dtype == x.dtype:
            return True
        return bool(torch.equal(x.to(self.transmit_dtype).to(x.dtype), x))

    def encoded_nbytes(self, x: torch.Tensor) -> int:
        x = check_input(x, ALL_DTYPES, self.name)
        size = self._send_dtype(x).itemsize
        return header_nbytes(x.dim(), self.family) + x.numel() * size

    def floor_bits(self, x: torch.Tensor) -> float:
        x = check_input(x, ALL_DTYPES, self.name)
        return float(8 * self._send_dtype(x).itemsize * x.numel())

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload:
        x = check_input(x, ALL_DTYPES, self.name)
        send = self._send_dtype(x)
        y = x if send == x.dtype else x.to(send)
        header = build_header(
            self.family, x.dtype, tuple(x.shape), struct.pack("<B", DTYPE_CODES[send])
        )
        out = new_payload(header, y.numel() * y.element_size())
        write_raw(out, len(header), y)
        return Payload(out)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        (code,) = struct.unpack("<B", hdr.params)
        if code not in CODE_DTYPES:
            raise CodecError(f"corrupted header: unknown transmit dtype code {code}")
        send = CODE_DTYPES[code]
        check_body_length(data, hdr, hdr.numel * send.itemsize)
        vals = from_raw_bytes(data, send, hdr.shape, offset=hdr.nbytes)
        return vals if send == hdr.dtype else vals.to(hdr.dtype)
