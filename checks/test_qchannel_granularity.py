"""qchannel's scale granularities: channel (AQ-SGD's), tensor (SparQ's default) and token.

Each granularity is checked against formulas written here, not the codec's
helpers: the scales are ``fp16(max |x|)`` over the group (a last-dimension
channel, one row, or everything), the wire reproduces the quantiser exactly,
the payload's size is ``h0 + 2H + min(dense, bitmap, coo)`` with ``H`` the
number of groups, every decoded value lies within its group's half step (or
its clip) and never farther from ``x`` than 0, and a payload whose header
claims two granularities is refused.  Inputs are hypothesis-drawn, float32
and float64.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.codecs import CodecError, decode, fixpoint_dequantize, fixpoint_quantize, make_codec
from algorithms.codecs._core import FAMILY_QCHANNEL, build_header, seal
from algorithms.codecs.quant import FLAG_SIGNED, FLAG_TENSOR, FLAG_TOKEN, fixpoint_scales

from .test_codecs import best_format, gen, h0, index_bits, seeds, sparse_costs, sparse_randn

GRANS = ("channel", "tensor", "token")
DTYPES = st.sampled_from([torch.float32, torch.float64])
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


def groups(x: torch.Tensor, gran: str) -> torch.Tensor:
    """``x`` as (groups, members): one row per scale."""
    if x.dim() <= 1 or gran == "tensor":
        return x.reshape(1, -1)
    if gran == "token":
        return x.reshape(-1, x.shape[-1])
    return x.reshape(-1, x.shape[-1]).T


def heavy_input(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Sparse values, rows and channels of very different magnitudes (as FFN activations)."""
    g = gen(seed + 7)
    x = sparse_randn(shape, 0.6, seed, torch.float64)
    if x.dim() >= 2:
        x = x * 10.0 ** (-2 + 4 * torch.rand(shape[-1], generator=g, dtype=torch.float64))
        x = x * 10.0 ** (-1 + 2 * torch.rand(shape[:-1] + (1,), generator=g, dtype=torch.float64))
    return x.to(dtype)


@given(seeds, shapes, st.sampled_from(GRANS))
def test_scales_are_the_group_absmax(seed, shape, gran):
    x = heavy_input(seed, shape, torch.float64)
    want = groups(x, gran).abs().amax(dim=1).to(torch.float16)
    assert torch.equal(fixpoint_scales(x, gran), want)


@given(seeds, shapes, st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from(GRANS),
       st.sampled_from(["", ",format=coo", ",format=bitmap", ",format=dense", ",signed=false"]), DTYPES)
def test_wire_is_exact_and_sized(seed, shape, bits, gran, opts, dtype):
    x = heavy_input(seed, shape, dtype)
    codec = make_codec(f"qchannel:bits={bits},granularity={gran}{opts}")
    signed = "signed=false" not in opts
    fc = fixpoint_quantize(x, bits, signed, gran, fast=False)
    p = codec.encode(x)
    y = codec.decode(p)
    assert y.dtype == dtype and torch.equal(y, fixpoint_dequantize(
        fc.codes, fc.scales, bits, signed, shape, dtype, None, gran))
    H = groups(x, gran).shape[0]
    costs = sparse_costs(x.numel(), fc.nnz, bits, index_bits(x.numel()))
    fmt = opts.split("format=")[1] if "format=" in opts else best_format(costs)
    assert p.nbytes == codec.encoded_nbytes(x) == h0(len(shape), 7) + 2 * H + costs[fmt]
    assert int(torch.count_nonzero(y)) <= fc.nnz


@given(seeds, shapes, st.sampled_from([1, 2, 4, 8]), st.sampled_from(GRANS), DTYPES)
def test_error_within_half_step_of_its_group(seed, shape, bits, gran, dtype):
    x = heavy_input(seed, shape, dtype)
    y = make_codec(f"qchannel:bits={bits},granularity={gran}").decode(
        make_codec(f"qchannel:bits={bits},granularity={gran}").encode(x))
    xg, yg = groups(x.double(), gran), groups(y.double(), gran)
    s = xg.abs().amax(dim=1, keepdim=True).to(torch.float16).double()
    err = (xg - yg).abs()
    rel = 2.0**-20 * xg.abs() + 4e-6  # float rounding of x / (s + 1e-6) and the fp16 scale's eps
    assert bool((err <= xg.abs() * (1 + 1e-6) + 1e-300).all())  # never farther than 0
    assert bool((yg.abs() <= s * (1 + 1e-6)).all())  # decode bound: |x̂| <= the group's scale
    inner = xg.abs() <= s * (1 - 2.0 ** (1 - bits))  # not clipped by the top code
    assert bool((err <= s * 2.0**-bits * (1 + 1e-3) + rel)[inner].all())


@given(seeds, st.lists(st.integers(1, 5), min_size=2, max_size=3).map(tuple), st.sampled_from([1, 2, 4, 8]),
       DTYPES)
def test_token_grid_is_lossless(seed, shape, bits, dtype):
    """Values on each row's own grid (absmax attained in the row) round-trip exactly."""
    g = gen(seed)
    rows = math.prod(shape[:-1])
    s = (10.0 ** (-2 + 4 * torch.rand(rows, 1, generator=g))).half().double()
    q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (rows, shape[-1]), generator=g)
    q[:, 0] = -(2 ** (bits - 1))
    x = (q.double() * 2.0 ** (1 - bits) * s).to(dtype).reshape(shape)
    codec = make_codec(f"qchannel:bits={bits},granularity=token")
    assert codec.is_lossless_on(x)
    assert torch.equal(codec.decode(codec.encode(x)), x)


@given(seeds, st.sampled_from([2, 4]))
def test_token_fast_path_equals_reference(seed, bits):
    x = heavy_input(seed, (3, 5, 7), torch.float32)
    fast = fixpoint_quantize(x, bits, True, "token", fast=True)
    slow = fixpoint_quantize(x, bits, True, "token", fast=False)
    assert torch.equal(fast.codes, slow.codes) and fast.nnz == slow.nnz


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0,), ()])
@pytest.mark.parametrize("gran", GRANS)
def test_empty_and_scalar_shapes(shape, gran):
    x = -torch.ones(shape)  # -s is on the signed grid (+s clips to (1 - 2**(1-b)) s)
    codec = make_codec(f"qchannel:bits=4,granularity={gran}")
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_header_with_two_granularities_is_refused():
    """Both flags set, sealed with valid CRCs: the decoder names the conflict, not a size."""
    flags = FLAG_SIGNED | FLAG_TENSOR | FLAG_TOKEN
    head = build_header(FAMILY_QCHANNEL, torch.float32, (2, 3), struct.pack("<BBBI", 4, flags, 0, 0))
    t = torch.frombuffer(bytearray(head + bytes(2 * 2) + bytes(3)), dtype=torch.uint8)
    seal(t)
    with pytest.raises(CodecError, match="both tensor and token"):
        decode(t)


def test_bad_granularity_names_the_choices():
    with pytest.raises(CodecError, match="channel, tensor, token"):
        make_codec("qchannel:granularity=row")
