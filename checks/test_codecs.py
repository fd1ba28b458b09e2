"""Property checks for ``algorithms.codecs``.

Every declared codec property is tested here: exact round trips on each
codec's lossless domain, unbiasedness and contraction bounds (exact
expectations where the support is finite, Monte Carlo only to tie the real
encode path to the exact law, with Hoeffding thresholds at a false-alarm rate
of 1e-9 Bonferroni-corrected over coordinates), counted bytes = closed-form
bytes, rejection of truncated / corrupted payloads, and the SparQ quantiser
properties P13-P16 and P19.  Torch randomness always comes from a seed drawn by
hypothesis.
"""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from algorithms.codecs import (
    CODECS,
    EXAMPLE_SPECS,
    Codec,
    CodecError,
    Payload,
    _fast,
    decode,
    fixpoint_dequantize,
    fixpoint_quantize,
    make_codec,
    pack_bits,
    qstoch_law,
    qstoch_paper_mse,
    qstoch_round_probs,
    resolve_signed,
    unpack_bits,
)
from algorithms.codecs._kernels import sfc64_raw4
from algorithms.codecs._rng import block_state, block_states, random_words
from algorithms.codecs.quant import channels_of, fixpoint_scales
from algorithms.codecs.sparse import TOPK_PARALLEL_MIN, topk_mask, topk_mask_reference, topk_select

seeds = st.integers(0, 2**32 - 1)
ALPHA = 1e-9  # per-assertion false-alarm rate for Monte Carlo checks
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


KERNELS_FROM = _fast.KERNEL_MIN_ELEMENTS  # the codecs' own threshold


@pytest.fixture(autouse=True, scope="module")
def kernels_at_every_size():
    """The compiled kernels from 0 elements: the small tensors of these checks take the paths
    a large tensor takes (some checks also run the numpy / torch paths, ``kernels_from``)."""
    with kernels_from(0):
        yield


@contextlib.contextmanager
def kernels_from(n: int):
    old = _fast.KERNEL_MIN_ELEMENTS
    _fast.KERNEL_MIN_ELEMENTS = n
    try:
        yield
    finally:
        _fast.KERNEL_MIN_ELEMENTS = old


def randn(shape, seed, dtype=torch.float64, scale=1.0):
    return (torch.randn(shape, generator=gen(seed), dtype=torch.float64) * scale).to(dtype)


def sparse_randn(shape, density, seed, dtype=torch.float64):
    g = gen(seed)
    keep = torch.rand(shape, generator=g, dtype=torch.float64) < density
    vals = torch.randn(shape, generator=g, dtype=torch.float64) + torch.sign(
        torch.randn(shape, generator=g)
    )
    return torch.where(keep, vals, torch.zeros_like(vals)).to(dtype)


