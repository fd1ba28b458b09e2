"""Payload container, wire header and the abstract :class:`Codec`.

Wire header, little-endian, ``h0 = 14 + 4*ndim + P`` bytes (version 2, the
default) or ``10 + 4*ndim + P`` (version 1, no body checksum)::

    offset  size     field
    0       2        magic b"CB"
    2       1        version (2: with body CRC; 1: without)
    3       1        codec family id (see ``FAMILY_*``)
    4       1        original dtype code (see ``DTYPE_CODES``)
    5       1        ndim (0..16)
    6       4*ndim   shape, one uint32 per dimension
    ...     P        codec parameters (fixed size per family: ``PARAM_SIZES``)
    ...     4        version 2 only: CRC-32 (zlib) of the body
    ...     4        CRC-32 (zlib) of every header byte before it

The body follows the header.  Its length is a function of the header alone, so a
decoder checks ``len(payload) == h0 + body`` before reading it.  The header CRC
makes every single-byte (and every burst up to 32 bits) corruption of the header
detectable, so a corrupted header can never decode to a wrong shape or dtype;
the body CRC does the same for the body (a frame that passed the transport can
still carry a peer's corrupted or truncated message).  Its structure (index
order and range, bitmap population, padding bits) is validated as well.
Encoders write version 2 unless :func:`set_body_checksum` turned it off; decoders
read both.  Before allocating, every decoder bounds the tensor a header announces:
by the element count the receiver expects (``max_numel``), or without one by the
payload's length (:data:`MAX_ELEMENTS_PER_BYTE`), and by :func:`max_decoded_bytes`.
"""

from __future__ import annotations

import abc
import ctypes
import functools
import math
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ._crc import crc32 as body_crc32

MAGIC = b"CB"
VERSION_PLAIN = 1  # header CRC only
VERSION_BODY_CRC = 2  # header CRC and CRC-32 of the body
VERSION = VERSION_BODY_CRC
MAX_NDIM = 16
FIXED_HEADER = 6  # magic, version, codec id, dtype, ndim
CRC_BYTES = 4
BODY_CRC_BYTES = 4
LITTLE_ENDIAN = sys.byteorder == "little"

# codec family ids on the wire: 1..31 built in (each registered once, with its parameter block
# size and name, in registry.py), 32..255 for register_codec
FAMILY_DENSE = 1
FAMILY_QSTOCH = 2
FAMILY_QCHANNEL = 3
FAMILY_SPARSE = 4
FAMILY_TOPK = 5
FAMILY_RANDK = 6
FAMILY_IDS = 7
FAMILY_SPARSE_QSTOCH = 8
FAMILY_NATURAL = 9
BUILTIN_IDS = range(1, 32)

# size P of the parameter block per family, and its name: filled by the registrations
PARAM_SIZES: dict[int, int] = {}
FAMILY_NAMES: dict[int, str] = {}

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}
CODE_DTYPES: dict[int, torch.dtype] = {v: k for k, v in DTYPE_CODES.items()}
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
U32_MAX = 2**32 - 1

#: Largest decoded tensor, in bytes, a decoder will build (1 GiB by default, the
#: Comm's default maximum frame size).  A dense body's length already bounds its
#: output; a sparse one (index list) announces ``n`` elements in a few bytes, so
#: without this bound a 21-byte payload could ask for a 4 GiB tensor.
DEFAULT_MAX_DECODED_BYTES = 1 << 30
#: Most elements one payload byte may stand for when the receiver does not say how many
#: it expects.  A dense body spends at least one bit per element (8 per byte); a sparse
#: one (index list, or no entries at all) announces ``n`` elements in a few bytes, so
#: nothing in the payload itself bounds ``n`` usefully: an all-zero tensor of any size is
#: a legitimate 25-byte message.  The bound that is both tight and faithful is the
#: receiver's: it knows the tensor it waits for (a gradient of ``d`` elements, a stage's
#: activation), passes ``max_numel`` to ``decode``, and a payload announcing more is a
#: :class:`CodecError` before anything is allocated, while an expected all-zero tensor of
#: any size decodes from its few bytes.  A decoder that is given no expectation falls back
#: to this per-byte cap (a 25-byte payload can still ask for ~6.5 MB of float32 zeros), so
#: every receive path in the harness passes one.  Encoders do not refuse large all-zero
#: tensors: whether one is acceptable is the receiver's call, and it answers clearly.
MAX_ELEMENTS_PER_BYTE = 1 << 16
_limits = {"max_decoded_bytes": DEFAULT_MAX_DECODED_BYTES, "body_checksum": True}


