"""Property checks for the message codecs ``ids`` (token ids) and ``sparse-qstoch``
(the parameter server's sparse b-bit gradient): exact round trips on their
domains, counted bytes = closed forms, the laws they declare, and refusal of
out-of-range ids, non-finite scales and truncated or corrupted payloads."""

from __future__ import annotations

import math
import re
import struct
import zlib

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from algorithms.codecs import (
    CODECS,
    CodecError,
    Payload,
    decode,
    elias_fano,
    make_codec,
    qstoch_law,
)
from algorithms.codecs._core import FAMILY_SPARSE_QSTOCH, build_header, seal
from algorithms.codecs.ids import id_nbytes, ids_nbytes
from algorithms.codecs.sparse_qstoch import sparse_qstoch_nbytes

seeds = st.integers(0, 2**32 - 1)
VOCABS = (256, 50257, 50272, 32000, 2**16, 2**16 + 1)
WIDTH = {256: 1, 50257: 2, 50272: 2, 32000: 2, 2**16: 2, 2**16 + 1: 4}  # bytes per id


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _corruptions(p: Payload, header: int):
    """Every truncation, one extension, and a flip of every header byte."""
    for cut in range(p.nbytes):
        yield Payload(p.data[:cut].clone())
    yield Payload(torch.cat([p.data, torch.zeros(1, dtype=torch.uint8)]))
    for pos in range(header):
        d = p.data.clone()
        d[pos] ^= 0x5A
        yield Payload(d)


# ============================================================================ ids
@given(seeds, st.sampled_from(VOCABS), st.lists(st.integers(0, 6), max_size=3),
       st.sampled_from([torch.int64, torch.int32]))
def test_ids_round_trip_edges_and_random_ids(seed, vocab, shape, dtype):
    codec = make_codec(f"ids:vocab={vocab}")
    x = torch.randint(0, vocab, tuple(shape), generator=gen(seed), dtype=torch.int64)
    if x.numel() >= 2:  # the edges of the range, always
        x.view(-1)[0], x.view(-1)[-1] = 0, vocab - 1
    x = x.to(dtype)
    p = codec.encode(x)
    assert p.nbytes == codec.encoded_nbytes(x) == ids_nbytes(tuple(shape), vocab)
    assert p.nbytes == 18 + 4 * len(shape) + x.numel() * WIDTH[vocab] and id_nbytes(vocab) == WIDTH[vocab]
    for y in (codec.decode(p), decode(p), make_codec("ids:vocab=2").decode(p)):  # the header says V
        assert y.dtype == dtype and torch.equal(y, x)
    assert codec.is_lossless_on(x)
    assert 0 <= codec.floor_bits(x) <= 8 * p.nbytes