def ceil8(bits: int) -> int:
    return -(-bits // 8)


def h0(ndim: int, params: int) -> int:
    """Documented header size: magic 2, version 1, id 1, dtype 1, ndim 1, 4/dim, params,
    body CRC 4, header CRC 4 (the body checksum is on by default)."""
    return 14 + 4 * ndim + params


def index_bits(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def sparse_costs(n: int, k: int, vb: int, w: int) -> dict[str, int]:
    return {
        "dense": ceil8(n * vb),
        "bitmap": ceil8(n) + ceil8(k * vb),
        "coo": ceil8(k * w) + ceil8(k * vb),
    }


def best_format(costs: dict[str, int]) -> str:
    order = ["dense", "bitmap", "coo"]
    return min(order, key=lambda f: (costs[f], order.index(f)))


FORMAT_CODE = {"dense": 0, "bitmap": 1, "coo": 2}


def codes_of_qstoch(p: Payload, bits: int, n: int) -> torch.Tensor:
    body = p.data[p.nbytes - ceil8(n * bits) :]
    return unpack_bits(body, bits, n).to(torch.int64) - 2 ** (bits - 1)


# ============================================================================ registry / API
def test_codec_names_and_spec_round_trip():
    assert set(CODECS) == {
        "identity",
        "fp32",
        "fp16",
        "bf16",
        "fp64",
        "qstoch",
        "qchannel",
        "topk",
        "randk",
        "sparse",
        "sparse-qstoch",
        "natural",
    }
    for spec in EXAMPLE_SPECS:
        c = make_codec(spec)
        assert isinstance(c, Codec)
        assert make_codec(c.spec()) == c
        assert isinstance(c.name, str) and c.name
        assert isinstance(c.unbiased, bool)
        assert repr(c) == f"make_codec({c.spec()!r})"
        b = c.contraction_bound(64)
        assert b is None or (isinstance(b, float) and b >= 0)


@pytest.mark.parametrize(
    "spec",
    [
        "zstd",
        "qstoch:bits=0",
        "qstoch:bits=1",
        "qstoch:bits=17",
        "qstoch:bits=four",
        "qstoch:bit=4",
        "qstoch:bits",
        "qstoch:bits=4,bits=4",
        "qchannel:bits=0",
        "qchannel:signed=maybe",
        "qchannel:granularity=row",
        "topk",
        "topk:k=0",
        "topk:k=-3",
        "topk:ratio=0",
        "topk:ratio=1.5",
        "topk:k=3,ratio=0.5",
        "randk:k=2,scaled=perhaps",
        "sparse:format=zip",
        "sparse:index=int16",
        "sparse:bits=0",
        "fp16:bits=4",
    ],
)
def test_bad_specs_raise_codec_error(spec):
    with pytest.raises(CodecError) as e:
        make_codec(spec)
    msg = str(e.value)
    assert "\n" not in msg and msg
    if spec == "zstd":
        assert all(name in msg for name in CODECS)


def test_k_larger_than_d_raises():
    x = torch.arange(1.0, 11.0)
    for spec in ("topk:k=16", "randk:k=11"):
        c = make_codec(spec)
        with pytest.raises(CodecError, match="exceeds"):
            c.encode(x)
        with pytest.raises(CodecError, match="exceeds"):
            c.encoded_nbytes(x)
        with pytest.raises(CodecError, match="exceeds"):
            c.contraction_bound(10)


@pytest.mark.parametrize(
    "spec,message",
    [
        # the option is named after lower-casing, as make_codec compares it
        ("qstoch:bits=4,BITS=4", "qstoch: option 'bits' given twice"),
        ("qstoch:bit=4", "qstoch: unknown option 'bit'; valid options: bits"),
        ("topk:k=3,kk=1", "topk: unknown option 'kk'; valid options: k, ratio, format, index"),
        ("fp16:bits=4", "fp16: unknown option 'bits'; valid options: none"),
        ("qstoch:bits", "qstoch: option 'bits' is not key=value"),
    ],
)
def test_bad_spec_messages_name_the_option_and_the_valid_ones(spec, message):
    # make_codec's docstring: bad options raise CodecError naming the valid choices
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        make_codec(spec)


def test_payload_rejection_says_what_a_payload_must_be():
    # the Payload docstring: a 1-D, contiguous, CPU uint8 tensor
    msg = ("payload data must be a 1-D contiguous CPU uint8 tensor, got "
           "dtype=torch.float32, shape=(4,), device=cpu")
    with pytest.raises(CodecError, match=f"^{re.escape(msg)}$"):
        Payload(torch.zeros(4))


def test_payload_and_decode_reject_non_payloads():
    with pytest.raises(CodecError):
        Payload(torch.zeros(4))
    with pytest.raises(CodecError):
        Payload(torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(CodecError):
        Payload(b"abc")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        decode(3.0)  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        make_codec("fp16").encode([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        make_codec("qstoch").encode(torch.tensor([1, 2, 3]))
    with pytest.raises(CodecError):
        make_codec("qstoch").encode(torch.tensor([1.0, float("nan")]))
    with pytest.raises(CodecError):
        make_codec("qchannel").encode(torch.tensor([[1e6, 1.0]]))  # fp16 scale overflows


def test_decoding_needs_only_the_payload():
    x = randn((4, 5), 0, torch.float32)
    p = make_codec("qstoch:bits=8").encode(x, gen(1))
    # a receiver built with other parameters, the generic decoder, and raw bytes all agree
    a = make_codec("qstoch:bits=2").decode(p)
    b = decode(p)
    c = decode(p.tobytes())
    assert torch.equal(a, b) and torch.equal(b, c)
    assert a.shape == x.shape and a.dtype == x.dtype
    with pytest.raises(CodecError, match="made by codec family"):
        make_codec("qchannel").decode(p)


@given(
    seeds, st.sampled_from([s for s in EXAMPLE_SPECS if s != "sparse:bits=4"]), st.integers(1, 40)
)
def test_declared_properties_of_every_codec(seed, spec, d):
    """Deterministic codecs: ‖C(x)−x‖ ≤ ω‖x‖ when ω is declared; deterministic + unbiased = exact."""
    codec = make_codec(spec)
    if codec.name in ("topk", "randk") and codec.k is not None:
        codec = make_codec(spec.replace("k=16", f"k={min(16, d)}"))
    x = randn((d,), seed)
    y = codec.decode(codec.encode(x, gen(seed)))
    omega = codec.contraction_bound(d)
    if not codec.stochastic:
        if omega is not None:
            assert float(((y - x) ** 2).sum()) <= omega**2 * float((x**2).sum()) * (1 + 1e-12)
        if codec.unbiased:
            assert torch.equal(y, x)
    if codec.is_lossless_on(x):
        assert torch.equal(y, x)


def test_register_codec_extends_make_codec_and_decode():
    from algorithms.codecs import _core, register_codec, registry

    class Raw8(make_codec("identity").__class__):
        family = 250

        def __init__(self):
            super().__init__("identity")
            self.name = "_test_raw8"

        def spec(self):
            return "_test_raw8"

    try:
        register_codec("_test_raw8", Raw8, param_size=1)
        register_codec("_test_raw8", Raw8, param_size=1)  # idempotent
        c = make_codec("_test_raw8")
        x = torch.arange(6.0).reshape(2, 3)
        assert torch.equal(decode(c.encode(x)), x)
        with pytest.raises(CodecError, match=r"^register_codec: wire id 1 outside 32\.\.255$"):
            register_codec("_other", Raw8.__bases__[0], param_size=1)  # id 1 is reserved

        class Clash(Raw8):  # another class on the same wire id
            pass

        with pytest.raises(CodecError, match=r"^register_codec: wire id 250 already used by Raw8$"):
            register_codec("_test_clash", Clash, param_size=1)
        Clash.family = 251
        with pytest.raises(
            CodecError, match=r"^register_codec: codec name 'qstoch' already registered$"
        ):
            register_codec("qstoch", Clash, param_size=1)
        assert 251 not in registry._FAMILY_CLASSES  # a refused registration leaves no trace
    finally:
        registry._FACTORIES.pop("_test_raw8", None)
        registry._FAMILY_CLASSES.pop(250, None)
        _core.PARAM_SIZES.pop(250, None)
        _core.FAMILY_NAMES.pop(250, None)


# ============================================================================ bit packing
@given(seeds, st.integers(1, 40), st.integers(0, 70))
def test_pack_unpack_round_trip(seed, width, count):
    vals = torch.randint(0, 2**width, (count,), generator=gen(seed), dtype=torch.int64)
    packed = pack_bits(vals, width)
    assert packed.numel() == ceil8(count * width)
    assert torch.equal(unpack_bits(packed, width, count).to(torch.int64), vals)
    # bits above the width are dropped (pack_bits docstring), not carried into the next value
    high = torch.randint(1, 4, (count,), generator=gen(seed + 1), dtype=torch.int64) << width
    assert torch.equal(pack_bits(vals | high, width), packed)
    # MSB-first stream, identical to numpy.packbits of the big-endian bit strings
    bits = [(int(v) >> (width - 1 - j)) & 1 for v in vals.tolist() for j in range(width)]
    ref = np.packbits(np.array(bits, dtype=np.uint8)) if bits else np.zeros(0, dtype=np.uint8)
    assert packed.numpy().tobytes() == ref.tobytes()


@settings(max_examples=3)
@given(seeds)
def test_pack_bits_matches_a_bit_loop_at_every_width(seed):
    """Every width 1..63 against a plain loop over the documented MSB-first stream
    (bitpack module docstring): stream bit j is bit 7 - j % 8 of byte j // 8, padding 0.
    Counts 1..9 both fill and leave part of the last byte; the first value has all
    `width` bits set (so widths 33..63 need their bits above 32).  unpack_bits returns
    uint8 for width <= 8 and int64 above, as its docstring says."""
    g = gen(seed)
    for width in range(1, 64):
        for count in range(1, 10):
            bits = torch.randint(0, 2, (count, width), generator=g)
            bits[0] = 1
            rows = bits.tolist()
            vals = torch.tensor([sum(b << (width - 1 - j) for j, b in enumerate(r)) for r in rows])
            stream = [b for r in rows for b in r]
            stream += [0] * (-len(stream) % 8)
            ref = [
                sum(stream[8 * k + i] << (7 - i) for i in range(8)) for k in range(len(stream) // 8)
            ]
            packed = pack_bits(vals, width)
            assert packed.tolist() == ref, (width, count)
            if width < 63:  # a bit above the width is dropped, not carried into the next value
                assert torch.equal(pack_bits(vals | (1 << width), width), packed), (width, count)
            out = unpack_bits(packed, width, count)
            assert out.dtype == (torch.uint8 if width <= 8 else torch.int64), width
            assert out.tolist() == vals.tolist(), (width, count)


def test_pack4_layout():
    v = torch.tensor([1, 2, 3, 4, 5, 15, 0], dtype=torch.uint8)
    assert pack_bits(v, 4).tolist() == [0x12, 0x34, 0x5F, 0x00]


def test_block_pool_size_is_min_of_4_cpus_and_torch_threads(monkeypatch):
    """The pool has min(4, cpu_count, torch threads) workers and is skipped below 2
    (an unknown cpu_count counts as 1); the words never depend on it (test below)."""
    import os
    import threading

    from algorithms.codecs import _rng

    def names() -> set[str]:
        return set(_rng.run_blocks(lambda j: threading.current_thread().name, 4))

    main = {threading.current_thread().name}
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    for cpus in (None, 1):
        monkeypatch.setattr(os, "cpu_count", lambda c=cpus: c)
        monkeypatch.setattr(_rng, "_CORES", _rng._count_cores())  # read once, at import
        monkeypatch.setattr(_rng, "_pool", None)
        assert _rng._executor() is None and names() == main
    for cpus, workers in ((8, 3), (2, 2)):  # 2 workers is the smallest pool ("skipped below 2")
        monkeypatch.setattr(os, "cpu_count", lambda c=cpus: c)
        monkeypatch.setattr(_rng, "_CORES", _rng._count_cores())
        monkeypatch.setattr(_rng, "_pool", None)
        pool = _rng._executor()
        try:
            assert pool is not None and pool._max_workers == workers
            assert all(n.startswith("codec") for n in names())
        finally:
            if pool is not None:
                pool.shutdown()


@settings(max_examples=40)
@given(st.one_of(st.integers(0, 2**32 + 5), st.integers(0, 2**63 - 1)), st.sampled_from([0, 1, 7, 2**20]))
def test_compiled_block_states_are_numpys(seed, first):
    """The compiled SeedSequence + SFC64 seeding gives numpy's own states (spawn key 0, seeds
    of one and two 32-bit words), and the four-stream generator numpy's ``random_raw``."""
    out = np.zeros((3, 4), dtype=np.uint64)
    block_states(seed, first, out)
    for g in range(3):
        assert np.array_equal(out[g], block_state(seed, first + g))
    got = np.empty((4, 1000), dtype=np.uint64)
    states = np.concatenate([out, out[:1]])
    sfc64_raw4(states, got)
    for g in range(3):
        ref = np.random.SFC64(np.random.SeedSequence(seed, spawn_key=(first + g,))).random_raw(1000)
        assert np.array_equal(got[g], ref)


def test_random_words_follow_the_documented_stream():
    """Block j of the words is SFC64(SeedSequence(seed, spawn_key=(j,))), whatever the threads."""
    n = 3 * (1 << 18) + 123  # several blocks: filled by the thread pool
    w = random_words(n, 16, gen(7))
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=gen(7)))
    per = 1 << 18
    ref = np.concatenate(
        [
            np.random.SFC64(np.random.SeedSequence(seed, spawn_key=(j,)))
            .random_raw(per // 4)
            .view(np.int16)
            for j in range(4)
        ]
    )[:n]
    assert np.array_equal(w.numpy(), ref)
    assert torch.equal(random_words(n, 16, gen(7)), w)
    w32 = random_words(1000, 32, gen(8))
    assert w32.dtype == torch.int32 and int(w32.min()) < 0 < int(w32.max())


# the fast paths with the compiled kernels (this module's default) and with the numpy passes
# a tensor below the kernels' threshold takes, at every size
FAST_PATHS = {"kernels": 0, "numpy": 1 << 62}


@pytest.mark.parametrize("path", FAST_PATHS)
@settings(max_examples=10)
@given(
    seeds,
    st.sampled_from([2, 3, 4]),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    st.sampled_from([1, 2, 3, 7, 8, 1000, 4097, (1 << 18) + 3, 3 * (1 << 18) - 1]),
)
def test_qstoch_fast_path_is_bit_identical_to_reference(path, seed, bits, dtype, n):
    x = randn((n,), seed, dtype)
    codec = make_codec(f"qstoch:bits={bits}")
    with kernels_from(FAST_PATHS[path]):
        fast = codec._encode(x, gen(seed), fast=True)
    ref = codec._encode(x, gen(seed), fast=False)
    assert torch.equal(fast.data, ref.data)


@settings(max_examples=6)
@given(seeds, st.sampled_from([2, 4]), st.sampled_from([4 << 18, 5 * (1 << 18) + 7, 9 * (1 << 18) - 3]))
def test_qstoch_fast_path_is_bit_identical_across_kernel_groups(seed, bits, n):
    """Past four blocks of the random stream the kernel runs in several groups (their
    generators side by side), and a short last block shares its group with full ones."""
    x = randn((n,), seed, torch.float32)
    codec = make_codec(f"qstoch:bits={bits}")
    fast = codec._encode(x, gen(seed), fast=True)
    ref = codec._encode(x, gen(seed), fast=False)
    assert torch.equal(fast.data, ref.data)


def test_large_tensors_take_the_parallel_paths_and_stay_exact():
    """Above 2**16 elements packing, bitmaps and index lists use the blocked numpy paths."""
    g = gen(11)
    vals = torch.randint(0, 2**22, ((1 << 17) + 5,), generator=g)
    for width in (1, 4, 22):
        v = vals & ((1 << width) - 1)
        assert torch.equal(unpack_bits(pack_bits(v, width), width, v.numel()).to(torch.int64), v)
    x = torch.relu(torch.randn(300, 1024, generator=g) - 1.0)
    for spec in ("qchannel:bits=4", "qchannel:bits=4,format=coo", "sparse", "sparse:format=coo"):
        c = make_codec(spec)
        p = c.encode(x)
        assert p.nbytes == c.encoded_nbytes(x)
        if c.name == "sparse":
            assert torch.equal(c.decode(p), x)
    fast = fixpoint_quantize(x, 4, fast=True)
    slow = fixpoint_quantize(x, 4, fast=False)
    assert torch.equal(fast.codes, slow.codes) and fast.nnz == slow.nnz
    ref = fixpoint_dequantize(slow.codes, slow.scales, 4, True, tuple(x.shape), x.dtype)
    assert torch.equal(
        make_codec("qchannel:bits=4").decode(make_codec("qchannel:bits=4").encode(x)), ref
    )


# ============================================================================ dense codecs
@given(
    seeds, st.sampled_from([*FLOATS, *INTS, torch.bool]), st.lists(st.integers(0, 5), max_size=3)
)
def test_identity_is_bit_exact(seed, dtype, shape):
    g = gen(seed)
    raw = torch.randint(
        0, 256, (math.prod(shape) * torch.empty((), dtype=dtype).element_size(),), generator=g
    )
    x = (
        raw.to(torch.uint8).view(dtype).reshape(shape)
        if dtype != torch.bool
        else (raw % 2).bool().reshape(shape)
    )
    c = make_codec("identity")
    assert c.is_lossless_on(x)
    p = c.encode(x)
    y = c.decode(p)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert (
        y.reshape(-1).view(torch.uint8).tolist() == x.reshape(-1).view(torch.uint8).tolist()
    )  # NaN, -0.0
    assert p.nbytes == c.encoded_nbytes(x) == h0(len(shape), 1) + x.numel() * x.element_size()
    assert c.floor_bits(x) == 8 * x.element_size() * x.numel()


@given(
    seeds,
    st.sampled_from(["fp32", "fp16", "bf16", "fp64"]),
    st.sampled_from(FLOATS),
    st.lists(st.integers(0, 5), max_size=3),
)
def test_casts_round_trip_representable_values(seed, name, dtype, shape):
    wire = {
        "fp32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp64": torch.float64,
    }[name]
    x = randn(shape, seed, torch.float64, scale=10.0).to(wire).to(dtype)  # representable in both
    c = make_codec(name)
    assert c.is_lossless_on(x)
    p = c.encode(x)
    y = c.decode(p)
    assert y.dtype == dtype and torch.equal(y, x)
    size = torch.empty((), dtype=wire).element_size()
    assert p.nbytes == c.encoded_nbytes(x) == h0(len(shape), 1) + x.numel() * size


def test_cast_lossless_domain_is_exact():
    x = torch.tensor([1.0 + 2.0**-20], dtype=torch.float32)
    assert not make_codec("fp16").is_lossless_on(x)
    assert not make_codec("bf16").is_lossless_on(x)
    assert make_codec("fp32").is_lossless_on(x) and make_codec("fp64").is_lossless_on(x)
    ints = torch.tensor([-2048, 0, 2048], dtype=torch.int32)
    assert make_codec("fp16").is_lossless_on(ints)
    assert torch.equal(make_codec("fp16").decode(make_codec("fp16").encode(ints)), ints)
    assert not make_codec("fp16").is_lossless_on(torch.tensor([2049]))


# ============================================================================ sparse encodings
SPARSE_OPTS = [
    "",
    ":format=dense",
    ":format=bitmap",
    ":format=coo",
    ":index=int32",
    ":format=coo,index=int32",
]


@given(
    seeds,
    st.sampled_from(INTS),
    st.lists(st.integers(0, 9), max_size=3),
    st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
    st.sampled_from(SPARSE_OPTS),
)
def test_sparse_round_trips_any_integer_codes(seed, dtype, shape, density, opts):
    info = torch.iinfo(dtype)
    g = gen(seed)
    vals = torch.randint(
        max(info.min, -(2**40)),
        min(info.max, 2**40) + 1,
        tuple(shape),
        generator=g,
        dtype=torch.int64,
    )
    keep = torch.rand(tuple(shape), generator=g) < density
    x = torch.where(keep, vals, torch.zeros_like(vals)).to(dtype)
    c = make_codec("sparse" + opts)
    assert c.is_lossless_on(x)
    p = c.encode(x)
    y = c.decode(p)
    assert y.dtype == dtype and torch.equal(y, x)
    assert torch.equal(decode(p), x)
    n, k = x.numel(), int((x != 0).sum())
    w = 32 if "int32" in opts else index_bits(n)
    costs = sparse_costs(n, k, 8 * x.element_size(), w)
    fmt = opts.split("format=")[1].split(",")[0] if "format=" in opts else best_format(costs)
    hdr = h0(x.dim(), 7)
    assert p.nbytes == c.encoded_nbytes(x) == hdr + costs[fmt]
    assert int(p.data[hdr - 8 - 7 + 2]) == FORMAT_CODE[fmt]  # format recorded in the header
    if "format=" not in opts:
        assert p.nbytes <= hdr + costs["dense"]  # P18: never above the dense encoding


@given(
    seeds,
    st.integers(1, 8),
    st.booleans(),
    st.lists(st.integers(1, 8), min_size=1, max_size=3),
    st.floats(0.0, 1.0),
)
def test_sparse_packed_integer_codes(seed, bits, signed, shape, density):
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    g = gen(seed)
    vals = torch.randint(lo, hi + 1, tuple(shape), generator=g)
    x = torch.where(torch.rand(tuple(shape), generator=g) < density, vals, 0).to(torch.int16)
    c = make_codec(f"sparse:bits={bits},signed={'true' if signed else 'false'}")
    assert c.is_lossless_on(x)
    p = c.encode(x)
    assert torch.equal(c.decode(p), x)
    n, k = x.numel(), int((x != 0).sum())
    assert (
        p.nbytes
        == c.encoded_nbytes(x)
        == h0(x.dim(), 7) + min(sparse_costs(n, k, bits, index_bits(n)).values())
    )
    assert c.floor_bits(x) <= 8 * p.nbytes
    bad = x.clone().reshape(-1)
    bad[0] = hi + 1
    assert not c.is_lossless_on(bad)
    with pytest.raises(CodecError):
        c.encode(bad)


@given(seeds, st.sampled_from(FLOATS), st.sampled_from(SPARSE_OPTS))
def test_sparse_raw_floats_are_bit_exact(seed, dtype, opts):
    x = sparse_randn((5, 7), 0.3, seed, dtype)
    x.view(-1)[:5] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 1e-40]).to(
        dtype
    )
    c = make_codec("sparse" + opts)
    y = c.decode(c.encode(x))
    assert y.view(torch.uint8).tolist() == x.view(torch.uint8).tolist()


# ============================================================================ qstoch
@given(
    seeds,
    st.sampled_from([2, 3, 4, 5, 6, 7, 8, 12, 16]),
    st.sampled_from([torch.float64, torch.float32]),
    st.integers(1, 64),
    st.floats(-6, 6),
)
def test_qstoch_exact_law(seed, bits, dtype, d, log_scale):
    """E[Q] and E‖Q−x‖² from the sampler's exact law vs x, δ²Σf(1−f) and the bounds (Q4, Q6)."""
    x = randn((d,), seed, torch.float64, 10.0**log_scale).to(dtype)
    xd = x.to(torch.float64)
    assume(float(xd.abs().max()) > 1e-30)
    codec = make_codec(f"qstoch:bits={bits}")
    L = 2 ** (bits - 1) - 1
    law = qstoch_law(x, bits)
    lo, f, delta = qstoch_round_probs(x, bits)
    # Q4: the paper's rounding law is unbiased.  For x/δ in (-1, 0), f = x/δ + 1 rounds to
    # 2^-53 absolutely, so an x near zero is reproduced to about δ 2^-52, not relatively
    assert torch.allclose(delta * (lo + f), xd, rtol=1e-12, atol=delta * 2.0**-50)
    # the implemented law: unbiased up to its 2^-R grid and the float32 δ on the wire
    R = law.resolution_bits
    bias = (law.mean() - xd).abs()
    assert bool((bias <= law.delta * 2.0 ** (-R - 1) * (1 + 1e-9) + 2.0**-23 * xd.abs()).all())
    assert bool(((law.p >= 0) & (law.p < 1)).all())
    assert bool((law.p * 2.0**R == torch.round(law.p * 2.0**R)).all())  # p on the 2^-R grid
    # Q6: exact variance of the ideal quantiser and its bounds
    var = qstoch_paper_mse(x, bits)
    norm2 = float((xd**2).sum())
    assert var <= d * delta**2 / 4 * (1 + 1e-12)
    assert var <= d / (4 * L * L) * norm2 * (1 + 1e-12)
    assert var <= delta * float(xd.abs().sum()) * (1 + 1e-12)
    # the implemented law's exact MSE matches δ²Σf(1−f) and respects the declared ω
    mse = law.mse(x)
    bias_bound = 2.0**-23 * xd.abs() + delta * 2.0 ** (-R - 1)
    tol = d * delta**2 * (2.0**-22 + 2.0 ** (-R)) + float((bias_bound**2).sum()) + 1e-300
    assert abs(mse - var) <= tol
    omega = codec.contraction_bound(d)
    assert mse <= omega**2 * norm2 + tol


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("d", [2, 10, 100])
def test_qstoch_contraction_bound_is_the_qsgd_bound_and_nearly_tight(bits, d):
    """ω² = min(d/(4L²), √d/L), L = 2**(b-1) - 1 (spec seed-double-quant §2.1, QSGD Lemma 3.1),
    for qstoch and sparse-qstoch; it must cover the worst case x = (L, ½, …, ½): δ = 1 and
    every ½ is rounded to 0 or 1 with probability ½, so E‖Q(x)−x‖² = (d−1)/4 exactly."""
    L = 2 ** (bits - 1) - 1
    for name in ("qstoch", "sparse-qstoch"):
        omega = make_codec(f"{name}:bits={bits}").contraction_bound(d)
        assert omega**2 == pytest.approx(min(d / (4 * L * L), math.sqrt(d) / L), rel=1e-12)
    x = torch.full((d,), 0.5, dtype=torch.float64)
    x[0] = L
    mse = (d - 1) / 4
    assert qstoch_law(x, bits).mse(x) == pytest.approx(mse, rel=1e-12)
    assert mse <= omega**2 * float((x**2).sum()) * (1 + 1e-12)


@settings(max_examples=10)
@given(
    seeds,
    st.sampled_from([2, 4, 8]),
    st.sampled_from([torch.float64, torch.float32, torch.float16]),
    st.integers(1, 16),
)
def test_qstoch_monte_carlo_matches_exact_law(seed, bits, dtype, d):
    """The real encode path draws codes from the exact law (Hoeffding, α=1e-9 Bonferroni)."""
    x = randn((d,), seed, dtype)
    assume(float(x.abs().max()) > 0)
    N = 4000
    codec = make_codec(f"qstoch:bits={bits}")
    rep = x.repeat(N)  # same δ, so every copy follows the law of x
    p = codec.encode(rep, gen(seed + 1))
    k = codes_of_qstoch(p, bits, N * d).view(N, d)
    law = qstoch_law(x, bits)
    # support, every draw: k ∈ {k_lo, k_lo + 1}, and k_lo exactly where p = 0
    up = k - law.k_lo
    assert bool(((up == 0) | (up == 1)).all())
    assert bool((up[:, law.p == 0] == 0).all())
    # frequencies of rounding up
    tol = math.sqrt(math.log(2 * d / ALPHA) / (2 * N))
    assert float((up.double().mean(0) - law.p).abs().max()) <= tol
    # decoded values are k·δ (rounded once into the input dtype)
    cd = torch.float64 if dtype == torch.float64 else torch.float32
    assert torch.equal(codec.decode(p), (k.to(cd) * law.delta).to(dtype).reshape(-1))
    # squared error per copy lies in [0, d δ²]; its mean is the exact MSE
    sq = ((k.double() * law.delta - x.double()) ** 2).sum(1)
    span = d * law.delta**2 * (1 + 1e-4)
    assert float(sq.max()) <= span
    assert abs(float(sq.mean()) - law.mse(x)) <= span * math.sqrt(math.log(2 / ALPHA) / (2 * N))


@given(
    seeds,
    st.sampled_from([2, 3, 4, 5, 8, 12]),
    st.sampled_from([torch.float32, torch.float64, torch.float16]),
    st.integers(1, 40),
    st.integers(1, 2**11 - 1),
    st.integers(-30, 3),
)
def test_qstoch_lossless_on_grid(seed, bits, dtype, d, mantissa, exponent):
    """Q3: x = c·k with max|k| = L decodes exactly, whatever the randomness."""
    L = 2 ** (bits - 1) - 1
    if dtype == torch.float16:
        bits, L, exponent = min(bits, 5), 2 ** (min(bits, 5) - 1) - 1, max(-14, min(exponent, 0))
        mantissa = mantissa % 64 + 1
    g = gen(seed)
    k = torch.randint(-L, L + 1, (d,), generator=g)
    k[int(torch.randint(0, d, (), generator=g))] = L if seed % 2 else -L
    c = math.ldexp(mantissa, exponent)
    x = (k.to(torch.float64) * c).to(dtype)
    assert torch.equal(x.double(), k.double() * c)  # representable by construction
    codec = make_codec(f"qstoch:bits={bits}")
    assert codec.is_lossless_on(x)
    for s in range(3):
        assert torch.equal(codec.decode(codec.encode(x, gen(seed + s))), x)


@given(seeds, st.sampled_from([2, 4, 8]), st.integers(1, 30))
def test_qstoch_deterministic_facts(seed, bits, d):
    """Q1/Q2: codes in range, |Q−x| < δ, no sign flips, the max coordinate is exact."""
    x = randn((d,), seed)
    codec = make_codec(f"qstoch:bits={bits}")
    p = codec.encode(x, gen(seed))
    k = codes_of_qstoch(p, bits, d)
    L = 2 ** (bits - 1) - 1
    assert bool((k.abs() <= L).all())
    q = codec.decode(p)
    delta = qstoch_law(x, bits).delta
    assert bool(((q - x).abs() < delta * (1 + L * 2.0**-23)).all())
    assert bool((q * x >= 0).all())
    i = int(x.abs().argmax())
    assert int(k[i]) == (L if x[i] > 0 else -L)
    # same seed, same bytes
    assert torch.equal(codec.encode(x, gen(seed)).data, p.data)


def test_qstoch_degenerate_inputs():
    c = make_codec("qstoch:bits=4")
    for x in (torch.zeros(5), torch.zeros(0), torch.zeros(()), torch.tensor([3.0])):
        p = c.encode(x, gen(0))
        assert torch.equal(c.decode(p), x)
        assert p.nbytes == c.encoded_nbytes(x) == h0(x.dim(), 5) + ceil8(4 * x.numel())
    two = make_codec("qstoch:bits=2")
    k = codes_of_qstoch(two.encode(randn((50,), 1), gen(1)), 2, 50)
    assert set(k.tolist()) <= {-1, 0, 1}
    with pytest.raises(CodecError):
        c.encode(torch.tensor([1e-40], dtype=torch.float64))  # δ underflows float32


# ============================================================================ top-k / rand-k
@given(seeds, st.integers(1, 60), st.floats(0.0, 1.0), st.data())
def test_topk_contraction_and_selection(seed, d, density, data):
    k = data.draw(st.integers(1, d))
    x = sparse_randn((d,), density, seed)
    codec = make_codec(f"topk:k={k}")
    y = codec.decode(codec.encode(x))
    err = float(((y - x) ** 2).sum())
    omega = codec.contraction_bound(d)
    assert err <= omega**2 * float((x**2).sum()) * (1 + 1e-12) + 1e-300
    kept = y != 0
    assert int(kept.sum()) <= k
    if bool(kept.any()) and not bool(kept.all()):
        assert float(x[kept].abs().min()) >= float(x[~kept].abs().max())
    assert torch.equal(y[kept], x[kept])
    assert codec.is_lossless_on(x) == (int((x != 0).sum()) <= k)
    if codec.is_lossless_on(x):
        assert torch.equal(y, x)


def test_topk_ties_go_to_the_lower_index():
    x = torch.tensor([1.0, -3.0, 3.0, 2.0, -3.0, 3.0])
    y = make_codec("topk:k=3").decode(make_codec("topk:k=3").encode(x))
    assert y.tolist() == [0.0, -3.0, 3.0, 0.0, -3.0, 0.0]
    assert make_codec("topk:ratio=0.1").k_for(30) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("levels", [0, 1, 4])
@settings(max_examples=15)
@given(seeds, st.integers(1, 300), st.data())
def test_topk_mask_equals_the_topk_and_cumsum_reference(dtype, levels, seed, n, data):
    """The partition threshold keeps exactly the mask of torch.topk plus the cumulative tie count:
    inputs with few distinct magnitudes (levels > 0; signs and -0.0 mixed in) force ties at the threshold."""
    k = data.draw(st.integers(0, n + 1))
    x = randn((n,), seed, torch.float64)
    if levels:
        x = torch.randint(-levels, levels + 1, (n,), generator=gen(seed + 1)).double()
        x = torch.where(x == 0, -x, x)  # some -0.0
    x = x.to(dtype)
    got = topk_mask(x, k)
    want = topk_mask_reference(x, k) if k > 0 else torch.zeros(n, dtype=torch.bool)
    assert got.dtype == torch.bool and torch.equal(got, want)
    with kernels_from(KERNELS_FROM):  # the partition path of a small tensor
        assert torch.equal(topk_mask(x, k), want)
    assert int(got.sum()) == min(k, n)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("levels", [0, 1, 3])
@pytest.mark.parametrize("kind", ["one", "tenth", "half", "all but one"])
@settings(max_examples=2, deadline=None)
@given(seeds, st.integers(0, 999))
def test_topk_select_in_pieces_equals_the_reference(threads, levels, kind, seed, extra):
    """Past TOPK_PARALLEL_MIN elements float32 top-k counts, masks and compacts in one piece per
    pool worker; the mask and values equal torch.topk's with the cumulative tie count, ties
    at the threshold spread over both pieces included (levels > 0), and zeros selected (-0.0
    among them) when k reaches past the nonzero entries.  Every combination runs: a drawn one
    could miss the case that shows a fault."""
    n = TOPK_PARALLEL_MIN + extra
    k = {"one": 1, "tenth": n // 10, "half": n // 2, "all but one": n - 1}[kind]
    x = randn((n,), seed)
    if levels:
        x = torch.randint(-levels, levels + 1, (n,), generator=gen(seed + 1)).float()
        x = torch.where(x == 0, -x, x)  # some -0.0
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mask, vals = topk_select(x, k, "topk")
    finally:
        torch.set_num_threads(old)
    want = topk_mask_reference(x, k)
    assert torch.equal(mask, want)
    ref_vals = x[want]
    assert torch.equal(vals, torch.where(ref_vals == 0, torch.zeros_like(ref_vals), ref_vals))
    assert not bool(torch.signbit(vals[vals == 0]).any())  # -0.0 travels as +0.0


@settings(max_examples=5)
@given(seeds, st.integers(2, 12), st.booleans(), st.data())
def test_randk_exact_moments_and_monte_carlo(seed, d, scaled, data):
    k = data.draw(st.integers(1, d))
    x = randn((d,), seed) + 3.0 * torch.sign(randn((d,), seed + 1))  # no zeros
    codec = make_codec(f"randk:k={k},scaled={'true' if scaled else 'false'}")
    # exact moments from the inclusion probability k/d
    pi = k / d
    s = d / k if scaled else 1.0
    mean = pi * s * x
    mse = float((pi * (s - 1) ** 2 + (1 - pi)) * (x**2).sum())
    omega = codec.contraction_bound(d)
    norm2 = float((x**2).sum())
    assert abs(mse - omega**2 * norm2) <= 1e-12 * norm2
    assert codec.unbiased == scaled
    if scaled:
        assert torch.allclose(mean, x, rtol=1e-15)
    # Monte Carlo through the real encoder: inclusion frequencies and kept values
    N = 400  # loose: the exact moments above are the real check
    g = gen(seed + 2)
    hits = torch.zeros(d)
    for _ in range(N):
        y = codec.decode(codec.encode(x, g))
        kept = y != 0
        assert int(kept.sum()) == k
        expect = (x[kept] * s) if scaled else x[kept]
        assert torch.equal(y[kept], expect)
        hits += kept
    assert float((hits / N - pi).abs().max()) <= math.sqrt(math.log(2 * d / ALPHA) / (2 * N))


def test_randk_lossless_domain():
    x = torch.tensor([1.0, -2.0, 0.5])
    for spec in ("randk:k=3", "randk:ratio=1.0,scaled=false"):
        c = make_codec(spec)
        assert c.is_lossless_on(x)
        assert torch.equal(c.decode(c.encode(x, gen(0))), x)
    assert not make_codec("randk:k=2").is_lossless_on(x)
    assert make_codec("randk:k=1").is_lossless_on(torch.zeros(3))


# ============================================================================ qchannel (SparQ)
def channel_input(seed, shape, density=0.7, log_lo=-2.0, log_hi=3.0):
    g = gen(seed)
    x = sparse_randn(shape, density, seed, torch.float32)
    scale = 10.0 ** (log_lo + (log_hi - log_lo) * torch.rand(shape[-1], generator=g))
    x = x * scale
    x[..., int(torch.randint(0, shape[-1], (), generator=g))] = 0.0  # an all-zero channel
    return x


shapes2 = st.lists(st.integers(1, 6), min_size=2, max_size=3).map(tuple)


@given(seeds, shapes2, st.sampled_from([1, 2, 4, 8]))
def test_p13_zeros_range_and_error_bound(seed, shape, bits):
    x = channel_input(seed, shape)
    fc = fixpoint_quantize(x, bits)
    H = shape[-1]
    q = (fc.codes.to(torch.int64) - 2 ** (bits - 1)).view(-1, H)
    x2 = x.reshape(-1, H).double()
    assert bool((q[x2 == 0] == 0).all())
    assert bool(((q >= -(2 ** (bits - 1))) & (q <= 2 ** (bits - 1) - 1)).all())
    xh = fixpoint_dequantize(fc.codes, fc.scales, bits, True, shape, torch.float64).reshape(-1, H)
    s = fc.scales.double()
    m = x2.abs().amax(0)
    eps = 1e-6
    err = (x2 - xh).abs()
    # spec bound s·2^-(b-1); fp16 may round the scale below the true max, adding (m - s)+
    loose = s * 2.0 ** (1 - bits) + (m - s).clamp(min=0) + 2 * eps + 2.0**-20 * x2.abs()
    assert bool((err <= loose).all())
    y = x2 / ((s + eps) * 2.0 ** (1 - bits))
    inner = y.abs() <= 2 ** (bits - 1) - 0.5
    tight = s * 2.0**-bits * (1 + 1e-3) + 2 * eps + 2.0**-20 * x2.abs()
    assert bool((err <= tight)[inner].all())


@given(seeds, shapes2)
def test_p14_sparsity_is_monotone_in_bits(seed, shape):
    x = channel_input(seed, shape, density=0.9)
    nnz = [fixpoint_quantize(x, b).nnz for b in range(1, 9)]
    assert nnz == sorted(nnz)


@given(seeds, shapes2, st.integers(1, 8))
def test_p15_zero_criterion(seed, shape, bits):
    x = channel_input(seed, shape)
    fc = fixpoint_quantize(x, bits)
    H = shape[-1]
    den = (fc.scales.float() + torch.tensor(1e-6, dtype=torch.float32)) * 2.0 ** (1 - bits)
    y = x.reshape(-1, H) / den
    zero = fc.codes.view(-1, H) == 2 ** (bits - 1)
    if bits >= 2:
        assert torch.equal(zero, y.abs() <= 0.5)
    else:
        assert bool(zero[x.reshape(-1, H) >= 0].all())


QCH_OPTS = [
    "",
    ",format=dense",
    ",format=bitmap",
    ",format=coo",
    ",index=int32",
    ",signed=false",
    ",granularity=tensor",
]


@given(
    seeds,
    shapes2,
    st.sampled_from([1, 2, 3, 4, 8, 12]),
    st.sampled_from(QCH_OPTS),
    st.sampled_from([torch.float32, torch.float64, torch.float16]),
)
def test_p16_p17_qchannel_wire_is_lossless_and_sized(seed, shape, bits, opts, dtype):
    """P16: the sparse wire reproduces the quantiser exactly; P17: bytes = §2.8 formula."""
    x = channel_input(seed, shape, density=0.5, log_hi=2.0).to(dtype)
    codec = make_codec(f"qchannel:bits={bits}{opts}")
    signed = "signed=false" not in opts
    tensor = "tensor" in opts
    fc = fixpoint_quantize(x, bits, signed, tensor, fast=False)
    ref = fixpoint_dequantize(fc.codes, fc.scales, bits, signed, shape, dtype)
    p = codec.encode(x)
    y = codec.decode(p)
    assert y.dtype == dtype and torch.equal(y, ref)
    n, k = x.numel(), fc.nnz
    H = 1 if tensor else shape[-1]
    costs = sparse_costs(n, k, bits, 32 if "int32" in opts else index_bits(n))
    fmt = opts.split("format=")[1] if "format=" in opts else best_format(costs)
    hdr = h0(len(shape), 7)
    assert p.nbytes == codec.encoded_nbytes(x) == hdr + 2 * H + costs[fmt]
    assert int(p.data[hdr - 8 - 5]) == FORMAT_CODE[fmt]
    floor = codec.floor_bits(x)
    assert 16 * H <= floor <= 8 * p.nbytes


@pytest.mark.parametrize("shape", [(1, (1 << 18) + 6), ((1 << 18) + 6, 1), (3, 1 << 17), ((1 << 18) + 7,)])
@pytest.mark.parametrize("granularity", ["channel", "token", "tensor"])
@settings(max_examples=1, deadline=None)
@given(seeds)
def test_qchannel_fast_path_equals_reference_past_one_block(shape, granularity, seed):
    """Past one block of the fast path: one long row (blocks along it, each with its columns'
    scales), one long column, several rows per block, and an odd length (the stream's last
    byte holds one code), for every granularity (every combination runs), with the packed
    stream."""
    x = randn(shape, seed, torch.float32)
    n = x.numel()
    packed = torch.empty((n + 1) // 2, dtype=torch.uint8)
    fast = fixpoint_quantize(x, 4, True, granularity, fast=True, packed=packed)
    slow = fixpoint_quantize(x, 4, True, granularity, fast=False)
    assert torch.equal(fast.codes, slow.codes) and fast.nnz == slow.nnz
    assert fast.packed and torch.equal(packed, pack_bits(slow.codes, 4))


@pytest.mark.parametrize("path", FAST_PATHS)
@given(seeds, shapes2, st.integers(1, 7))
def test_qchannel_fast_path_equals_reference(path, seed, shape, bits):
    """The word-parallel fast path gives the same codes as round/clamp, ties included."""
    x = channel_input(seed, shape, density=0.8)
    g = gen(seed + 1)
    s = fixpoint_quantize(x, bits).scales.float()
    den = (s + torch.tensor(1e-6, dtype=torch.float32)) * 2.0 ** (1 - bits)
    ties = (torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), shape, generator=g) + 0.5) * den
    pick = torch.rand(shape, generator=g) < 0.4
    x = torch.where(pick & (ties.abs() < x.abs().amax(dim=tuple(range(len(shape) - 1)))), ties, x)
    dense = randn(shape, seed, torch.float32)  # no all-zero column: the scales' own path
    with kernels_from(FAST_PATHS[path]):
        fast = fixpoint_quantize(x, bits, fast=True)
        dense_scales = fixpoint_scales(dense)
    slow = fixpoint_quantize(x, bits, fast=False)
    assert torch.equal(fast.codes, slow.codes) and fast.nnz == slow.nnz
    assert torch.equal(fast.scales, x.reshape(-1, shape[-1]).abs().amax(0).half())
    assert torch.equal(dense_scales, dense.reshape(-1, shape[-1]).abs().amax(0).half())


@given(seeds, shapes2, st.sampled_from([1, 2, 4, 8]), st.booleans())
def test_qchannel_lossless_on_its_grid(seed, shape, bits, signed):
    g = gen(seed)
    H = shape[-1]
    s = (10.0 ** (-2 + 4 * torch.rand(H, generator=g))).half().float()
    if signed:
        q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), shape, generator=g)
        q.view(-1, H)[0] = -(2 ** (bits - 1))  # absmax attained by -s in every channel
        x = (q.float() * 2.0 ** (1 - bits)) * s
    else:
        q = torch.randint(0, 2**bits, shape, generator=g)
        q.view(-1, H)[0] = 2**bits - 1
        x = (q.float() * s) / float(2**bits - 1)
    codec = make_codec(f"qchannel:bits={bits},signed={'true' if signed else 'false'}")
    assert codec.is_lossless_on(x)
    assert torch.equal(codec.decode(codec.encode(x)), x)


@given(seeds, shapes2, st.integers(1, 8))
def test_p19_error_never_exceeds_the_input(seed, shape, bits):
    x = channel_input(seed, shape, density=0.9)
    assume(bool((x != 0).any()))
    codec = make_codec(f"qchannel:bits={bits}")
    y = codec.decode(codec.encode(x))
    err = (y - x).double()
    assert bool((err.abs() <= x.double().abs() * (1 + 1e-6)).all())
    kappa = float(err.norm() / x.double().norm())
    assert kappa <= 1.0 + 1e-6
    if bits >= 2:
        assert kappa < 1.0


@settings(max_examples=10)
@given(seeds, st.floats(1.0, 3.0))
def test_relu_activations_are_sent_sparse(seed, shift):
    """Mostly-negative pre-activations through ReLU: 4-bit codes are sparser than dense."""
    pre = randn((4, 16, 64), seed, torch.float32) - shift
    x = torch.relu(pre)
    codec = make_codec("qchannel:bits=4")
    p = codec.encode(x)
    n, H = x.numel(), 64
    k = fixpoint_quantize(x, 4).nnz
    assert k < n / 4
    dense_packed = make_codec("qchannel:bits=4,format=dense").encoded_nbytes(x)
    assert p.nbytes < dense_packed < 2 * n  # below dense 4-bit, far below fp16
    costs = sparse_costs(n, k, 4, index_bits(n))
    hdr = h0(3, 7)
    assert p.nbytes == hdr + 2 * H + min(costs.values())
    assert int(p.data[hdr - 8 - 5]) == FORMAT_CODE[best_format(costs)]
    for f in ("bitmap", "coo"):
        assert p.nbytes <= make_codec(f"qchannel:bits=4,format={f}").encoded_nbytes(x)


# ============================================================================ bytes = closed form
def expected_nbytes(codec: Codec, x: torch.Tensor) -> int:
    n, nd = x.numel(), x.dim()
    spec = codec.spec()
    if codec.name in ("identity", "fp32", "fp16", "bf16", "fp64"):
        wire = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}.get(codec.name, x.element_size())
        return h0(nd, 1) + n * wire
    if codec.name == "qstoch":
        return h0(nd, 5) + ceil8(n * codec.bits)
    if codec.name == "natural":  # a sign bit and an exponent code (1 + E bits) per entry
        bits = {torch.float16: 6, torch.bfloat16: 9, torch.float32: 9, torch.float64: 12}[x.dtype]
        return h0(nd, 1) + ceil8(n * bits)
    if codec.name in ("topk", "randk"):
        k = codec.k if codec.k is not None else max(1, math.ceil(codec.ratio * n - 1e-9))
        return h0(nd, 7) + min(sparse_costs(n, k, 8 * x.element_size(), index_bits(n)).values())
    if codec.name == "sparse":
        k = int(
            (
                x.reshape(-1).view(
                    {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
                )
                != 0
            ).sum()
        )
        return h0(nd, 7) + min(sparse_costs(n, k, 8 * x.element_size(), index_bits(n)).values())
    assert codec.name == "qchannel", spec
    gran = next((g for g in ("tensor", "token") if f"granularity={g}" in spec), "channel")
    # signed=auto: the signed grid iff some entry is negative (written here, not the codec's resolver)
    signed = codec.signed if codec.signed is not None else bool((x < 0).any())
    fc = fixpoint_quantize(x, codec.bits, signed, gran, fast=False)
    # one scale in all, one per channel (last dimension), or one per row (token)
    H = 1 if gran == "tensor" or nd <= 1 else x.shape[-1] if gran == "channel" else math.prod(x.shape[:-1])
    return h0(nd, 7) + 2 * H + min(sparse_costs(n, fc.nnz, codec.bits, index_bits(n)).values())


FLOAT_SPECS = [s for s in EXAMPLE_SPECS if s != "sparse:bits=4"]


@given(
    seeds,
    st.sampled_from(FLOAT_SPECS),
    st.lists(st.integers(1, 9), max_size=3),
    st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
    st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
)
@example(0, "qchannel:bits=2,signed=auto", [], 1.0, torch.float32)  # a negative scalar: the signed grid
def test_counted_bytes_equal_closed_form(seed, spec, shape, density, dtype):
    x = sparse_randn(tuple(shape), density, seed, dtype)
    codec = make_codec(spec)
    if codec.name in ("topk", "randk") and codec.k is not None and codec.k > x.numel():
        codec = make_codec(spec.replace("k=16", f"k={max(1, x.numel() // 2)}"))
    p = codec.encode(x, gen(seed))
    assert p.nbytes == codec.encoded_nbytes(x) == expected_nbytes(codec, x)
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    floor = codec.floor_bits(x)
    assert 0 <= floor <= 8 * p.nbytes


# ============================================================================ corrupted payloads
def small_payloads() -> list[tuple[str, Payload, int]]:
    x = torch.tensor([[0.5, -1.25, 0.0, 3.0], [0.0, 0.0, 2.0, -0.75], [1.5, 0.0, 0.0, 0.25]])
    out = []
    for spec in EXAMPLE_SPECS:
        codec = make_codec(spec.replace("k=16", "k=3"))
        xi = x.to(torch.int16).clamp(-8, 7) if spec == "sparse:bits=4" else x
        p = codec.encode(xi, gen(0))
        params = {
            "identity": 1, "fp32": 1, "fp16": 1, "bf16": 1, "fp64": 1, "qstoch": 5, "natural": 1
        }.get(codec.name, 7)
        out.append((codec.spec(), p, h0(2, params)))
    for spec in (
        "qchannel:bits=4,format=coo",
        "qchannel:bits=2,format=bitmap",
        "sparse:format=coo",
        "topk:k=3,format=bitmap",
    ):
        out.append((spec, make_codec(spec).encode(x), h0(2, 7)))
    return out


SMALL = small_payloads()


@pytest.mark.parametrize("spec,payload,header", SMALL, ids=[s for s, _, _ in SMALL])
def test_every_truncation_and_extension_is_rejected(spec, payload, header):
    codec = make_codec(spec)
    assert torch.equal(codec.decode(payload), decode(payload))
    for cut in range(payload.nbytes):
        short = Payload(payload.data[:cut].clone())
        with pytest.raises(CodecError):
            codec.decode(short)
        with pytest.raises(CodecError):
            decode(short)
    longer = Payload(torch.cat([payload.data, torch.zeros(1, dtype=torch.uint8)]))
    with pytest.raises(CodecError, match="trailing"):
        codec.decode(longer)


@pytest.mark.parametrize("spec,payload,header", SMALL, ids=[s for s, _, _ in SMALL])
def test_wrong_magic_version_and_codec_id(spec, payload, header):
    codec = make_codec(spec)
    for offset, value, match in (
        (0, ord("X"), "magic"),
        (1, 0, "magic"),
        (2, 3, "version"),
        (2, 0, "version"),
        (3, 99, "codec id"),
    ):
        d = payload.data.clone()
        d[offset] = value
        for dec in (codec.decode, decode):
            with pytest.raises(CodecError, match=match):
                dec(Payload(d))
    other = 1 + (int(payload.data[3]) % 6)  # another valid family id
    d = payload.data.clone()
    d[3] = other
    with pytest.raises(CodecError, match="made by codec family"):
        codec.decode(Payload(d))
    with pytest.raises(CodecError):
        decode(Payload(d))


@given(st.sampled_from(range(len(SMALL))), st.data(), st.integers(1, 255))
def test_header_byte_flips_are_detected(i, data, flip):
    spec, payload, header = SMALL[i]
    pos = data.draw(st.integers(0, header - 1))
    d = payload.data.clone()
    d[pos] ^= flip
    for dec in (make_codec(spec).decode, decode):
        with pytest.raises(CodecError):
            dec(Payload(d))


@given(st.sampled_from(range(len(SMALL))), st.data(), st.integers(1, 255))
def test_body_byte_flips_never_crash(i, data, flip):
    spec, payload, header = SMALL[i]
    assume(payload.nbytes > header)
    pos = data.draw(st.integers(header, payload.nbytes - 1))
    d = payload.data.clone()
    d[pos] ^= flip
    ref = decode(payload)
    try:
        y = decode(Payload(d))
    except CodecError:
        return
    assert y.shape == ref.shape and y.dtype == ref.dtype


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(0, 20), negative=st.booleans())
def test_auto_grid_is_signed_iff_an_entry_is_negative(seed, n, negative):
    # signed=None picks the grid from the data (resolve_signed's contract):
    # signed iff some entry is < 0; zeros and -0.0 are not negative, an empty
    # tensor is unsigned; an explicit choice is kept as given.
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g)  # in [0, 1)
    if n:
        x[torch.randint(0, n, (1,), generator=g)] = -0.0
    if negative and n:
        x[torch.randint(0, n, (1,), generator=g)] = -1e-3 - float(torch.rand(1, generator=g))
    assert resolve_signed(x, None) is (negative and n > 0)
    assert resolve_signed(x, True) is True and resolve_signed(x, False) is False


