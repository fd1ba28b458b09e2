"""Natural compression (algorithms/codecs/natural.py): declared properties of the codec."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.codecs import CodecError, Payload
from algorithms.codecs.natural import NaturalCodec, code_width, exponent_range
from algorithms.pipeline.links import make_link_codec

SEEDS = st.integers(0, 2**32 - 1)
C = NaturalCodec()


def _x(seed, n=64, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 10 ** (4 * torch.rand(n, generator=g) - 2)).to(dtype)


@given(SEEDS, st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
def test_outputs_are_signed_powers_of_two_bracketing_each_entry(seed, dtype):
    x = _x(seed, dtype=dtype)
    x[::7] = 0
    y = C.decode(C.encode(x, generator=torch.Generator().manual_seed(seed)))
    assert y.dtype == dtype and y.shape == x.shape
    xd, yd = x.double(), y.double()
    assert bool((yd[xd == 0] == 0).all())
    nz = xd != 0
    emin = exponent_range(dtype)[0]
    a = torch.floor(torch.log2(xd[nz].abs()))
    lo, hi = torch.exp2(a), torch.exp2(a + 1)
    # a subnormal entry rounds to 0 or the smallest normal power 2^emin (module docstring)
    sub = a < emin
    lo, hi = torch.where(sub, 0.0, lo), torch.where(sub, 2.0**emin, hi)
    assert bool(((yd[nz].abs() == lo) | (yd[nz].abs() == hi)).all())
    assert bool(((torch.sign(yd[nz]) == torch.sign(xd[nz])) | (yd[nz] == 0)).all())
    assert C.is_lossless_on(y)


@given(SEEDS)
def test_unbiased_with_the_closed_form_variance_and_the_one_eighth_bound(seed):
    x = _x(seed, n=16)
    n = 20_000
    g = torch.Generator().manual_seed(seed)
    # one encode of n copies: entries are rounded independently, so rows are i.i.d. draws
    ys = C.decode(C.encode(x.repeat(n), generator=g)).reshape(n, -1)
    a = torch.exp2(torch.floor(torch.log2(x.abs())))
    var = (x.abs() - a) * (2 * a - x.abs())  # (|t| - 2^a)(2^(a+1) - |t|)
    se = (var / n).sqrt()
    assert bool(((ys.mean(0) - x).abs() <= 5 * se + 1e-15).all())
    # per-entry variance: the sample variance of a two-point law, within 5 SE of the closed form
    # (SE of a sample variance <= sqrt(E[(y-x)^4]/n) <= (2^a) * sqrt(var/n) for brackets of width 2^a)
    emp = ((ys - x) ** 2).mean(0)
    assert bool(((emp - var).abs() <= 5 * a * se + 1e-15).all())
    assert bool((var <= x**2 / 8 + 1e-15).all())
    mse = ((ys - x) ** 2).sum(1)
    assert mse.mean() <= x.pow(2).sum() / 8 + 5 * mse.std() / math.sqrt(n)


@given(SEEDS, st.integers(0, 4), st.sampled_from([torch.float32, torch.float16, torch.float64]))
def test_counted_bytes_equal_the_closed_form(seed, ndim, dtype):
    g = torch.Generator().manual_seed(seed)
    shape = tuple(int(s) for s in torch.randint(1, 6, (ndim,), generator=g))
    x = torch.randn(shape, generator=g).to(dtype)
    p = C.encode(x, generator=g)
    width = {torch.float32: 9, torch.float16: 6, torch.float64: 12}[dtype]
    assert p.nbytes == C.encoded_nbytes(x) == C.header_nbytes(x) + math.ceil(x.numel() * width / 8)
    assert C.floor_bits(x) == x.numel() * width


def test_fp16_costs_six_bits_per_entry_the_papers_37_5_percent():
    assert code_width(torch.float16) == 6 and code_width(torch.float16) / 16 == 0.375
    assert code_width(torch.float32) == code_width(torch.bfloat16) == 9


def test_range_edges_do_not_overflow_and_subnormals_stay_unbiased():
    big = torch.tensor([3e38, -3e38], dtype=torch.float32)
    assert torch.isfinite(C.decode(C.encode(big, generator=torch.Generator().manual_seed(0)))).all()
    tiny = torch.full((200_000,), 2.0**-130, dtype=torch.float32)  # subnormal
    y = C.decode(C.encode(tiny, generator=torch.Generator().manual_seed(1))).double()
    assert set(y.unique().tolist()) <= {0.0, 2.0**-126}
    frac = (y > 0).double().mean().item()  # should be 2^-4
    assert abs(frac - 1 / 16) < 5 * math.sqrt(1 / 16 * 15 / 16 / tiny.numel())


def test_malformed_payloads_raise():
    x = torch.randn(10)
    p = C.encode(x, generator=torch.Generator().manual_seed(0))
    with pytest.raises(CodecError, match="truncated|trailing"):
        C.decode(Payload(p.data[:-1].clone()))
    bad = p.data.clone()
    bad[7] ^= 1  # header byte: CRC catches it
    with pytest.raises(CodecError):
        C.decode(Payload(bad))
    with pytest.raises(CodecError, match="NaN"):
        C.encode(torch.tensor([1.0, float("nan")]))


def test_links_build_it_by_name_and_declare_its_properties():
    c = make_link_codec("natural")
    assert isinstance(c, NaturalCodec) and c.unbiased and c.stochastic
    assert c.contraction_bound(100) == pytest.approx(math.sqrt(1 / 8))
    assert c.spec() == "natural"


def test_the_codec_library_alone_builds_lists_and_decodes_it():
    """A fresh interpreter that imports only ``algorithms.codecs``: "natural" is built in.

    ``CODECS`` is fixed when the registry module loads, so it lists only the
    built-in codecs, never one added later by ``register_codec``.
    """
    code = (
        "import torch\n"
        "from algorithms.codecs import CODECS, EXAMPLE_SPECS, NaturalCodec, decode, make_codec\n"
        "assert 'natural' in CODECS and 'natural' in EXAMPLE_SPECS\n"
        "c = make_codec('natural')\n"
        "assert isinstance(c, NaturalCodec)\n"
        "x = torch.tensor([0.5, -2.0, 0.0])\n"
        "assert torch.equal(decode(c.encode(x).tobytes()), x)\n"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root)