@pytest.mark.parametrize("vocab", VOCABS)
def test_ids_edges_one_by_one(vocab):
    codec = make_codec(f"ids:vocab={vocab}")
    x = torch.tensor([0, vocab - 1, vocab // 2])
    assert torch.equal(codec.decode(codec.encode(x)), x)
    for bad in (-1, vocab):
        y = torch.tensor([0, bad])
        assert not codec.is_lossless_on(y)
        with pytest.raises(CodecError, match="must lie in"):
            codec.encode(y)


def test_ids_refuse_floats_bad_specs_and_ids_beyond_the_vocabulary():
    msg = "ids: dtype torch.float32 is not supported (supported: uint8, int8, int16, int32, int64)"
    with pytest.raises(CodecError, match=re.escape(msg)):
        make_codec("ids:vocab=256").encode(torch.tensor([1.0]))
    for spec in ("ids", "ids:vocab=0", "ids:vocab=x", f"ids:vocab={2**32 + 1}", "ids:vocab=5,bits=4"):
        with pytest.raises(CodecError):
            make_codec(spec)
    assert make_codec("ids:vocab=300").spec() == "ids:vocab=300" and "ids" not in CODECS
    p = make_codec("ids:vocab=300").encode(torch.tensor([299, 7]))  # 2 bytes each, room for 300
    d = p.data.clone()
    d[-4:-2] = torch.tensor([44, 1], dtype=torch.uint8)  # little-endian 300
    seal(d)  # a well-checksummed body: the vocabulary check must catch it
    with pytest.raises(CodecError, match=">= vocab"):
        decode(Payload(d))


def test_ids_truncated_or_corrupted_payloads_are_refused():
    codec = make_codec("ids:vocab=50272")
    p = codec.encode(torch.tensor([[1, 50271], [0, 3]]))
    for bad in _corruptions(p, 18 + 4 * 2):
        with pytest.raises(CodecError):
            codec.decode(bad)


# ============================================================================ sparse-qstoch
def _sparse(seed: int, shape, density: float, dtype) -> torch.Tensor:
    g = gen(seed)
    keep = torch.rand(shape, generator=g, dtype=torch.float64) < density
    return torch.where(keep, torch.randn(shape, generator=g, dtype=torch.float64), 0.0).to(dtype)


@given(seeds, st.integers(2, 16), st.lists(st.integers(1, 40), min_size=1, max_size=2),
       st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
       st.sampled_from([torch.float64, torch.float32]))
def test_sparse_qstoch_bytes_law_and_round_trip(seed, bits, shape, density, dtype):
    codec = make_codec(f"sparse-qstoch:bits={bits}")
    x = _sparse(seed, tuple(shape), density, dtype)
    n, nnz = x.numel(), int(torch.count_nonzero(x))
    p = codec.encode(x, gen(seed))
    w = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    assert p.nbytes == codec.encoded_nbytes(x) == sparse_qstoch_nbytes(n, nnz, bits, x.dim())
    codes = math.ceil(nnz * bits / 8)  # the cheapest of index list, bitmap, dense codes, Elias–Fano
    body = min(math.ceil(nnz * w / 8) + codes, math.ceil(n / 8) + codes, math.ceil(n * bits / 8))
    if nnz:
        low = math.floor(math.log2(n / nnz))
        body = min(body, math.ceil(nnz * low / 8) + math.ceil((nnz + (n - 1) // 2**low) / 8) + codes)
    assert p.nbytes == 23 + 4 * x.dim() + body
    assert torch.equal(p.data, codec.encode(x, gen(seed)).data)  # the generator is the only randomness
    y = decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype and torch.equal(codec.decode(p), y)
    assert bool((y[x == 0] == 0).all())  # zeros stay zeros
    assert 0 <= codec.floor_bits(x) <= 8 * p.nbytes
    if nnz == 0:
        return
    vals = x[x != 0]
    law = qstoch_law(vals, bits)
    lo = (law.delta * law.k_lo.to(torch.float64)).to(dtype)
    hi = (law.delta * (law.k_lo + 1).to(torch.float64)).to(dtype)
    got = y[x != 0]
    assert bool(((got == lo) | ((got == hi) & (law.p > 0))).all())  # the two neighbours of the law
    xd, R = vals.to(torch.float64), law.resolution_bits
    bias = (law.mean() - xd).abs()  # unbiased up to the 2^-R grid and the float32 δ
    assert bool((bias <= law.delta * 2.0 ** (-R - 1) * (1 + 1e-9) + 2.0**-23 * xd.abs()).all())
    omega = codec.contraction_bound(n)
    assert law.mse(vals) <= omega**2 * float((xd**2).sum()) * (1 + 1e-6) + n * law.delta**2 * 2.0**-20
    if codec.is_lossless_on(x):
        assert torch.equal(y, x)


def test_sparse_qstoch_lossless_on_its_grid():
    x = torch.tensor([0.0, 3.0, 0.0, -1.0, 2.0, 0.0], dtype=torch.float64)  # δ = 1 at 3 bits
    codec = make_codec("sparse-qstoch:bits=3")
    assert codec.is_lossless_on(x)
    assert torch.equal(codec.decode(codec.encode(x)), x)
    assert not codec.is_lossless_on(torch.tensor([3.0, 0.5]))


def test_sparse_qstoch_refuses_non_finite_inputs_and_scales():
    codec = make_codec("sparse-qstoch:bits=4")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(CodecError, match="NaN or infinity"):
            codec.encode(torch.tensor([1.0, bad, 0.0]))
    with pytest.raises(CodecError, match="normal float32"):
        codec.encode(torch.tensor([1e300, 0.0], dtype=torch.float64))  # δ overflows float32
    good = codec.encode(torch.tensor([0.0, 1.0, -1.0]))
    body = good.data[23 + 4:]
    for delta, nnz in ((float("nan"), 2), (float("inf"), 2), (-1.0, 2), (0.0, 2), (1.0, 0), (1e-40, 2)):
        head = build_header(FAMILY_SPARSE_QSTOCH, torch.float32, (3,), struct.pack("<BfI", 4, delta, nnz))
        payload = torch.cat([torch.frombuffer(bytearray(head), dtype=torch.uint8), body[: 2 if nnz else 0]])
        seal(payload)
        with pytest.raises(CodecError, match="scale"):
            decode(Payload(payload))


def _forged(params: bytes, body: list[int], n: int = 5) -> Payload:
    head = build_header(FAMILY_SPARSE_QSTOCH, torch.float32, (n,), params)
    data = torch.frombuffer(bytearray(head + bytes(body)), dtype=torch.uint8)
    seal(data)  # a forged but well-checksummed payload: the structural checks must catch it
    return Payload(data)


def test_sparse_qstoch_refuses_malformed_bodies():
    p = struct.pack("<BfI", 4, 1.0, 2)
    # 5 entries: 3-bit indices, then 4-bit codes (offset 8)
    ok = _forged(p, [0b001_011_00, 0x9A])  # indices 1, 3; codes 9, 10
    assert torch.equal(decode(ok), torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0]))
    for body, match in (([0b011_001_00, 0x9A], "increasing"),  # 3 then 1
                        ([0b001_001_00, 0x9A], "increasing"),  # repeated
                        ([0b001_110_00, 0x9A], "range"),  # index 6 >= 5
                        ([0b001_011_01, 0x9A], "padding"),  # nonzero padding bit
                        ([0b001_011_00, 0x09], "code 0")):
        with pytest.raises(CodecError, match=match):
            decode(_forged(p, body))
    with pytest.raises(CodecError, match="nnz"):
        decode(_forged(struct.pack("<BfI", 4, 1.0, 6), [0] * 6))
    with pytest.raises(CodecError, match="bits"):
        decode(_forged(struct.pack("<BfI", 1, 1.0, 0), []))
    bitmap = struct.pack("<BfI", 4 | 1 << 6, 1.0, 2)  # 5 entries: 1 bitmap byte, then the codes
    assert torch.equal(decode(_forged(bitmap, [0b0101_0000, 0x9A])), torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0]))
    for body, match in (([0b0111_0000, 0x9A], "set bits"), ([0b0101_0100, 0x9A], "padding|set bits"),
                        ([0b0101_0000, 0x90], "code 0")):
        with pytest.raises(CodecError, match=match):
            decode(_forged(bitmap, body))
    dense = struct.pack("<BfI", 4 | 2 << 6, 1.0, 2)  # 5 codes, zeros as the code 8
    assert torch.equal(decode(_forged(dense, [0x89, 0x8A, 0x80])), torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0]))
    with pytest.raises(CodecError, match="bits byte"):  # bit 5 is not part of the width
        decode(_forged(struct.pack("<BfI", 4 | 1 << 5, 1.0, 2), [0x89, 0x8A, 0x80]))
    # Elias–Fano: l = floor(log2(5/2)) = 1; low bits 1, 1 (indices 1, 3); highs 0, 1 set
    # upper bits 0 + 0 and 1 + 1 of 2 + (4 >> 1) = 4; then the codes 9, 10
    ef = struct.pack("<BfI", 4 | 3 << 6, 1.0, 2)
    assert torch.equal(decode(_forged(ef, [0b1100_0000, 0b1010_0000, 0x9A])),
                       torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0]))
    increasing = "Elias–Fano index list is not strictly increasing"
    for body, match in (([0b1100_0000, 0b1110_0000, 0x9A], "has 3 ones"),  # three ones
                        ([0b1000_0000, 0b1100_0000, 0x9A], increasing),  # highs 0, 0, lows 1, 0
                        ([0b1100_0000, 0b1100_0000, 0x9A], increasing),  # 1, 1: repeated
                        ([0b1100_0000, 0b1001_0000, 0x9A], "index 5 out of range"),  # highs 0, 2
                        ([0b1110_0000, 0b1010_0000, 0x9A], "padding"),
                        ([0b1100_0000, 0b1010_1000, 0x9A], "padding")):
        with pytest.raises(CodecError, match=match):
            decode(_forged(ef, body))
    # three of 7: l = 1, low fields 0, 1, 0 (indices 0, 3, 6), highs 0, 1, 3 as ones at 0, 2, 5
    # of 3 + (6 >> 1) = 6 bits; codes 9, 9, 10
    ef3 = struct.pack("<BfI", 4 | 3 << 6, 1.0, 3)
    assert torch.equal(decode(_forged(ef3, [0b0100_0000, 0b1010_0100, 0x99, 0xA0], n=7)),
                       torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0]))
    for body, match in (([0b0110_0000, 0b1010_0100, 0x99, 0xA0], "index 7 out of range"),  # 0, 3, 7
                        ([0b0100_0000, 0b1011_0000, 0x99, 0xA0], increasing)):  # 0, 3, 2
        with pytest.raises(CodecError, match=match):
            decode(_forged(ef3, body, n=7))