def test_channel_count_is_the_last_dimension_of_a_2d_or_larger_tensor():
    # One scale per channel (the last dimension); 0-/1-D tensors and tensor
    # granularity have one scale in all (channels_of's contract).
    assert [channels_of(s, False) for s in [(), (7,), (3, 5), (2, 3, 4)]] == [1, 1, 5, 4]
    assert [channels_of(s, True) for s in [(), (7,), (3, 5), (2, 3, 4)]] == [1, 1, 1, 1]


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0)])
@pytest.mark.parametrize("signed", [True, False])
def test_fixpoint_codes_of_an_empty_tensor_are_empty_on_the_right_grid(shape, signed):
    # the n == 0 branch of fixpoint_quantize builds its FixpointCodes by hand
    # (checks/MUTATION.md): no code, no nonzero, the grid's zero code, the scales
    x = torch.empty(shape)
    fc = fixpoint_quantize(x, 4, signed)
    assert fc.codes.dtype == torch.uint8 and fc.codes.shape == (0,)
    assert (fc.zero_code, fc.nnz, fc.signed) == ((8 if signed else 0), 0, signed)
    assert torch.equal(fc.scales, fixpoint_scales(x))
    assert fixpoint_dequantize(fc.codes, fc.scales, 4, signed, shape, x.dtype).shape == shape