def body_checksum() -> bool:
    """Whether encoders write a CRC-32 of the body (version 2 headers); on by default."""
    return bool(_limits["body_checksum"])


def set_body_checksum(on: bool) -> bool:
    """Turn the body checksum on or off for encoders (process-wide); returns the previous setting."""
    old = body_checksum()
    _limits["body_checksum"] = bool(on)
    return old


def max_decoded_bytes() -> int:
    return _limits["max_decoded_bytes"]


def set_max_decoded_bytes(nbytes: int) -> int:
    """Change the decoders' output bound (process-wide); returns the previous one."""
    if not isinstance(nbytes, int) or nbytes < 1:
        raise CodecError(f"max_decoded_bytes must be a positive integer, got {nbytes!r}")
    old = _limits["max_decoded_bytes"]
    _limits["max_decoded_bytes"] = nbytes
    return old


class CodecError(ValueError):
    """Malformed, truncated or corrupted payload, or a bad codec parameter."""


class NonFiniteInput(CodecError):
    """A tensor to encode holds NaN or infinity: in a training run, a sign that it diverged
    (``nonfinite``: what the harness looks for, without importing the codecs)."""

    nonfinite = True


@dataclass(frozen=True, eq=False)
class Payload:
    """The bytes that travel: a 1-D, contiguous, CPU ``uint8`` tensor.

    ``nbytes`` is exactly what a byte meter must count.  Decoding reads only
    ``data``: header (shape, dtype, codec parameters) and body.
    """

    data: torch.Tensor

    def __post_init__(self) -> None:
        d = self.data
        if not isinstance(d, torch.Tensor):
            raise CodecError(f"payload data must be a torch.Tensor, got {type(d).__name__}")
        if (
            d.dtype != torch.uint8
            or d.dim() != 1
            or not d.is_cpu  # not ``device.type``: that builds a device and a string per call
            or not d.is_contiguous()
        ):
            raise CodecError(
                "payload data must be a 1-D contiguous CPU uint8 tensor, got "
                f"dtype={d.dtype}, shape={tuple(d.shape)}, device={d.device}"
            )

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def tobytes(self) -> bytes:
        return self.data.numpy().tobytes()

    @classmethod
    def frombytes(cls, raw: bytes | bytearray | memoryview) -> Payload:
        raw = bytearray(raw)
        return cls(torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8))

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"Payload(nbytes={self.nbytes})"


def _h0(ndim: int, family: int, version: int) -> int:
    body_crc = BODY_CRC_BYTES if version == VERSION_BODY_CRC else 0
    return FIXED_HEADER + 4 * ndim + PARAM_SIZES[family] + body_crc + CRC_BYTES


def header_nbytes(ndim: int, family: int) -> int:
    """``h0 = 14 + 4*ndim + P(family)``: fixed fields, shape, parameters, body CRC and header CRC.

    ``10 + 4*ndim + P`` while the body checksum is off (:func:`set_body_checksum`).
    """
    return _h0(ndim, family, VERSION_BODY_CRC if body_checksum() else VERSION_PLAIN)


def build_header(family: int, dtype: torch.dtype, shape: tuple[int, ...], params: bytes) -> bytes:
    """The header; with the body checksum on, its body-CRC slot is filled by :func:`seal`."""
    return _header(family, dtype, shape, params, VERSION_BODY_CRC if body_checksum() else VERSION_PLAIN)