def test_an_index_list_is_checked_at_both_ends_and_throughout():
    """The index-list positions (sparse-qstoch's layout 0, ``sparse``'s and ``qchannel``'s coo:
    one decoder): a single index, and in a list of three the last one against ``n`` and every
    neighbour against the one before, not only the first."""
    one = struct.pack("<BfI", 4, 1.0, 1)  # 5 entries: a 3-bit index, then a 4-bit code
    assert torch.equal(decode(_forged(one, [0b100_00000, 0x90])), torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]))
    with pytest.raises(CodecError, match="^corrupted body: index out of range for 5 elements$"):
        decode(_forged(one, [0b101_00000, 0x90]))  # index 5 = n
    three = struct.pack("<BfI", 4, 1.0, 3)  # 9 index bits (2 bytes), then 12 code bits (2 bytes)
    assert torch.equal(decode(_forged(three, [0b000_010_10, 0b0_0000000, 0x99, 0xA0])),  # 0, 2, 4
                       torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0]))
    with pytest.raises(CodecError, match="^corrupted body: index out of range for 5 elements$"):
        decode(_forged(three, [0b000_010_10, 0b1_0000000, 0x99, 0xA0]))  # 0, 2, 5
    with pytest.raises(CodecError, match="^corrupted body: index list is not strictly increasing$"):
        decode(_forged(three, [0b001_100_01, 0b0_0000000, 0x99, 0xA0]))  # 1, 4, 2


