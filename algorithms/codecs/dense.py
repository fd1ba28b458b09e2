"""Dense codecs: ``identity`` (raw bytes) and the casts ``fp32``, ``fp16``, ``bf16``, ``fp64``."""

from __future__ import annotations

import ctypes
import struct
import zlib
from typing import NamedTuple

import torch

from ._core import (
    BODY_CRC_BYTES,
    CODE_DTYPES,
    COPY_BY_ADDRESS_MAX,
    CRC_BYTES,
    DTYPE_CODES,
    FAMILY_DENSE,
    FIXED_HEADER,
    FLOAT_DTYPES,
    INT_DTYPES,
    LITTLE_ENDIAN,
    TWO_CRCS,
    VERSION_BODY_CRC,
    Codec,
    CodecError,
    Header,
    Payload,
    as_payload_tensor,
    body_checksum,
    body_crc32,
    build_header,
    check_body_length,
    check_input,
    from_raw_bytes,
    header_nbytes,
    max_decoded_bytes,
    new_payload,
    parse_header,
    seal_at,
    write_raw,
)

ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
CAST_NAMES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


class _Plan(NamedTuple):
    """What every payload of one input (dtype, shape) shares: its header (body CRC and header
    CRC still to fill in a version-2 one), the CRC-32 of the header's bytes before them, and the
    dtype the values travel in."""

    header: bytes
    fields_crc: int
    send: torch.dtype


class _Seen(NamedTuple):
    """A version-2 header decoded before, what it said: everything of a payload with the same
    bytes before its CRCs but what depends on the message (``DenseCodec.decode``)."""

    h0: int
    fields_crc: int  # CRC-32 of the header's bytes before its CRCs
    send: torch.dtype
    shape: tuple[int, ...]
    body: int  # bytes
    dtype: torch.dtype
    numel: int
    out_bytes: int  # of the decoded tensor