@functools.lru_cache(maxsize=256)  # a pipeline sends the same few shapes every step
def _header(family: int, dtype: torch.dtype, shape: tuple[int, ...], params: bytes,
            version: int) -> bytes:
    if len(params) != PARAM_SIZES[family]:  # pragma: no cover - programming error
        raise AssertionError("parameter block has the wrong size")
    head = MAGIC + struct.pack("<BBBB", version, family, DTYPE_CODES[dtype], len(shape))
    head += struct.pack(f"<{len(shape)}I", *shape) + params
    if version == VERSION_BODY_CRC:
        head += bytes(BODY_CRC_BYTES)  # placeholder until the body is written
    return head + struct.pack("<I", zlib.crc32(head))


def seal(data: torch.Tensor) -> None:
    """Write the body CRC of a version-2 payload (and the header CRC over it), in place."""
    arr = data.numpy()  # read through numpy: indexing the tensor is an op per byte read
    if arr[2] != VERSION_BODY_CRC:
        return
    h0 = _h0(int(arr[5]), int(arr[3]), VERSION_BODY_CRC)
    seal_at(arr, h0, zlib.crc32(arr[: h0 - CRC_BYTES - BODY_CRC_BYTES]))


_U32 = struct.Struct("<I")
#: A version-2 header's last 8 bytes: the body CRC, then the header CRC.
TWO_CRCS = struct.Struct("<II")


def seal_at(arr, h0: int, prefix_crc: int) -> None:
    """:func:`seal` of the version-2 payload ``arr`` (a numpy view or memoryview of its bytes)
    whose header is ``h0`` bytes long and whose bytes before the CRCs have the CRC-32
    ``prefix_crc`` (an encoder that made the header knows both): the header CRC continues from it
    over the body CRC (``crc32(b, crc32(a)) == crc32(a + b)``), so the header is not read again."""
    body = body_crc32(arr[h0:])
    TWO_CRCS.pack_into(arr, h0 - CRC_BYTES - BODY_CRC_BYTES, body, zlib.crc32(_U32.pack(body), prefix_crc))


class Header(NamedTuple):
    """A parsed, checked header (a tuple: built once per received message)."""

    family: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    params: bytes
    nbytes: int  # h0, where the body starts
    body_crc: int | None  # version 2: checked by check_body_length
    numel: int  # math.prod(shape)


def as_payload_tensor(p: object) -> torch.Tensor:
    """Accept a :class:`Payload`, a uint8 tensor or bytes; return the uint8 tensor."""
    if isinstance(p, Payload):
        return p.data
    if isinstance(p, (bytes, bytearray, memoryview)):
        return Payload.frombytes(p).data
    if isinstance(p, torch.Tensor):
        return Payload(p).data
    raise CodecError(f"cannot decode an object of type {type(p).__name__}; expected a Payload")


def _host_bytes(data: torch.Tensor):
    """The payload's bytes, read in place where it is on the host (a numpy view: indexing the
    tensor itself is an op per read); a device payload's header is copied over once."""
    if data.is_cpu:
        return data.numpy()
    return data[: _max_h0()].cpu().numpy()


def _max_h0() -> int:
    return FIXED_HEADER + 4 * MAX_NDIM + max(PARAM_SIZES.values()) + BODY_CRC_BYTES + CRC_BYTES


def _check_fixed(head: bytes) -> int:
    """Validate the fixed fields (magic, version, codec id) of a header; its codec id."""
    if head[:2] != MAGIC:
        raise CodecError(
            f"bad magic {head[:2]!r}: not a commbench codec payload (expected {MAGIC!r})"
        )
    if head[2] not in (VERSION_PLAIN, VERSION_BODY_CRC):
        raise CodecError(
            f"unsupported payload version {head[2]} (this decoder reads versions "
            f"{VERSION_PLAIN} and {VERSION_BODY_CRC})"
        )
    if head[3] not in PARAM_SIZES:
        raise CodecError(
            f"unknown codec id {head[3]} in payload header (known: {sorted(PARAM_SIZES)})"
        )
    return head[3]


@functools.lru_cache(maxsize=MAX_NDIM + 1)
def _shape_struct(ndim: int) -> struct.Struct:
    return struct.Struct(f"<{ndim}I")