@given(seeds, st.integers(2, 8), st.sampled_from([0.02, 0.3, 0.95]))
def test_sparse_qstoch_layouts_carry_the_same_values(seed, bits, density):
    """The cheapest layout is the one sent, and every layout decodes to the same tensor."""
    from algorithms.codecs.sparse_qstoch import (
        LAYOUT_SHIFT,
        PARAMS,
        SparseQStochCodec,
        choose_layout,
    )

    x = _sparse(seed, (200,), density, torch.float32)
    n, nnz = x.numel(), int(torch.count_nonzero(x))
    codec = SparseQStochCodec(bits)
    p = codec.encode(x, gen(seed))
    assert PARAMS.unpack(bytes(p.data[10:19].tolist()))[0] >> LAYOUT_SHIFT == choose_layout(n, nnz, bits)
    sizes = []
    for layout in range(4):
        q = codec._encode(x, gen(seed), layout)
        seal(q.data)  # encode() seals; the private entry point does not
        assert torch.equal(decode(q), decode(p))
        sizes.append(q.nbytes)
    assert p.nbytes == min(sizes)


def _elias_fano_stream(idx: list[int], n: int) -> bytes:
    """The documented stream (``elias_fano`` module docstring), written by a loop: k low fields of
    l = floor(log2(n/k)) bits, then an upper stream with bit ``(index >> l) + i`` set for the i-th
    index among ``k + (n-1) >> l``, each padded with zero bits to whole bytes."""
    k = len(idx)
    low = math.floor(math.log2(n / k))
    low_bits = "".join(format(i % 2**low, f"0{low}b") if low else "" for i in idx)
    upper = ["0"] * (k + (n - 1) // 2**low)
    for i, v in enumerate(idx):
        upper[v // 2**low + i] = "1"

    def padded(bits: str) -> bytes:
        bits += "0" * (-len(bits) % 8)
        return bytes(int(bits[j: j + 8], 2) for j in range(0, len(bits), 8))

    return padded(low_bits) + padded("".join(upper))


def _elias_fano_round_trip(idx: torch.Tensor, n: int) -> bytes:
    k = idx.numel()
    lo_nbytes, up_nbytes = elias_fano.sections(n, k)
    buf = torch.zeros(lo_nbytes + up_nbytes, dtype=torch.uint8)
    elias_fano.encode(idx, n, buf)
    got = elias_fano.decode(buf, n, k)
    assert got.dtype == torch.int64 and torch.equal(got, idx)
    return bytes(buf.tolist())


@given(seeds, st.integers(1, 3000), st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)))
def test_elias_fano_stream_size_and_bound(seed, n, density):
    """Random position sets: the stream a loop writes, at most ``k (2 + ceil(log2(n/k)))`` bits
    (Elias 1974) and at least the floor log2 C(n, k)."""
    keep = torch.rand(n, generator=gen(seed), dtype=torch.float64) < density
    idx = torch.nonzero(keep).reshape(-1)
    k = idx.numel()
    got = _elias_fano_round_trip(idx, n)
    if k == 0:
        assert got == b"" and elias_fano.sections(n, 0) == (0, 0)
        return
    assert got == _elias_fano_stream(idx.tolist(), n)
    low = math.floor(math.log2(n / k))
    nbits = k * low + k + (n - 1) // 2**low
    assert math.log2(math.comb(n, k)) - 1e-9 <= nbits <= k * (2 + math.ceil(math.log2(n / k)))


