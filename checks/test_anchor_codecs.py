"""Codecs anchored to formulas written here, for every dtype, bit width and padding case.

``checks/test_codecs.py`` checks the declared properties mostly in float32 /
float64 and the example bit widths.  Here every property is checked for every
dtype each codec accepts and for sizes whose last byte is and is not full
(``n·b mod 8 ≠ 0``), against formulas written independently of the codecs:

* the accepted dtypes, as a table;
* the payload size from the papers' bit accounting (double quantisation: ``32 + b·d``
  bits for δ and the codes; sparse: index and value bits; natural compression:
  a sign and an exponent per entry) plus the documented framing, never from the
  codec's own ``encoded_nbytes``;
* the information floor ``floor_bits`` from its closed form (counting arguments);
* unbiasedness of every unbiased stochastic codec: a z-test at 6σ with the exact
  per-coordinate variance of the ideal law (false alarm < 2e-9 per coordinate),
  plus the documented deterministic error of rounding the decoded value into the
  dtype;
* Top-K's magnitude ordering and contraction, every dtype.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import CodecError, make_codec

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALL = (*FLOATS, *INTS, torch.bool)
seeds = st.integers(0, 2**32 - 1)
Z = 6.0  # two-sided P(|N(0,1)| > 6) ≈ 2e-9

ACCEPTS = {  # which input dtypes each codec encodes (module docstrings of algorithms/codecs)
    "identity": ALL, "fp32": ALL, "fp16": ALL, "bf16": ALL, "fp64": ALL,
    "qstoch:bits=4": FLOATS, "qchannel:bits=4": FLOATS, "topk:k=2": FLOATS,
    "randk:k=2": FLOATS, "sparse": ALL, "sparse:bits=4": INTS, "natural": FLOATS,
    "sparse-qstoch:bits=4": FLOATS, "ids:vocab=256": INTS,
}
EXPONENT_BITS = {torch.float16: 5, torch.bfloat16: 8, torch.float32: 8, torch.float64: 11}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ceil8(bits: int) -> int:
    return -(-bits // 8)


def framing(ndim: int, params: int) -> int:
    """Header bytes besides the parameters: magic 2, version, id, dtype, ndim, 4/dim, body CRC 4,
    header CRC 4 (the shared codec header, version 2)."""
    return 14 + 4 * ndim + params


def log2_choose(n: int, k: int) -> float:
    return math.log2(math.comb(n, k))


@pytest.mark.parametrize("spec", sorted(ACCEPTS))
def test_accepted_dtypes(spec):
    codec = make_codec(spec)
    for dtype in ALL:
        x = torch.tensor([0, 1, 1, 0], dtype=torch.int64).to(dtype)
        if dtype in ACCEPTS[spec]:
            assert torch.equal(codec.decode(codec.encode(x, gen(0))).to(torch.float64) != 0,
                               x.to(torch.float64) != 0) or codec.stochastic
        else:
            with pytest.raises(CodecError):
                codec.encode(x, gen(0))


# ============================================================================ size and floor
@given(seeds, st.integers(2, 16), st.integers(1, 37), st.sampled_from(FLOATS))
def test_qstoch_size_is_the_papers_32_plus_b_d(seed, b, d, dtype):
    """Double quantisation (paper §3, bit accounting): δ in 32 bits and d codes of b bits."""
    codec = make_codec(f"qstoch:bits={b}")
    x = (torch.randn(d, generator=gen(seed), dtype=torch.float64) + 0.1).to(dtype)
    p = codec.encode(x, gen(seed))
    # the header holds b (1 byte) besides δ; the body pads b·d bits to whole bytes
    assert p.nbytes == framing(1, 1) + ceil8(32 + b * d)
    assert codec.floor_bits(x) == pytest.approx(32 + d * math.log2(2**b - 1), rel=1e-12)
    assert codec.floor_bits(x) <= 32 + b * d
    assert codec.decode(p).dtype == dtype


@given(seeds, st.integers(2, 16), st.integers(1, 40), st.floats(0.05, 1.0), st.sampled_from(FLOATS))
def test_sparse_qstoch_size_is_index_plus_code_bits(seed, b, n, density, dtype):
    """Sparsified then quantised (paper §4): δ, then nnz b-bit codes after the cheapest positions
    (⌈log2 n⌉-bit indices, a bitmap, Elias–Fano, or none: all n codes)."""
    codec = make_codec(f"sparse-qstoch:bits={b}")
    g = gen(seed)
    keep = torch.rand(n, generator=g, dtype=torch.float64) < density
    x = torch.where(keep, torch.randn(n, generator=g, dtype=torch.float64) + 3.0, 0.0).to(dtype)
    nnz = int(keep.sum())
    w = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    p = codec.encode(x, gen(seed))
    # parameters b (1 byte) and nnz (4 bytes) besides δ; positions (the cheapest of an index list,
    # a bitmap, Elias–Fano, or none with all n codes sent) and codes padded apart.  Elias–Fano
    # (Elias 1974): nnz low fields of l = ⌊log2(n/nnz)⌋ bits, then nnz ones in nnz + ⌊(n-1)/2^l⌋ bits
    body = min(ceil8(nnz * w) + ceil8(nnz * b), ceil8(n) + ceil8(nnz * b), ceil8(n * b))
    if nnz:
        low = math.floor(math.log2(n / nnz))
        body = min(body, ceil8(nnz * low) + ceil8(nnz + (n - 1) // 2**low) + ceil8(nnz * b))
    assert p.nbytes == framing(1, 5) + 4 + body
    assert codec.floor_bits(x) == pytest.approx(32 + log2_choose(n, nnz) + nnz * math.log2(2**b - 1),
                                                rel=1e-9, abs=1e-9)
    assert codec.floor_bits(x) <= 32 + nnz * (w + b) + 1e-9


@given(seeds, st.integers(1, 37), st.sampled_from(FLOATS))
def test_natural_size_is_sign_and_exponent_bits(seed, n, dtype):
    """Natural compression (Horváth et al. 2019): a sign bit and the exponent field per entry."""
    codec = make_codec("natural")
    x = (torch.randn(n, generator=gen(seed), dtype=torch.float64) * 10).to(dtype)
    per = 1 + EXPONENT_BITS[dtype]
    assert codec.encode(x, gen(seed)).nbytes == framing(1, 1) + ceil8(n * per)
    assert codec.floor_bits(x) == n * per


@given(seeds, st.integers(1, 40), st.integers(1, 40), st.sampled_from(FLOATS),
       st.sampled_from(["topk", "randk"]))
def test_sparsifier_floor_is_k_positions_and_k_values(seed, n, k, dtype, name):
    """Top-k / rand-k: which k of n positions (log2 C(n,k)) and k raw values of the dtype."""
    k = min(k, n)
    codec = make_codec(f"{name}:k={k}")
    x = torch.randn(n, generator=gen(seed), dtype=torch.float64).to(dtype)
    vb = 8 * x.element_size()
    assert codec.floor_bits(x) == pytest.approx(log2_choose(n, k) + k * vb, rel=1e-9, abs=1e-9)
    w = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    body = min(ceil8(n * vb), ceil8(n) + ceil8(k * vb), ceil8(k * w) + ceil8(k * vb))
    assert codec.encode(x, gen(seed)).nbytes == framing(1, 7) + body


@given(seeds, st.integers(1, 16), st.integers(1, 9), st.integers(1, 5), st.sampled_from(FLOATS))
def test_qchannel_floor_counts_support_codes_and_scales(seed, b, rows, cols, dtype):
    codec = make_codec(f"qchannel:bits={b}")
    x = torch.randn((rows, cols), generator=gen(seed), dtype=torch.float64).to(dtype)
    y = codec.decode(codec.encode(x))
    k, n = int(torch.count_nonzero(y)), rows * cols  # nonzero codes decode to nonzero values
    want = math.log2(n + 1) + log2_choose(n, k) + k * math.log2(2**b - 1) + 16 * cols
    assert codec.floor_bits(x) == pytest.approx(want, rel=1e-9)


@given(seeds, st.integers(1, 37), st.sampled_from(ALL),
       st.sampled_from(["identity", "fp32", "fp16", "bf16", "fp64"]))
def test_dense_floor_and_size(seed, n, dtype, name):
    codec = make_codec(name)
    x = torch.randint(0, 2, (n,), generator=gen(seed)).to(dtype)
    width = {"fp32": 32, "fp16": 16, "bf16": 16, "fp64": 64}.get(name, 8 * x.element_size())
    assert codec.floor_bits(x) == n * width
    assert codec.encode(x).nbytes == framing(1, 1) + ceil8(n * width)


@given(seeds, st.integers(0, 37), st.sampled_from(INTS),
       st.sampled_from([1, 2, 255, 256, 257, 50_257, 50_272, 65_536, 65_537]))
def test_ids_size_and_floor(seed, n, dtype, vocab):
    hi = min(vocab, torch.iinfo(dtype).max + 1)
    codec = make_codec(f"ids:vocab={vocab}")
    x = torch.randint(0, hi, (n,), generator=gen(seed)).to(dtype)
    width = 8 if vocab <= 256 else 16 if vocab <= 65_536 else 32  # narrowest holding V − 1
    assert codec.encode(x).nbytes == framing(1, 4) + n * width // 8
    assert codec.floor_bits(x) == pytest.approx(n * math.log2(vocab), abs=1e-9)
    assert torch.equal(codec.decode(codec.encode(x)), x)


# ============================================================================ unbiasedness
def _z_test(samples: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, slack: torch.Tensor):
    """|empirical mean − mean| ≤ Z·σ/√N + slack, coordinate by coordinate."""
    N = samples.shape[0]
    err = (samples.mean(0) - mean).abs()
    bound = Z * var.clamp(min=0).sqrt() / math.sqrt(N) + slack
    bad = err > bound
    assert not bool(bad.any()), (
        f"bias at {bad.nonzero().reshape(-1).tolist()[:5]}: err {err[bad][:5].tolist()} "
        f"> bound {bound[bad][:5].tolist()}"
    )


N_DRAWS = 2000


@settings(max_examples=10)
@given(seeds, st.integers(2, 16), st.integers(1, 13), st.sampled_from(FLOATS))
def test_qstoch_is_unbiased_for_every_dtype_and_width(seed, b, d, dtype):
    """E[Q(x)] = x (paper Lemma 1).  Coordinates are rounded independently given δ = ‖x‖∞/L,
    and tiling x N times keeps ‖x‖∞, so one encode of the tiled vector gives N draws of Q(x).
    Ideal law (written here): Q(x)_i = δ(⌊x_i/δ⌋ + Bernoulli(frac(x_i/δ))), variance
    δ² f(1 − f).  Slack: the decoded value is rounded into the dtype (≤ eps·(|x| + δ), the
    float32 δ on the wire 2^-23·(|x| + δ)) and the sampler resolves f on a 2^-14 grid."""
    x = (torch.randn(d, generator=gen(seed), dtype=torch.float64)).to(dtype)
    xd = x.to(torch.float64)
    L = 2 ** (b - 1) - 1
    delta = float(xd.abs().max()) / L
    f = torch.frac((xd / delta).abs())
    codec = make_codec(f"qstoch:bits={b}")
    y = codec.decode(codec.encode(x.repeat(N_DRAWS), gen(seed))).to(torch.float64).view(N_DRAWS, d)
    eps = float(torch.finfo(dtype).eps)
    slack = (eps + 2.0**-22) * (xd.abs() + delta) + delta * 2.0**-14
    _z_test(y, xd, delta**2 * f * (1 - f), slack)
    # the support: every draw is one of the two neighbouring grid points
    lo = torch.floor(xd / delta) * delta
    assert bool(((y - lo).abs() <= delta * (1 + 1e-6) + slack).all())


@settings(max_examples=10)
@given(seeds, st.integers(2, 16), st.integers(2, 13), st.sampled_from(FLOATS))
def test_sparse_qstoch_is_unbiased_and_keeps_zeros(seed, b, d, dtype):
    g = gen(seed)
    keep = torch.rand(d, generator=g) < 0.6
    x = torch.where(keep, torch.randn(d, generator=g, dtype=torch.float64), 0.0).to(dtype)
    xd = x.to(torch.float64)
    L = 2 ** (b - 1) - 1
    delta = float(xd.abs().max()) / L if bool((xd != 0).any()) else 1.0
    f = torch.frac((xd / delta).abs())
    codec = make_codec(f"sparse-qstoch:bits={b}")
    y = codec.decode(codec.encode(x.repeat(N_DRAWS), gen(seed))).to(torch.float64).view(N_DRAWS, d)
    assert bool((y[:, xd == 0] == 0).all())
    eps = float(torch.finfo(dtype).eps)
    slack = (eps + 2.0**-22) * (xd.abs() + delta)
    _z_test(y, xd, delta**2 * f * (1 - f), slack)


@settings(max_examples=10)
@given(seeds, st.integers(1, 13), st.sampled_from(FLOATS))
def test_natural_is_unbiased_for_every_dtype(seed, d, dtype):
    """Natural compression: |x| in [2^a, 2^(a+1)] goes to 2^(a+1) with probability |x|/2^a − 1,
    so E = x and the variance is (|x| − 2^a)(2^(a+1) − |x|); powers of two are exact."""
    x = (torch.randn(d, generator=gen(seed), dtype=torch.float64) * 4).to(dtype)
    xd = x.to(torch.float64)
    a = torch.floor(torch.log2(xd.abs().clamp(min=1e-300)))
    lo = torch.exp2(a)
    var = torch.where(xd == 0, 0.0, (xd.abs() - lo) * (2 * lo - xd.abs()))
    codec = make_codec("natural")
    y = codec.decode(codec.encode(x.repeat(N_DRAWS), gen(seed))).to(torch.float64).view(N_DRAWS, d)
    _z_test(y, xd, var, 1e-12 * xd.abs())
    # every value is ±0 or a signed power of two bracketing x
    nz = y != 0
    assert bool((torch.frexp(y[nz])[0].abs() == 0.5).all())


@settings(max_examples=4)
@given(seeds, st.integers(2, 9), st.sampled_from(FLOATS))
def test_scaled_randk_is_unbiased_for_every_dtype(seed, d, dtype):
    """Rand-k with scaling: each coordinate kept with probability k/d as x·d/k, so E = x and
    the variance is x²(d/k − 1); d/k·x is rounded once into the dtype (≤ eps·|x|·d/k)."""
    k = max(1, d // 3)
    x = torch.randn(d, generator=gen(seed), dtype=torch.float64).to(dtype)
    xd = x.to(torch.float64)
    codec = make_codec(f"randk:k={k},scaled=true")
    g = gen(seed)
    y = torch.stack([codec.decode(codec.encode(x, g)).to(torch.float64) for _ in range(600)])
    assert bool(((y != 0).sum(1) <= k).all())
    eps = float(torch.finfo(dtype).eps)
    _z_test(y, xd, xd**2 * (d / k - 1), eps * xd.abs() * d / k)


# ============================================================================ top-k ordering
@given(seeds, st.integers(1, 40), st.integers(1, 40), st.sampled_from(FLOATS))
def test_topk_keeps_the_k_largest_magnitudes_in_every_dtype(seed, n, k, dtype):
    k = min(k, n)
    x = torch.randn(n, generator=gen(seed), dtype=torch.float64).to(dtype)
    codec = make_codec(f"topk:k={k}")
    y = codec.decode(codec.encode(x))
    assert y.dtype == dtype
    kept = y != 0
    assert int(kept.sum()) <= k and torch.equal(y[kept], x[kept])  # kept values travel exactly
    a = x.to(torch.float64).abs()
    # exactly the k largest: the k-th order statistic separates kept and dropped
    kth = torch.sort(a, descending=True).values[k - 1]
    assert bool((a[~kept] <= kth).all()) and bool((a[kept] >= kth).all())
    err = float(((y.to(torch.float64) - x.to(torch.float64)) ** 2).sum())
    assert err <= (1 - k / n) * float((x.to(torch.float64) ** 2).sum()) * (1 + 1e-12) + 1e-300