def parse_header(data: torch.Tensor, expect_family: int | None = None,
                 max_numel: int | None = None) -> Header:
    """Validate and parse the header; raises :class:`CodecError` on any defect.

    ``max_numel``: the most elements the receiver expects (see :data:`MAX_ELEMENTS_PER_BYTE`);
    without it the count is bounded by the payload's length instead.
    """
    size = data.numel()
    if size < FIXED_HEADER:
        raise CodecError(f"truncated payload: {size} bytes, a header needs at least {FIXED_HEADER}")
    arr = _host_bytes(data)  # read once: this runs for every message a pipeline receives
    head = arr[:FIXED_HEADER].tobytes()
    family = _check_fixed(head)
    if expect_family is not None and family != expect_family:
        raise CodecError(
            f"payload was made by codec family {FAMILY_NAMES[family]!r} (id {family}), "
            f"not {FAMILY_NAMES[expect_family]!r} (id {expect_family})"
        )
    version, dcode, ndim = head[2], head[4], head[5]
    if ndim > MAX_NDIM:
        raise CodecError(f"corrupted header: ndim {ndim} > {MAX_NDIM}")
    h0 = _h0(ndim, family, version)
    if size < h0:
        raise CodecError(f"truncated payload: {size} bytes, header needs {h0}")
    raw = arr[:h0].tobytes()
    (crc,) = struct.unpack_from("<I", raw, h0 - CRC_BYTES)
    if zlib.crc32(raw[: h0 - CRC_BYTES]) != crc:
        raise CodecError("corrupted header: CRC-32 mismatch")
    if dcode not in CODE_DTYPES:
        raise CodecError(f"corrupted header: unknown dtype code {dcode}")
    shape = _shape_struct(ndim).unpack_from(raw, FIXED_HEADER)
    numel = math.prod(shape)
    if numel > U32_MAX:  # no encoder makes one (check_input)
        raise CodecError(f"corrupted header: shape {shape} has {numel} >= 2**32 elements")
    if max_numel is not None:
        if numel > max_numel:
            raise CodecError(f"payload announces {numel} elements {shape}; the receiver expects "
                             f"at most {max_numel}")
    elif numel > MAX_ELEMENTS_PER_BYTE * size:
        raise CodecError(f"payload of {size} bytes announces {numel} elements {shape}: more than "
                         f"{MAX_ELEMENTS_PER_BYTE} per byte (pass max_numel, the count the "
                         "receiver expects, to decode larger sparse tensors)")
    dtype = CODE_DTYPES[dcode]
    out = numel * dtype.itemsize
    if out > _limits["max_decoded_bytes"]:
        raise CodecError(f"payload announces a {out}-byte tensor {shape}, more than the decoders' "
                         f"bound of {max_decoded_bytes()} bytes (set_max_decoded_bytes)")
    end = FIXED_HEADER + 4 * ndim + PARAM_SIZES[family]
    body_crc = struct.unpack_from("<I", raw, end)[0] if version == VERSION_BODY_CRC else None
    return Header(family, dtype, shape, raw[FIXED_HEADER + 4 * ndim : end], h0, body_crc, numel)


def check_body_length(data: torch.Tensor, hdr: Header, body: int) -> None:
    """The body has the length the header implies and, in version 2, its CRC-32.

    Every decoder calls this before reading the body.
    """
    want = hdr.nbytes + body
    got = data.numel()
    if got < want:
        raise CodecError(f"truncated payload: {got} bytes, header announces {want}")
    if got > want:
        raise CodecError(f"payload has {got - want} trailing bytes after the {want} announced")
    if hdr.body_crc is not None:
        # sliced in numpy, not as a tensor: a tensor slice is an op
        if body_crc32(data.numpy()[hdr.nbytes:]) != hdr.body_crc:
            raise CodecError("corrupted body: CRC-32 mismatch")


def log2_binom(n: int, k: int) -> float:
    """log2 C(n, k), via lgamma (exact enough for a floor in bits)."""
    if k < 0 or k > n:
        raise ValueError("k out of range")
    if k == 0 or k == n:
        return 0.0
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise CodecError(f"option {name}={value!r} is not a boolean (use true or false)")