def test_fixpoint_bits_range_is_1_to_16_inclusive():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    assert fixpoint_quantize(x, 16).codes.dtype == torch.int32
    for bits in (0, 17):
        with pytest.raises(CodecError, match=f"^qchannel: bits={bits} out of range 1..16$"):
            fixpoint_quantize(x, bits)


@pytest.mark.parametrize("bits", [1, 3, 4, 8, 12])
@pytest.mark.parametrize(("signed", "tensor", "fast"), [
    (True, False, True), (True, False, False), (True, True, True), (False, False, False),
    (False, True, True)])
@given(seed=st.integers(0, 2**31 - 1))
def test_fixpoint_codes_are_the_rounded_quotients_by_the_scale(seed, bits, signed, tensor, fast):
    # AQ-SGD's fixpoint quantiser as written in fixpoint_quantize's docstring:
    # q = round(x / ((s + 1e-6) 2^(1-b))) (signed) or round(x / (s + 1e-6) (2^b - 1));
    # s is one scale per tensor or per channel; s + 1e-6 rounds in float32.
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed))
    if not signed:
        x = x.abs()
    fc = fixpoint_quantize(x, bits, signed, tensor, fast=fast)
    assert torch.equal(fc.scales, fixpoint_scales(x, tensor))
    assert fc.scales.numel() == (1 if tensor else 5)
    d = fc.scales.float() + torch.tensor(1e-6)
    if signed:
        z = 2 ** (bits - 1)
        ref = torch.round(x / (d * 2.0 ** (1 - bits))).clamp(-z, z - 1) + z
    else:
        ref = torch.round((x / d) * float(2**bits - 1)).clamp(0, 2**bits - 1)
    assert torch.equal(fc.codes.long(), ref.reshape(-1).long())
    assert fc.codes.dtype == (torch.uint8 if bits <= 8 else torch.int32)  # the wire code width
    assert (fc.zero_code, fc.signed) == ((2 ** (bits - 1) if signed else 0), signed)
    assert fc.nnz == int(torch.count_nonzero(ref - (2 ** (bits - 1) if signed else 0)))


