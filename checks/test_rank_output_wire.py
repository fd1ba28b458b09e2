"""Rank outputs cross the control plane as validated bytes, never pickles:
every field round-trips exactly (parameters bit for bit), and malformed bytes
are a RankOutputError, not an allocation or a wrong result."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.context import RankOutput
from harness.rank_output_wire import MAGIC, RankOutputError, decode, encode

floats = st.floats(allow_nan=False, width=64)


def _output(seed: int, shapes, history, extra) -> RankOutput:
    g = torch.Generator().manual_seed(seed)
    return RankOutput(
        rank=1, params=[(3 * i, torch.randn(s, generator=g)) for i, s in enumerate(shapes)],
        history=history, step_times=[0.5, 1e-300, 3.0], peak_memory_bytes=123456,
        peak_memory_growth_bytes=0, peak_memory_reset=True, peak_tensor_bytes=4096,
        peak_tensor_growth_bytes=None, sent_bytes=10, sent_messages=2,
        received_bytes=9, framing_bytes=32, bytes_by_tag={"act": (10, 2), "": (0, 0)},
        tokens_per_step=64, wire_tx_bytes=None, wire_rx_bytes=77, extra=extra)


@given(seed=st.integers(0, 2**31 - 1),
       shapes=st.lists(st.lists(st.integers(0, 5), max_size=3).map(tuple), max_size=4),
       history=st.dictionaries(st.text(max_size=5), st.lists(floats, max_size=4), max_size=3),
       extra=st.dictionaries(st.text(max_size=5), st.tuples(floats, st.text(max_size=3)), max_size=3))
def test_every_field_round_trips_exactly(seed, shapes, history, extra):
    out = _output(seed, shapes, history, extra)
    back = decode(encode(out), 1)
    for name in RankOutput.__dataclass_fields__:
        if name != "params":
            assert getattr(back, name) == getattr(out, name), name
    assert [i for i, _ in back.params] == [i for i, _ in out.params]
    for (_, a), (_, b) in zip(back.params, out.params, strict=True):
        assert a.shape == b.shape and a.dtype == torch.float32
        # bit for bit: compare the raw bytes, not the values
        assert a.reshape(-1).view(torch.uint8).tolist() == b.reshape(-1).view(torch.uint8).tolist()


def test_a_diverged_loss_survives():
    out = _output(0, [(2,)], {"loss": [float("nan"), float("inf")]}, {})
    back = decode(encode(out), 1)
    assert str(back.history["loss"]) == "[nan, inf]"


_FIXED = len(MAGIC) + 12  # magic, u64 header length, u32 CRC-32


def _framed(h: bytes, rest: bytes) -> bytes:
    """A well-checksummed output around a (crafted) header and body."""
    return MAGIC + struct.pack("<QI", len(h), zlib.crc32(h + rest)) + h + rest


def _with_header(edit, body: bytes | None = None) -> bytes:
    data = encode(_output(0, [(2, 3)], {"loss": [1.0]}, {}))
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    head = json.loads(data[_FIXED:_FIXED + n])
    edit(head)
    h = json.dumps(head).encode()
    rest = data[_FIXED + n:] if body is None else body
    return _framed(h, rest)


@pytest.mark.parametrize("data,match", [
    (b"", "bad magic"),
    (b"\x80\x04K\x01.", "bad magic"),  # a pickle
    (MAGIC + struct.pack("<QI", 2**60, 0), "exceeds"),
    (_framed(b"{x}", b""), "not JSON"),
    (MAGIC + struct.pack("<QI", 3, 0) + b"{x}", "checksum"),
    (_with_header(lambda h: h.update(rank=2)), "claims to be rank 2"),
    (_with_header(lambda h: h.update(params=[[0, [2**20, 2**20]]])), "more than the 24 body bytes"),
    (_with_header(lambda h: h.update(params=[[0, [0, 2**70]]])), "dimension over"),
    (_with_header(lambda h: h.update(params=[[0, [-1]]])), "dimension must be an integer >= 0"),
    (_with_header(lambda h: None, body=b"\0" * 25), "1 body bytes follow"),
    (_with_header(lambda h: None, body=b"\0" * 23), "more than the 23 body bytes"),
    (_with_header(lambda h: h.update(history={"loss": ["1"]})), "must be a number"),
    (_with_header(lambda h: h.update(sent_bytes=True)), "sent_bytes must be an integer"),
    (_with_header(lambda h: h.update(byteorder="middle")), "byte order"),
    (_with_header(lambda h: h.update(extra={"x": [1.0, 2]})), "unit must be a string"),
    (_with_header(lambda h: h.update(bytes_by_tag={"x": [1]})), "list of 2"),
], ids=lambda v: v if isinstance(v, str) else "bytes")
def test_malformed_bytes_are_a_clear_error(data, match):
    with pytest.raises(RankOutputError, match=match):
        decode(data, 1)


def test_every_bit_flip_is_an_error_never_another_value():
    data = encode(_output(0, [(2, 3)], {"loss": [1.0, 0.5]}, {"x": (2.0, "s")}))
    for bit in range(8 * len(data)):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(RankOutputError):
            decode(bytes(flipped), 1)