class Codec(abc.ABC):
    # Every subclass's ``encode`` is wrapped to :func:`seal` its payload (body CRC).
    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        enc = cls.__dict__.get("encode")
        if enc is not None and not getattr(enc, "_seals", False):

            @functools.wraps(enc)
            def encode(self, x, generator=None, _enc=enc):
                p = _enc(self, x, generator)
                seal(p.data)
                return p

            encode._seals = True
            cls.encode = encode

    """A message codec: ``encode(x) -> Payload`` and ``decode(Payload) -> x̂``.

    Declared properties (each is tested in ``checks/test_codecs.py``):

    * ``unbiased``: ``E[decode(encode(x))] = x`` over the codec's randomness.
    * ``contraction_bound(numel)``: ``ω`` with ``E‖C(x)−x‖² ≤ ω²‖x‖²``, or
      ``None`` when no bound is claimed.  ``contraction`` holds it when it does
      not depend on the size.
    * ``is_lossless_on(x)``: ``x`` lies in the domain the codec reproduces exactly.
    * ``encoded_nbytes(x)``: the closed-form payload size (equals ``encode(x).nbytes``).
    * ``floor_bits(x)``: an information-theoretic floor for the message in bits.
    """

    family: ClassVar[int]
    name: str = ""
    unbiased: bool = False
    contraction: float | None = None
    stochastic: bool = False

    # -- declared properties -------------------------------------------------
    def contraction_bound(self, numel: int) -> float | None:
        return self.contraction

    @abc.abstractmethod
    def spec(self) -> str:
        """Canonical spec string; ``make_codec(c.spec())`` rebuilds an equal codec."""

    @abc.abstractmethod
    def is_lossless_on(self, x: torch.Tensor) -> bool: ...

    @abc.abstractmethod
    def encoded_nbytes(self, x: torch.Tensor) -> int: ...

    @abc.abstractmethod
    def floor_bits(self, x: torch.Tensor) -> float: ...

    # -- wire ------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Payload: ...

    def writer(self, x: torch.Tensor, generator: torch.Generator | None = None):
        """``encode(x)``'s payload as ``(nbytes, write)``, where ``write(view, address)`` writes
        its bytes into a memoryview of exactly ``nbytes`` bytes whose first is at ``address``: a
        Comm writes it into its frame (``Comm.send_written``) with no payload made and copied.
        None where this codec has no such path for ``x``: then ``encode`` it."""
        return None

    def reader(self, max_numel: int | None = None):
        """A function ``read(view, address)`` giving ``decode(payload, max_numel)`` of the payload
        whose bytes the memoryview ``view`` holds, the first at ``address``, read where they lie
        (``Comm.recv_read``: no copy of the payload out of the Comm's buffer first); it keeps no
        reference to the view.  None where this codec has no such path: then ``decode``."""
        return None

    def decode(self, p: Payload, max_numel: int | None = None) -> torch.Tensor:
        """``max_numel``: the most elements the receiver expects (:func:`parse_header`)."""
        data = as_payload_tensor(p)
        hdr = parse_header(data, expect_family=self.family, max_numel=max_numel)
        return self.decode_body(data, hdr)

    @classmethod
    @abc.abstractmethod
    def decode_body(cls, data: torch.Tensor, hdr: Header) -> torch.Tensor:
        """Decode a payload whose header has been parsed and checked."""

    def header_nbytes(self, x: torch.Tensor) -> int:
        return header_nbytes(x.dim(), self.family)

    def __repr__(self) -> str:
        return f"make_codec({self.spec()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and other.spec() == self.spec()

    def __hash__(self) -> int:
        return hash(self.spec())


def check_input(x: object, allowed: tuple[torch.dtype, ...], codec: str) -> torch.Tensor:
    """Validate an input tensor and return it detached, on CPU and contiguous."""
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"{codec}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise CodecError(f"{codec}: dtype {x.dtype} is not supported (supported: {names})")
    if x.dim() > MAX_NDIM:
        raise CodecError(f"{codec}: {x.dim()} dimensions, at most {MAX_NDIM} are supported")
    if x.numel() > U32_MAX or (x.dim() and max(x.shape) > U32_MAX):
        raise CodecError(f"{codec}: tensors with 2**32 or more elements are not supported")
    x = x.detach()
    if not x.is_cpu:
        x = x.cpu()
    return x.contiguous()