#: The longest dense header, read at once: 16 dimensions.
_HEAD_MAX = FIXED_HEADER + 4 * 16 + 1 + CRC_BYTES + BODY_CRC_BYTES
#: Plans and headers a codec keeps: a run uses a few shapes; a stream of new ones is not kept.
_KEEP = 64


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
        # by (input dtype, shape, body checksum on): a pipeline sends the same few every step, and
        # the input's checks, the header and its CRC depend on nothing else (``encode``)
        self._plans: dict[tuple, _Plan] = {}
        self._seen: dict[bytes, _Seen] = {}  # by the header's bytes before its CRCs (``decode``)

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
        plan, y = self._planned(x)
        # write_raw copies a tensor that is not contiguous, or not on the host, in order
        out = new_payload(plan.header, y.numel() * y.element_size())
        h0 = len(plan.header)
        write_raw(out, h0, y)
        if plan.header[2] == VERSION_BODY_CRC:
            seal_at(out.numpy(), h0, plan.fields_crc)
        return Payload(out)

    encode._seals = True  # seals its payload itself (Codec.__init_subclass__), from the plan's CRC

    def writer(self, x: torch.Tensor, generator: torch.Generator | None = None):
        """``Codec.writer``: the header from the plan, the values by address, then the seal, in
        one pass over the frame; for what ``write_raw`` copies by address and a sealed header
        (else None).  Between a stage's forward and backward passes the payload's allocation and
        its copy into the frame cost as much as the rest of a message's encoding
        (benchmarks/results/written-frames/)."""
        plan, y = self._planned(x)
        header = plan.header
        body = y.numel() * y.element_size()
        if not (header[2] == VERSION_BODY_CRC and LITTLE_ENDIAN and body <= COPY_BY_ADDRESS_MAX
                and y.is_contiguous() and y.is_cpu):
            return None
        h0, fields_crc = len(header), plan.fields_crc

        def write(view: memoryview, address: int) -> None:
            view[:h0] = header
            ctypes.memmove(address + h0, y.data_ptr(), body)  # y held until then (a cast's copy)
            seal_at(view, h0, fields_crc)

        return h0 + body, write

    def _planned(self, x: torch.Tensor) -> tuple[_Plan, torch.Tensor]:
        """The plan of ``x``'s kind, and the tensor whose bytes make the body (``x`` cast to the
        transmit dtype)."""
        key = (x.dtype, x.shape, body_checksum()) if isinstance(x, torch.Tensor) else None
        plan = self._plans.get(key)
        if plan is None:  # first of its kind: checked, and its header made
            plan = self._plan(check_input(x, ALL_DTYPES, self.name), key)
        # check_input's detach only where needed (a no-op tensor call is still a dispatch)
        x = x.detach() if x.requires_grad else x
        return plan, (x if plan.send == x.dtype else x.to(plan.send))

    def _plan(self, x: torch.Tensor, key: tuple) -> _Plan:
        send = self._send_dtype(x)
        header = build_header(self.family, x.dtype, tuple(x.shape), struct.pack("<B", DTYPE_CODES[send]))
        crcs = CRC_BYTES + (BODY_CRC_BYTES if header[2] == VERSION_BODY_CRC else 0)  # slots to fill
        if len(self._plans) >= _KEEP:
            self._plans.clear()
        plan = self._plans[key] = _Plan(header, zlib.crc32(header[:-crcs]), send)
        return plan

    def decode(self, p: Payload, max_numel: int | None = None) -> torch.Tensor:
        """``Codec.decode``.  A payload whose header has the bytes of one decoded before (a
        pipeline's activations repeat theirs) is checked for what depends on the message alone:
        its header CRC, its length, its body CRC and the receiver's bounds; the header's own
        checks passed then.  Anything else, a failed check included, goes through
        ``parse_header``, which says what is wrong.  (Per message, the general path's layers
        cost more than the checks themselves: benchmarks/results/dense-repeats/.)"""
        data = as_payload_tensor(p)
        arr = data.numpy()  # a payload is on the host (Payload)
        vals = self._decode_seen(arr, data.data_ptr(), max_numel)
        if vals is not None:
            return vals
        hdr = parse_header(data, expect_family=self.family, max_numel=max_numel)
        vals = self.decode_body(data, hdr)
        self._remember(arr[:_HEAD_MAX].tobytes(), hdr)
        return vals

    def reader(self, max_numel: int | None = None):
        """``Codec.reader``: a payload whose header was decoded before is decoded where it lies;
        any other is copied out and decoded."""
        def read(view: memoryview, address: int) -> torch.Tensor:
            vals = self._decode_seen(view, address, max_numel)
            if vals is not None:
                return vals
            data = torch.empty(len(view), dtype=torch.uint8)
            ctypes.memmove(data.data_ptr(), address, len(view))
            return self.decode(Payload(data), max_numel)
        return read

    def _decode_seen(self, arr, address: int, max_numel: int | None) -> torch.Tensor | None:
        """``decode``'s short path: the values of the payload ``arr`` (a numpy view or memoryview
        of its bytes, the first at ``address``) whose header has the bytes of one decoded before
        and which passes the checks that depend on the message; else None."""
        raw = arr[:_HEAD_MAX].tobytes()
        seen = self._seen.get(raw[:FIXED_HEADER + 4 * raw[5] + 1]) if len(raw) > FIXED_HEADER else None
        if seen is None or len(arr) != seen.h0 + seen.body:
            return None
        h0 = seen.h0
        body_crc, crc = TWO_CRCS.unpack_from(raw, h0 - CRC_BYTES - BODY_CRC_BYTES)
        if (zlib.crc32(raw[h0 - CRC_BYTES - BODY_CRC_BYTES: h0 - CRC_BYTES], seen.fields_crc) == crc
                and (max_numel is None or seen.numel <= max_numel)
                and seen.out_bytes <= max_decoded_bytes() and body_crc32(arr[h0:]) == body_crc):
            vals = torch.empty(seen.shape, dtype=seen.send)  # what from_raw_bytes makes
            ctypes.memmove(vals.data_ptr(), address + h0, seen.body)
            return vals if seen.send == seen.dtype else vals.to(seen.dtype)
        return None

    def _remember(self, raw: bytes, hdr: Header) -> None:
        """Keep what a header that passed every check said, where ``decode`` can take the same
        path as ``decode_body`` (a body copied by address: little-endian, not bool, at most
        COPY_BY_ADDRESS_MAX bytes) and the header has a body CRC."""
        send = CODE_DTYPES[hdr.params[0]]
        body = hdr.numel * send.itemsize
        if hdr.body_crc is None or not LITTLE_ENDIAN or send == torch.bool or body > COPY_BY_ADDRESS_MAX:
            return
        if len(self._seen) >= _KEEP:
            self._seen.clear()
        fields = raw[: hdr.nbytes - CRC_BYTES - BODY_CRC_BYTES]
        self._seen[fields] = _Seen(hdr.nbytes, zlib.crc32(fields), send, hdr.shape, body, hdr.dtype,
                                   hdr.numel, hdr.numel * hdr.dtype.itemsize)

    @classmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        (code,) = struct.unpack("<B", hdr.params)
        if code not in CODE_DTYPES:
            raise CodecError(f"corrupted header: unknown transmit dtype code {code}")
        send = CODE_DTYPES[code]
        check_body_length(data, hdr, hdr.numel * send.itemsize)
        vals = from_raw_bytes(data, send, hdr.shape, offset=hdr.nbytes)
        return vals if send == hdr.dtype else vals.to(hdr.dtype)
