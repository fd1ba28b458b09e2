"""The dense codec on a (dtype, shape) it has met before: encode from the plan it kept, decode of
a header it decoded before (``algorithms/codecs/dense.py``).  Both must give, byte for byte, what
the first message of its kind gives, and refuse what a fresh codec refuses with the same error.
Encoded bytes are compared with the payload layout written out here (magic, version, family,
dtype codes, shape, transmit code, CRC-32s by zlib), not with the codec's own header code."""

from __future__ import annotations

import struct
import zlib
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import CodecError, Payload, dense, make_codec
from algorithms.codecs._core import body_checksum, set_body_checksum, set_max_decoded_bytes

# the wire's dtype codes and the casts' transmit dtypes, as the format defines them
CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4, torch.uint8: 5,
         torch.int8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10}
CASTS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
OTHERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


def _tensor(seed: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _payload(x: torch.Tensor, name: str, checksum: bool) -> bytes:
    """The dense payload of ``x``, from the format's definition."""
    send = x.dtype if name == "identity" else CASTS[name]
    y = x.detach().contiguous().to(send).reshape(-1)
    body = (y.view(torch.uint8) if y.numel() else y.to(torch.uint8)).numpy().tobytes()
    head = b"CB" + bytes([2 if checksum else 1, 1, CODES[x.dtype], x.dim()])
    head += struct.pack(f"<{x.dim()}I", *x.shape) + bytes([CODES[send]])
    if checksum:
        head += struct.pack("<I", zlib.crc32(body))
    return head + struct.pack("<I", zlib.crc32(head)) + body


@st.composite
def _cases(draw):
    """(codec name, input dtype, shape, seed): every dense codec on the dtypes it accepts."""
    name = draw(st.sampled_from(("identity", *CASTS)))
    dtype = draw(st.sampled_from(FLOATS + (OTHERS if name == "identity" else ())))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    return name, dtype, shape, draw(st.integers(0, 2**31 - 1))


def _outcome(decode, payload: Payload, max_numel):
    """What a decode gives: its error's text, or the decoded tensor's dtype, shape and bytes."""
    try:
        out = decode(payload, max_numel=max_numel)
    except CodecError as e:
        return "error", str(e)
    return "ok", out.dtype, tuple(out.shape), out.reshape(-1).contiguous().view(torch.uint8).tolist()


@settings(max_examples=150, deadline=None)
@given(_cases(), st.booleans(), st.booleans(), st.booleans())
def test_a_repeated_encode_writes_the_payload_the_format_defines(case, checksum, grad, transposed):
    """The second and later inputs of a (dtype, shape) are encoded from the kept plan: the same
    bytes as the format's definition, for a new value, a tensor that needs its gradient dropped
    or one laid out transposed, and the body checksum switched between messages."""
    name, dtype, shape, seed = case
    codec = make_codec(name)
    old = body_checksum()
    try:
        for i in range(3):
            on = checksum != (i == 1)  # the second message with the checksum switched
            set_body_checksum(on)
            x = _tensor(seed + i, dtype, shape)
            if transposed and x.dim() >= 2:
                x = x.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
            if grad and dtype.is_floating_point:
                x = x.requires_grad_()
            assert codec.encode(x).tobytes() == _payload(x, name, on)
    finally:
        set_body_checksum(old)


def _written(codec, x: torch.Tensor) -> bytes | None:
    """What ``codec.writer(x)`` writes, into a buffer with a byte of slack on either side that
    must stay as it was; None where it has no writer for ``x``."""
    written = codec.writer(x)
    if written is None:
        return None
    nbytes, write = written
    buf = torch.full((nbytes + 2,), 0xA5, dtype=torch.uint8)
    write(memoryview(buf.numpy())[1:1 + nbytes], buf.data_ptr() + 1)
    out = buf.numpy().tobytes()
    assert out[0] == out[-1] == 0xA5, "the writer wrote outside its view"
    return out[1:-1]


@settings(max_examples=150, deadline=None)
@given(_cases(), st.booleans(), st.booleans(), st.booleans())
def test_the_writer_writes_the_payload_the_format_defines(case, checksum, grad, transposed):
    """``DenseCodec.writer`` (a payload written into the Comm's frame) writes the bytes of the
    format's definition, exactly its length, for a new value, one that needs its gradient dropped,
    and the body checksum switched between messages.  It writes wherever ``encode`` copies by
    address with a sealed header (contiguous, on the host, at most ``COPY_BY_ADDRESS_MAX``
    bytes); elsewhere it says so (None), and ``encode`` is used."""
    name, dtype, shape, seed = case
    codec = make_codec(name)
    old = body_checksum()
    try:
        for i in range(3):
            on = checksum != (i == 1)
            set_body_checksum(on)
            x = _tensor(seed + i, dtype, shape)
            laid_out = not (transposed and x.dim() >= 2 and min(x.shape[:2]) > 1)
            if not laid_out:
                x = x.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
            if grad and dtype.is_floating_point:
                x = x.requires_grad_()
            got = _written(codec, x)
            assert (got is not None) == (on and laid_out)  # a cast keeps the input's strides
            assert got in (None, _payload(x, name, on))
    finally:
        set_body_checksum(old)


def test_the_writer_leaves_a_body_above_the_copy_by_address_bound_to_encode():
    x = torch.zeros(dense.COPY_BY_ADDRESS_MAX // 4 + 1)
    assert make_codec("identity").writer(x) is None
    assert _written(make_codec("identity"), x[:-1]) == _payload(x[:-1], "identity", body_checksum())


def _reading(codec):
    """``codec.decode`` through its reader: the payload's bytes read where they lie."""
    def decode(p: Payload, max_numel=None):
        data = p.data
        return codec.reader(max_numel)(memoryview(data.numpy()), data.data_ptr())
    return decode


@st.composite
def _defects(draw, nbytes: int):
    """A way to spoil a payload of ``nbytes`` bytes: one bit flipped anywhere, bytes cut off or
    added, or a receiver that expects one element fewer."""
    kind = draw(st.sampled_from(("flip", "cut", "add", "expect fewer", "none")))
    if kind == "flip":
        return kind, draw(st.integers(0, nbytes - 1)), draw(st.integers(0, 7))
    if kind in ("cut", "add"):
        return kind, draw(st.integers(1, 9)), 0
    return kind, 0, 0


@settings(max_examples=300, deadline=None)
@given(_cases(), st.data())
def test_a_header_decoded_before_refuses_what_a_first_decode_refuses(case, data):
    """A codec that decoded a payload of this (dtype, shape) before checks the next one without
    parsing its header again: whatever the defect, it must decode what a fresh codec decodes and
    refuse what a fresh codec refuses, with the same error."""
    name, dtype, shape, seed = case
    warm = make_codec(name)
    x0, x = _tensor(seed, dtype, shape), _tensor(seed + 1, dtype, shape)
    warm.decode(warm.encode(x0))
    if dtype != torch.bool:  # bool bodies always take the general path (their values are checked)
        assert len(warm._seen) == 1  # the path under test is the one taken
    p = warm.encode(x)
    kind, a, b = data.draw(_defects(p.nbytes))
    raw = bytearray(p.tobytes())
    max_numel = None if data.draw(st.booleans()) else x.numel()
    if kind == "flip":
        raw[a] ^= 1 << b
    elif kind == "cut":
        raw = raw[: max(0, len(raw) - a)]
    elif kind == "add":
        raw += bytes(a)
    elif kind == "expect fewer":
        max_numel = x.numel() - 1
    bad = Payload.frombytes(raw)
    with mock.patch.object(dense, "parse_header", wraps=dense.parse_header) as parse:
        got = _outcome(warm.decode, bad, max_numel)
    assert got == _outcome(make_codec(name).decode, bad, max_numel)
    # the reader (a payload read where the Comm received it) gives the same, warm or fresh
    with mock.patch.object(dense, "parse_header", wraps=dense.parse_header) as parse_read:
        assert _outcome(_reading(warm), bad, max_numel) == got
    assert _outcome(_reading(make_codec(name)), bad, max_numel) == got
    if kind == "none" and len(warm._seen):  # and a sound repeat where it lies, as decode does
        assert parse_read.call_count == 0
    if kind == "none":
        assert got[0] == "ok"
        if len(warm._seen):  # a sound repeat is decoded without parsing its header again
            assert parse.call_count == 0


def test_a_header_decoded_before_still_meets_a_lowered_decode_bound():
    """``set_max_decoded_bytes`` applies to a header decoded before as to a new one."""
    codec = make_codec("fp32")
    x = torch.arange(64, dtype=torch.float32)
    p = codec.encode(x)
    assert torch.equal(codec.decode(p), x)
    old = set_max_decoded_bytes(255)
    try:
        with pytest.raises(CodecError, match=r"256-byte tensor .* bound of 255 bytes"):
            codec.decode(p)
    finally:
        set_max_decoded_bytes(old)
    assert torch.equal(codec.decode(p), x)


def test_a_bool_header_decoded_before_still_has_its_values_checked():
    """A bool body byte other than 0 or 1 is refused after a bool payload of the same shape was
    decoded (bool payloads are always decoded by the general path, which checks the values)."""
    codec = make_codec("identity")
    x = torch.tensor([True, False, True])
    assert torch.equal(codec.decode(codec.encode(x)), x)
    raw = bytearray(codec.encode(x).tobytes())
    h0 = len(raw) - 3
    raw[-2] = 2
    struct.pack_into("<I", raw, h0 - 8, zlib.crc32(bytes(raw[h0:])))  # both CRCs made good again
    struct.pack_into("<I", raw, h0 - 4, zlib.crc32(bytes(raw[: h0 - 4])))
    with pytest.raises(CodecError, match=r"^corrupted body: bool value other than 0 or 1$"):
        codec.decode(Payload.frombytes(raw))


def test_the_plans_and_headers_a_codec_keeps_stay_few():
    """A stream of new shapes does not grow what a codec keeps without bound (64 of each)."""
    codec = make_codec("fp32")
    most = 0
    for n in range(1, 200):
        codec.decode(codec.encode(torch.zeros(n)))
        most = max(most, len(codec._plans), len(codec._seen))
    assert most == 64


# (codec, input dtype): every transmit dtype, with and without a cast back
REPEATS = [("identity", torch.float32), ("identity", torch.int64), ("identity", torch.uint8),
           ("fp32", torch.float64), ("fp16", torch.float32), ("bf16", torch.float32),
           ("fp64", torch.float32)]


@pytest.mark.parametrize(("name", "dtype"), REPEATS)
def test_repeats_take_the_short_paths_and_give_what_the_format_says(name, dtype):
    """A pipeline's case: one shape message after message, decoded by a receiver that expects
    exactly its element count.  From the second message on, encode makes no input checks and
    header of its own and decode does not parse the header again, and both still give what
    the format defines: the payload written out here, and the input in its transmit dtype,
    cast back (several messages, so CRCs of either sign of a signed 32-bit reading occur)."""
    codec, shape = make_codec(name), (2, 3, 5)
    send = dtype if name == "identity" else CASTS[name]
    codec.decode(codec.encode(_tensor(0, dtype, shape)), max_numel=30)
    with mock.patch.object(dense, "check_input", wraps=dense.check_input) as checked, \
            mock.patch.object(dense, "parse_header", wraps=dense.parse_header) as parsed:
        for seed in range(1, 9):
            x = _tensor(seed, dtype, shape)
            p = codec.encode(x)
            assert p.tobytes() == _payload(x, name, True)
            out = codec.decode(p, max_numel=30)
            assert out.dtype == dtype and out.shape == x.shape
            assert torch.equal(out, x.to(send).to(dtype))
    assert checked.call_count == 0 and parsed.call_count == 0