def _near_tie_inputs(bits: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A channel whose entries sit next to a rounding tie of ``x / den`` (signed grid).

    The first entry fixes the scale; the others are the ``dtype`` neighbours of
    ``(k + 1/2) den`` for several k, where round() is decided by the last bits
    of the quotient, so computing it in another float width changes the code.
    Returns the input and its float64 quotients' reference codes.
    """
    top = 0.8125  # exact in float16, so the scale is exact too
    d64 = torch.tensor(top, dtype=torch.float16).double() + 1e-6
    den = d64 * 2.0 ** (1 - bits)
    ks = torch.arange(-(2 ** (bits - 1)) + 1, 2 ** (bits - 1) - 1, dtype=torch.float64)
    ties = ((ks + 0.5) * den).to(dtype)
    up = torch.nextafter(ties, torch.full_like(ties, math.inf))
    down = torch.nextafter(ties, torch.full_like(ties, -math.inf))
    x = torch.cat([torch.tensor([top], dtype=dtype), ties, up, down])
    return x, den


@pytest.mark.parametrize("bits", [3, 8, 12])
def test_fixpoint_codes_of_float64_are_computed_in_float64(bits):
    # A float64 tensor keeps float64 through s + 1e-6 and the division (no
    # silent float32 step): its codes are the float64 quotients rounded, and
    # the inputs are chosen so that the float32 quotients round differently.
    x, den = _near_tie_inputs(bits, torch.float64)
    z = 2 ** (bits - 1)
    ref64 = torch.round(x / den).clamp(-z, z - 1) + z
    d32 = torch.tensor(0.8125, dtype=torch.float16).float() + torch.tensor(1e-6)
    ref32 = torch.round(x.float() / (d32 * 2.0 ** (1 - bits))).clamp(-z, z - 1) + z
    assert not torch.equal(ref64, ref32.double())  # the input tells the two widths apart
    for fast in (True, False):
        fc = fixpoint_quantize(x, bits, True, False, fast=fast)
        assert torch.equal(fc.codes.long(), ref64.long()), (bits, fast)


@pytest.mark.parametrize("bits", [3, 8, 12])
@pytest.mark.parametrize("fast", [True, False])
def test_fixpoint_codes_of_float32_are_computed_in_float32(bits, fast):
    # A float32 tensor is quantised in float32 (the wire's arithmetic, and the
    # fast path's): at the neighbours of a tie the float32 quotient rounds
    # where the exact (float64) one would not.
    x, _ = _near_tie_inputs(bits, torch.float32)
    z = 2 ** (bits - 1)
    d32 = torch.tensor(0.8125, dtype=torch.float16).float() + torch.tensor(1e-6)
    ref32 = torch.round(x / (d32 * 2.0 ** (1 - bits))).clamp(-z, z - 1) + z
    d64 = torch.tensor(0.8125, dtype=torch.float16).double() + 1e-6
    ref64 = torch.round(x.double() / (d64 * 2.0 ** (1 - bits))).clamp(-z, z - 1) + z
    assert not torch.equal(ref32.double(), ref64)  # the input tells the two widths apart
    fc = fixpoint_quantize(x, bits, True, False, fast=fast)
    assert torch.equal(fc.codes.long(), ref32.long())


@pytest.mark.parametrize("bits", [1, 4, 8, 12])
def test_unsigned_grid_clamps_a_negative_entry_to_code_zero(bits):
    # The unsigned grid is [0, 2^b - 1]; an entry below 0 (a caller who forced
    # signed=False) takes code 0, it does not wrap around the code width.
    x = torch.tensor([[-0.5, 0.25, 1.0], [-2.0, 0.0, 0.5]])
    fc = fixpoint_quantize(x, bits, signed=False, granularity="tensor")
    codes = fc.codes.long().reshape(2, 3)
    assert codes[0, 0] == 0 and codes[1, 0] == 0
    assert int(codes.min()) == 0 and int(codes.max()) <= 2**bits - 1
    assert codes[0, 2] == round(1.0 / (2.0 + 1e-6) * (2**bits - 1))


@pytest.mark.parametrize(("width", "count"), [(1, 3), (3, 2), (5, 3), (12, 1)])
def test_unpack_refuses_a_nonzero_padding_bit_with_its_reason(width, count):
    # The unused low bits of the last byte must be zero (bitpack's MSB-first
    # layout): a set one means a corrupted body, said in so many words; with
    # the check off the same bytes decode.
    buf = pack_bits(torch.zeros(count, dtype=torch.int64), width)
    buf[-1] |= 1  # the last bit of the stream is padding for these sizes
    with pytest.raises(CodecError, match=r"^corrupted body: nonzero padding bits$"):
        unpack_bits(buf, width, count)
    assert unpack_bits(buf, width, count, check_padding=False).tolist() == [0] * count


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_qstoch_law_of_a_zero_tensor_is_the_point_mass_at_zero(bits, shape):
    # x = 0 has no scale (δ = 0): every code is 0 with certainty, so the law is
    # k_lo = 0, p = 0 and mean 0, whatever the shape.
    law = qstoch_law(torch.zeros(shape), bits)
    assert law.k_lo.shape == law.p.shape == shape
    assert law.k_lo.dtype == torch.int64 and law.p.dtype == torch.float64
    assert not law.k_lo.any() and not law.p.any() and law.delta == 0.0
    assert torch.equal(law.mean(), torch.zeros(shape, dtype=torch.float64))


def test_channel_encodes_with_its_own_generator_and_receives_on_the_device():
    # The channel's generator is the only randomness of what it sends (channel.py
    # docstring): a stochastic codec's payload equals the codec's encoding with a
    # generator seeded alike, whatever the global RNG does in between; recv puts
    # the decoded tensor on the device asked for.
    from algorithms.codecs.channel import Channel
    from harness.comm import run_threads

    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    codec = make_codec("qstoch:bits=3")
    expected = codec.encode(x, generator=torch.Generator().manual_seed(11)).data

    def prog(comm):
        ch = Channel(codec, torch.Generator().manual_seed(11))
        if comm.rank == 0:
            torch.manual_seed(12345)  # the global RNG must play no part
            ch.send(comm, x, 1, tag="a")
            return None
        data = comm.recv(0, tag="a")
        return data

    _, got = run_threads(2, prog, timeout_s=30)
    assert torch.equal(got, expected)

    def prog2(comm):
        ch = Channel(make_codec("fp32"))
        if comm.rank == 0:
            ch.send(comm, torch.arange(4.0), 1, tag="b")
            return None
        return ch.recv(comm, 0, tag="b", device=torch.device("meta"))

    _, y = run_threads(2, prog2, timeout_s=30)
    assert y.device.type == "meta" and y.shape == (4,)


def test_identity_claims_omega_zero_and_casts_claim_no_bound():
    # identity is lossless, so E||C(x) - x||^2 = 0 and the tightest bound is
    # omega = 0 (EF and the Clapping bounds use it as the uncompressed case);
    # the casts can overflow to inf and claim none (dense.py docstring).
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    ident = make_codec("identity")
    assert torch.equal(ident.decode(ident.encode(x)), x)
    assert ident.contraction_bound(64) == 0.0
    for cast in ("fp16", "bf16", "fp32", "fp64"):
        assert make_codec(cast).contraction_bound(64) is None


@settings(max_examples=40)
@given(seeds, st.integers(1, 40), st.integers(2, 40), st.booleans(), st.booleans(), st.booleans())
def test_channel_absmax_equals_torchs_amin_amax_bit_for_bit(seed, N, H, f64, transposed, nan):
    """The numpy column reductions give torch's scales bit for bit, all-zero (+0 / -0) columns included."""
    from algorithms.codecs.quant import _absmax_channels, _absmax_columns_torch

    g = gen(seed)
    x = torch.randn(N, H, generator=g, dtype=torch.float64 if f64 else torch.float32)
    x[:, torch.rand(H, generator=g) < 0.15] = -0.0
    x[:, torch.rand(H, generator=g) < 0.15] = 0.0
    if nan:
        x[torch.rand(N, H, generator=g) < 0.1] = float("nan")
    if transposed:
        x = x.T.contiguous().T
    got, want = _absmax_channels(x), _absmax_columns_torch(x)
    assert torch.equal(got.isnan(), want.isnan())
    ibits = torch.int64 if f64 else torch.int32
    assert got.dtype == want.dtype and torch.equal(got.view(ibits)[~got.isnan()], want.view(ibits)[~want.isnan()])


def test_the_decoded_bytes_bound_counts_the_element_width():
    """A payload whose decoded tensor is above ``max_decoded_bytes`` is refused before it is
    allocated; the bound is in bytes (elements times their width), not elements."""
    from algorithms.codecs._core import set_max_decoded_bytes

    p = make_codec("fp32").encode(torch.ones(100))  # 400 decoded bytes
    old = set_max_decoded_bytes(399)
    try:
        with pytest.raises(CodecError, match="more than the decoders' bound of 399 bytes"):
            make_codec("fp32").decode(p)
        set_max_decoded_bytes(400)
        assert torch.equal(make_codec("fp32").decode(p), torch.ones(100))
    finally:
        set_max_decoded_bytes(old)


def test_raw_bytes_shorter_than_asked_are_refused_not_read_past():
    """``from_raw_bytes`` copies by address: a body shorter than the values asked for is a
    CodecError, never a read past its end."""
    from algorithms.codecs._core import from_raw_bytes

    with pytest.raises(CodecError, match="truncated body: 7 bytes, 8 needed"):
        from_raw_bytes(torch.zeros(7, dtype=torch.uint8), torch.float32, 2)
    with pytest.raises(CodecError, match="truncated body: 2 bytes, 3 needed"):
        from_raw_bytes(torch.zeros(3, dtype=torch.uint8), torch.bool, 3, offset=1)
    assert torch.equal(from_raw_bytes(torch.arange(8, dtype=torch.uint8), torch.int32, 2),
                       torch.tensor([0x03020100, 0x07060504], dtype=torch.int32))


@settings(max_examples=60)
@given(seeds, st.sampled_from(["float32", "float64", "float16", "int16", "int64", "uint8"]),
       st.integers(0, 40), st.integers(0, 9), st.booleans())
def test_raw_values_read_at_an_offset_are_numpys_and_a_short_body_is_refused(seed, name, count,
                                                                            offset, short):
    """``from_raw_bytes(b, dtype, shape, offset)`` reads the values at ``b[offset:]`` as
    numpy's little-endian ``frombuffer`` does, in ``shape``; a buffer that ends before the last
    value is a CodecError, whatever the offset, never a read past its end."""
    from algorithms.codecs._core import from_raw_bytes

    dtype = getattr(torch, name)
    width = dtype.itemsize
    nbytes = offset + count * width - (1 if short and count else 0)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen(seed))
    shape = (count,) if count % 2 else (2, count // 2)
    if short and count:
        with pytest.raises(CodecError, match=f"truncated body: {nbytes - offset} bytes, "
                                             f"{count * width} needed"):
            from_raw_bytes(raw, dtype, shape, offset=offset)
        return
    got = from_raw_bytes(raw, dtype, shape, offset=offset)
    want = np.frombuffer(raw.numpy().tobytes(), dtype=np.dtype(name).newbyteorder("<"),
                         count=count, offset=offset).reshape(shape)
    assert got.shape == shape and got.dtype == dtype
    assert got.numpy().tobytes() == want.astype(np.dtype(name)).tobytes()


def test_raw_values_above_the_copy_by_address_bound_are_read_at_their_offset():
    """Above ``COPY_BY_ADDRESS_MAX`` bytes the values are cloned by torch, from the same offset."""
    from algorithms.codecs._core import COPY_BY_ADDRESS_MAX, from_raw_bytes

    count = COPY_BY_ADDRESS_MAX // 4 + 1
    x = torch.randn(count, generator=torch.Generator().manual_seed(1))
    raw = torch.cat([torch.tensor([7, 7, 7], dtype=torch.uint8), x.view(torch.uint8)])
    assert torch.equal(from_raw_bytes(raw, torch.float32, (count, 1), offset=3),
                       x.reshape(count, 1))


@pytest.mark.parametrize("spec", ["identity", "fp32", "fp16"])
@pytest.mark.parametrize("side", [-1, 1])
def test_dense_bodies_either_side_of_the_copy_by_address_bound(spec, side):
    """Below ``COPY_BY_ADDRESS_MAX`` bytes a dense body is copied by address, above it by torch:
    either way the body is the values' little-endian bytes (numpy's, written here) and decodes
    to the cast of the input."""
    from algorithms.codecs._core import COPY_BY_ADDRESS_MAX

    codec = make_codec(spec)
    width = 2 if spec == "fp16" else 4
    n = COPY_BY_ADDRESS_MAX // width + side
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    p = codec.encode(x)
    sent = x.to(torch.float16) if spec == "fp16" else x
    body = p.data.numpy()[p.nbytes - n * width:]
    assert body.tobytes() == sent.numpy().astype(sent.numpy().dtype.newbyteorder("<")).tobytes()
    assert torch.equal(codec.decode(p), sent.to(x.dtype))