@pytest.mark.parametrize(("n", "idx"), [
    (1, [0]), (2, [0, 1]), (5, [0, 2, 4]), (5, [1, 2, 3]), (8, [7]), (9, [8]), (16, list(range(16))),
    (1000, [999]), (1000, [0, 1, 998, 999]), (2**20, [0, 2**20 - 1]),
])
def test_elias_fano_stream_at_the_edges(n, idx):
    """Where a section's length crosses a byte (n = 5, k = 3: a 7-bit upper stream), l = 0
    (k > n/2), an index at n - 1, and a range of 2**20."""
    assert _elias_fano_round_trip(torch.tensor(idx), n) == _elias_fano_stream(idx, n)


@pytest.mark.parametrize("workers", [1, 3])
def test_sparse_qstoch_survivors_of_a_large_tensor_are_torch_nonzero(workers, monkeypatch):
    """Above ``PARALLEL_MIN_ELEMENTS`` the positions come from numpy in blocks on the codec pool
    (3 blocks of unequal length here): the same list as ``torch.nonzero``, -0.0 a zero, with
    survivors on both sides of every block edge."""
    from algorithms.codecs import _rng
    from algorithms.codecs.sparse_qstoch import PARALLEL_MIN_ELEMENTS, SparseQStochCodec

    monkeypatch.setattr(_rng, "_CORES", workers)
    monkeypatch.setattr(torch, "get_num_threads", lambda: workers)
    monkeypatch.setattr(_rng, "_pool", None)
    n = 3 * PARALLEL_MIN_ELEMENTS + 5
    x = _sparse(7, (n,), 0.1, torch.float32)
    per = -(-n // 3)
    for edge in (per - 1, per, 2 * per - 1, 2 * per, n - 1):
        x[edge] = 1.5
    x[x.abs() > 2.5] = -0.0
    idx, vals = SparseQStochCodec(4)._survivors(x)
    assert torch.equal(idx, torch.nonzero(x).reshape(-1)) and torch.equal(vals, x[idx])


def test_sparse_qstoch_truncated_or_corrupted_payloads_are_refused():
    codec = make_codec("sparse-qstoch:bits=5")
    x = torch.tensor([0.5, 0.0, -1.25, 0.0, 3.0, 0.0, 0.0, 2.0])
    p = codec.encode(x, gen(0))
    # bitmap (1 + 3 bytes) beats the index list (2 + 3) and the dense codes (5)
    assert p.data[10] >> 6 == 1 and p.data[27].item() == 0b1010_1001
    for bad in _corruptions(p, 23 + 4):
        with pytest.raises(CodecError):
            codec.decode(bad)


@given(seeds, st.data(), st.integers(1, 255))
def test_sparse_qstoch_body_byte_flips_never_crash(seed, data, flip):
    x = _sparse(seed, (30,), 0.4, torch.float32)
    p = make_codec("sparse-qstoch:bits=3").encode(x, gen(seed))
    assume(p.nbytes > 27)
    d = p.data.clone()
    d[data.draw(st.integers(27, p.nbytes - 1))] ^= flip
    if data.draw(st.booleans()):
        seal(d)  # re-checksummed: the structural checks alone must hold
    try:
        y = decode(Payload(d))
    except CodecError:
        return
    assert y.shape == x.shape and y.dtype == x.dtype


def test_header_crc_covers_the_new_parameters():
    p = make_codec("sparse-qstoch:bits=4").encode(torch.tensor([1.0, 0.0]))
    head = bytes(p.data[:27].tolist())
    assert struct.unpack("<I", head[-4:])[0] == zlib.crc32(head[:-4])


@pytest.mark.parametrize("spec", ["identity", "fp16", "qstoch:bits=4", "topk:k=3", "ids:vocab=256"])
def test_a_flipped_body_bit_is_caught_by_the_body_crc(spec):
    # Every structural check passes on a body whose value bits changed (a float,
    # a code, an id), so only the CRC-32 of the body (version 2 headers, on by
    # default) tells the receiver; without it the same payload decodes to other
    # values, silently.
    from algorithms.codecs._core import parse_header, set_body_checksum

    codec = make_codec(spec)
    x = (torch.arange(16, dtype=torch.int64) * 7 % 256 if spec.startswith("ids")
         else torch.linspace(-2.0, 3.0, 16))
    for checksum in (True, False):
        old = set_body_checksum(checksum)
        try:
            p = codec.encode(x, generator=gen(0))
        finally:
            set_body_checksum(old)
        hdr = parse_header(p.data)
        assert (hdr.body_crc is not None) == checksum
        d = p.data.clone()
        d[-1] ^= 0x01  # the last body byte's lowest bit: a value bit, not padding
        if checksum:
            assert hdr.body_crc == zlib.crc32(p.data[hdr.nbytes:].numpy())
            with pytest.raises(CodecError, match=r"^corrupted body: CRC-32 mismatch$"):
                decode(Payload(d))
        else:
            assert not torch.equal(decode(Payload(d)), decode(p))


def _resealed(p: Payload, edit, h0: int | None = None) -> Payload:
    """A payload's bytes with ``edit(bytearray)`` applied and both CRCs recomputed at the
    original layout (``h0``: where its body starts; a dense payload's by default), so the
    decoder meets the edited field itself, not a checksum mismatch."""
    raw = bytearray(p.tobytes())
    h0 = _dense_h0(raw[5]) if h0 is None else h0
    edit(raw)
    struct.pack_into("<I", raw, h0 - 8, zlib.crc32(bytes(raw[h0:])))  # the body CRC
    struct.pack_into("<I", raw, h0 - 4, zlib.crc32(bytes(raw[: h0 - 4])))  # the header CRC
    return Payload(torch.frombuffer(raw, dtype=torch.uint8))


def _dense_h0(ndim: int) -> int:
    return 14 + 4 * ndim + 1  # the dense family's parameter block is one byte


@pytest.mark.parametrize(("name", "edit", "message"), [
    ("bad magic", lambda r: r.__setitem__(slice(0, 2), b"XB"), r"bad magic b'XB'"),
    ("version", lambda r: r.__setitem__(2, 9), r"unsupported payload version 9 "),
    ("codec id", lambda r: r.__setitem__(3, 99), r"unknown codec id 99 in payload header"),
    ("dtype code", lambda r: r.__setitem__(4, 99), r"corrupted header: unknown dtype code 99$"),
    ("ndim", lambda r: r.__setitem__(5, 17), r"corrupted header: ndim 17 > 16$"),
    ("header bit", lambda r: r.__setitem__(6, r[6] ^ 1), r"^corrupted header: CRC-32 mismatch$"),
    ("transmit dtype", lambda r: r.__setitem__(_dense_h0(1) - 9, 99),
     r"unknown transmit dtype code 99$"),
])
def test_each_header_defect_is_named_in_the_error(name, edit, message):
    """Every field the header parse checks names itself and its value in the CodecError (the
    message is what a user debugging a peer's payload reads)."""
    p = make_codec("identity").encode(torch.arange(6, dtype=torch.float32))
    if name == "header bit":  # not resealed: the header CRC must catch it
        raw = bytearray(p.tobytes())
        edit(raw)
        bad = Payload(torch.frombuffer(raw, dtype=torch.uint8))
    else:
        bad = _resealed(p, edit)
    with pytest.raises(CodecError, match=message):
        decode(bad)


@pytest.mark.parametrize("spec", ["sparse", "sparse:bits=8", "qchannel:bits=4"])
@pytest.mark.parametrize("fmt", [3, 4, 255])
def test_a_positions_format_the_codec_does_not_offer_is_refused(spec, fmt):
    """``sparse`` and ``qchannel`` headers name one of dense, bitmap and coo (codes 0-2); any
    other code is a CodecError, including 3, Elias–Fano, which the shared positions code writes
    for sparse-qstoch only."""
    x = torch.tensor([0.0, 3.0, 0.0, -2.0, 0.0, 0.0, 1.0, 0.0])
    from algorithms.codecs._core import parse_header

    if spec == "sparse:bits=8":
        x = x.to(torch.int32)
    p = make_codec(spec).encode(x, generator=gen(0))
    # the parameter block after a 1-D shape: (bits, flags, format, k)
    bad = _resealed(p, lambda r: r.__setitem__(6 + 4 + 2, fmt), h0=parse_header(p.data).nbytes)
    with pytest.raises(CodecError, match=rf"^corrupted header: unknown sparse format code {fmt}$"):
        decode(bad)


def test_truncated_and_overlong_payloads_say_by_how_much():
    p = make_codec("identity").encode(torch.arange(6, dtype=torch.float32))
    n, h0 = p.nbytes, _dense_h0(1)
    with pytest.raises(CodecError, match=rf"^truncated payload: {h0 - 1} bytes, header needs {h0}$"):
        decode(Payload(p.data[: h0 - 1].clone()))
    with pytest.raises(CodecError, match=rf"^truncated payload: {n - 1} bytes, header announces {n}$"):
        decode(Payload(p.data[:-1].clone()))
    longer = torch.cat([p.data, torch.zeros(3, dtype=torch.uint8)])
    with pytest.raises(CodecError, match=rf"^payload has 3 trailing bytes after the {n} announced$"):
        decode(Payload(longer))


def test_a_payload_of_exactly_the_expected_count_decodes_and_one_more_is_refused():
    """``max_numel`` is the most elements the receiver expects: a payload of exactly that many
    decodes (a pipeline's receiver expects its largest boundary tensor, which most are)."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    p = make_codec("fp32").encode(x)
    assert torch.equal(make_codec("fp32").decode(p, max_numel=12), x)
    with pytest.raises(CodecError, match=r"announces 12 elements \(3, 4\); the receiver expects at most 11$"):
        make_codec("fp32").decode(p, max_numel=11)


def test_a_bool_body_byte_other_than_0_or_1_is_refused():
    p = make_codec("identity").encode(torch.tensor([True, False, True]))
    assert torch.equal(decode(p), torch.tensor([True, False, True]))
    for byte in (2, 255):
        bad = _resealed(p, lambda r, b=byte: r.__setitem__(len(r) - 2, b))
        with pytest.raises(CodecError, match=r"^corrupted body: bool value other than 0 or 1$"):
            decode(bad)


def test_inputs_a_header_cannot_carry_are_refused_by_name():
    """A tensor of 17 dimensions, or of 2**32 elements (an expanded view: no memory), or not a
    tensor at all, is refused by the encoder, naming the codec; 16 dimensions are carried."""
    codec = make_codec("fp32")
    sixteen = torch.ones((1,) * 16)
    assert torch.equal(codec.decode(codec.encode(sixteen)), sixteen)
    with pytest.raises(CodecError, match=r"^fp32: 17 dimensions, at most 16 are supported$"):
        codec.encode(torch.ones((1,) * 17))
    huge = torch.zeros(1).expand(1 << 16, 1 << 16)  # 2**32 elements, each dimension small
    with pytest.raises(CodecError, match=r"^fp32: tensors with 2\*\*32 or more elements are not supported$"):
        codec.encode(huge)
    with pytest.raises(CodecError, match=r"^fp32: expected a torch.Tensor, got list$"):
        codec.encode([1.0])
    with pytest.raises(CodecError, match=r"^fp32: dtype torch.complex64 is not supported"):
        codec.encode(torch.zeros(2, dtype=torch.complex64))


def test_write_raw_refuses_a_body_of_another_length():
    from algorithms.codecs._core import write_raw

    out = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(CodecError, match=r"^body of 7 bytes for 8$"):
        write_raw(out, 3, torch.zeros(2, dtype=torch.float32))
    write_raw(out, 2, torch.tensor([1.0, -2.0]))
    assert out[2:].numpy().tobytes() == struct.pack("<2f", 1.0, -2.0)


@pytest.mark.parametrize(("n", "message"), [
    # the decoder's per-byte cap (no max_numel): 65536 elements per payload byte
    (lambda size: (1 << 16) * size + 1, r"^payload of \d+ bytes announces \d+ elements \(\d+,\): more than "
                                        r"65536 per byte \(pass max_numel, the count the receiver "
                                        r"expects, to decode larger sparse tensors\)$"),
    # exactly at the cap: not refused by it, but by the body its header implies
    (lambda size: (1 << 16) * size, r"^truncated payload: \d+ bytes, header announces \d+$"),
    # 2**32 - 1 elements still have a count a header can carry: the per-byte cap refuses them
    (lambda size: (1 << 32) - 1, r"more than 65536 per byte"),
])
def test_a_header_announcing_more_elements_than_its_bytes_allow_is_refused(n, message):
    p = make_codec("identity").encode(torch.zeros(3, dtype=torch.uint8))
    count = n(p.nbytes)
    bad = _resealed(p, lambda r: struct.pack_into("<I", r, 6, count))
    with pytest.raises(CodecError, match=message):
        decode(bad)


def test_a_shape_of_2_to_the_32_elements_is_a_corrupted_header():
    p = make_codec("identity").encode(torch.zeros(2, 2, dtype=torch.uint8))
    bad = _resealed(p, lambda r: struct.pack_into("<2I", r, 6, 1 << 16, 1 << 16))
    with pytest.raises(CodecError, match=r"^corrupted header: shape \(65536, 65536\) has 4294967296 "
                                         r">= 2\*\*32 elements$"):
        decode(bad, max_numel=1 << 40)