def check_finite(x: torch.Tensor, codec: str) -> None:
    """CodecError on NaN or infinity (one reduction: aminmax propagates NaN)."""
    if x.is_floating_point() and x.numel():
        mn, mx = torch.aminmax(x.reshape(-1))
        if not (math.isfinite(float(mn)) and math.isfinite(float(mx))):
            raise NonFiniteInput(f"{codec}: input contains NaN or infinity")


def new_payload(header: bytes, body_nbytes: int) -> torch.Tensor:
    """Allocate ``header + body`` with the header written; the body follows at ``len(header)``."""
    out = torch.empty(len(header) + body_nbytes, dtype=torch.uint8)
    ctypes.memmove(out.data_ptr(), header, len(header))  # not a tensor op: a few bytes
    return out


def make_payload(header: bytes, body_nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`new_payload` and a uint8 view of its body, for codecs that write it with tensor ops."""
    out = new_payload(header, body_nbytes)
    return out, out[len(header) :]


def raw_bytes(x: torch.Tensor) -> torch.Tensor:
    """Little-endian bytes of a contiguous tensor, as a 1-D uint8 view (or copy)."""
    if x.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    if x.dtype == torch.bool:
        return x.view(torch.uint8).reshape(-1)
    b = x.reshape(-1).view(torch.uint8)
    if not LITTLE_ENDIAN and x.element_size() > 1:  # pragma: no cover - big-endian hosts
        b = b.view(-1, x.element_size()).flip(1).reshape(-1)
    return b


#: Up to this many bytes a codec copies raw values by address (``ctypes.memmove``): there a
#: tensor copy's fixed cost dominates, and more so into or out of a payload's body, which starts
#: unaligned after its header.  Above it, torch's copy, which may use several threads.
COPY_BY_ADDRESS_MAX = 1 << 20


def write_raw(out: torch.Tensor, offset: int, x: torch.Tensor) -> None:
    """The bytes of ``raw_bytes(x)`` into ``out`` (a uint8 payload) from ``offset`` to its end."""
    nbytes = x.numel() * x.element_size()
    if out.numel() - offset != nbytes:
        raise CodecError(f"body of {out.numel() - offset} bytes for {nbytes}")
    if LITTLE_ENDIAN and nbytes <= COPY_BY_ADDRESS_MAX and x.is_contiguous() and x.is_cpu:
        ctypes.memmove(out.data_ptr() + offset, x.data_ptr(), nbytes)
    else:
        out[offset:].copy_(raw_bytes(x))


def from_raw_bytes(b: torch.Tensor, dtype: torch.dtype, shape: int | tuple[int, ...],
                   offset: int = 0) -> torch.Tensor:
    """Inverse of :func:`raw_bytes` on ``b[offset:]`` (copies, so the result is aligned): the
    values of a tensor of ``shape`` (an int: that many, 1-D)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = math.prod(shape)
    size = dtype.itemsize
    nbytes = count * size
    if b.numel() - offset < nbytes:
        raise CodecError(f"truncated body: {b.numel() - offset} bytes, {nbytes} needed")
    if dtype == torch.bool:
        v = b[offset : offset + count].clone()
        if bool((v > 1).any()):
            raise CodecError("corrupted body: bool value other than 0 or 1")
        return v.view(torch.bool).reshape(shape)
    if not LITTLE_ENDIAN and size > 1:  # pragma: no cover - big-endian hosts
        v = b[offset : offset + nbytes].clone().view(-1, size).flip(1).reshape(-1).contiguous()
        return v.view(dtype).reshape(shape)
    if nbytes > COPY_BY_ADDRESS_MAX:
        return b[offset : offset + nbytes].clone().view(dtype).reshape(shape)
    # a new aligned tensor filled by address (COPY_BY_ADDRESS_MAX); the memory meter counts
    # it as it counted the clone (``torch.empty`` is an op)
    c = torch.empty(shape, dtype=dtype)
    if count:
        ctypes.memmove(c.data_ptr(), b.data_ptr() + offset, nbytes)
    return c
