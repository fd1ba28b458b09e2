"""Double quantisation: the unbiased quantiser's exact law and variance (closed form and the
paper's bounds), and the sparsifier's unbiasedness and expected number of non-zeros."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import make_codec, qstoch_law, qstoch_paper_mse, qstoch_round_probs
from algorithms.dataparallel import dq_wire as wire

ALPHA = 1e-9  # per-assertion false-alarm rate for Monte-Carlo checks


def _vector(seed: int, d: int, scale_exp: int, sparse: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g, dtype=torch.float64) * 10.0**scale_exp
    if sparse:
        x[torch.rand(d, generator=g) < 0.3] = 0.0
    return x


vec_args = dict(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 300), scale_exp=st.integers(-6, 6),
                b=st.integers(2, 16))


@given(**vec_args)
def test_ideal_quantiser_is_unbiased_with_variance_delta2_sum_f_1_minus_f(seed, d, scale_exp, b):
    x = _vector(seed, d, scale_exp, sparse=True)
    if not bool(x.any()):
        return
    lo, f, delta = qstoch_round_probs(x, b)
    L = 2 ** (b - 1) - 1
    assert delta == float(x.abs().max()) / L
    assert bool(((f >= 0) & (f < 1)).all()) and bool((lo.abs() <= L).all())
    # E[Q] = δ(lo + f) = x (the law, computed exactly; no sampling)
    assert torch.allclose(delta * (lo + f), x, rtol=1e-12, atol=1e-12 * delta)
    # E‖Q − x‖² straight from the two-point law equals the closed form δ² Σ f(1 − f)
    direct = float((f * (delta * (lo + 1) - x) ** 2 + (1 - f) * (delta * lo - x) ** 2).sum())
    closed = qstoch_paper_mse(x, b)
    assert math.isclose(direct, closed, rel_tol=1e-9, abs_tol=1e-12 * d * delta**2)
    # the paper's bounds: Lemma 4 (d δ²/4), Lemma 1 (Δ‖x‖², Δ = d/(4L²)), and δ‖x‖₁
    slack = 1 + 1e-12
    assert closed <= d * delta**2 / 4 * slack
    assert closed <= d / (4 * L * L) * float(x.pow(2).sum()) * slack
    assert closed <= delta * float(x.abs().sum()) * slack


@given(**vec_args)
def test_implemented_sampler_law_matches_the_ideal_one(seed, d, scale_exp, b):
    """qstoch (float32 δ on the wire, 2^-R rounding grid) is within its stated error of the ideal law."""
    x = _vector(seed, d, scale_exp)
    law = qstoch_law(x, b)
    delta = float(x.abs().max()) / (2 ** (b - 1) - 1)
    res = 2.0 ** -(law.resolution_bits + 1)
    assert bool(((law.mean() - x).abs() <= delta * res + 2.0**-23 * x.abs() + 1e-15 * delta).all())
    eps = (2 ** (b - 1) - 1) * 2.0**-23  # |k| δ · rel. error of float32(δ), relative to δ
    gap = d * delta**2 * (2 * eps + eps**2 + 2 * res)
    assert abs(law.mse(x) - qstoch_paper_mse(x, b)) <= gap


@settings(max_examples=4)
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([2, 4, 8]))
def test_sampler_follows_its_law(seed, b):
    """Monte Carlo ties the encoder to the exact law (Hoeffding, Bonferroni over coordinates)."""
    d, N = 32, 2000
    x = _vector(seed, d, 0)
    law = qstoch_law(x, b)
    codec = make_codec(f"qstoch:bits={b}")
    g = torch.Generator().manual_seed(seed)
    draws = torch.stack([codec.decode(codec.encode(x, generator=g)) for _ in range(N)])
    delta = law.delta
    tol = delta * math.sqrt(math.log(2 * d / ALPHA) / (2 * N))
    assert float((draws.mean(0) - law.mean()).abs().max()) <= tol
    sq = (draws - x).pow(2).sum(1)  # each in [0, d δ²]
    assert abs(float(sq.mean()) - law.mse(x)) <= d * delta**2 * math.sqrt(math.log(2 / ALPHA) / (2 * N))


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 300), phi=st.sampled_from([1.0, 0.5, 0.1]))
def test_sparsifier_law_is_unbiased_with_expected_nnz_phi(seed, d, phi):
    alpha = _vector(seed, d, 0, sparse=True)
    p, mag, phi_t = wire.sparsify_law(alpha, phi)
    if not bool(alpha.any()):
        assert phi_t == 0.0 and not bool(p.any())
        return
    l1, linf = float(alpha.abs().sum()), float(alpha.abs().max())
    assert math.isclose(phi_t, phi * l1 / linf, rel_tol=1e-12)
    assert math.isclose(float(p.sum()), phi_t, rel_tol=1e-12)  # E[nnz] = Σ p_i = φ_t
    assert bool(((p >= 0) & (p <= 1)).all()) and torch.equal(p == 0, alpha == 0)
    assert torch.allclose(p * mag, alpha.abs(), rtol=1e-12, atol=0)  # E[β_i] = p_i · sign(α_i)|β| = α_i
    if phi == 1.0:
        assert float(p.max()) == 1.0  # the largest coordinate is always kept
    # Lemma 2: these p minimise E‖β‖² = Σ α²/p = ‖α‖₁²/φ_t
    nz = alpha != 0
    assert math.isclose(float((alpha[nz] ** 2 / p[nz]).sum()), l1**2 / phi_t, rel_tol=1e-9)


@settings(max_examples=4)
@given(seed=st.integers(0, 2**32 - 1), phi=st.sampled_from([1.0, 0.3]))
def test_sparsifier_sampler_nnz_and_mean(seed, phi):
    d, N = 64, 4000
    alpha = _vector(seed, d, 0)
    p, mag, phi_t = wire.sparsify_law(alpha, phi)
    g = torch.Generator().manual_seed(seed)
    betas = torch.stack([wire.sparsify(alpha, phi, g)[0] for _ in range(N)])
    nnz = (betas != 0).sum(1).to(torch.float64)
    sd = math.sqrt(float((p * (1 - p)).sum()) / N)
    assert abs(float(nnz.mean()) - phi_t) <= 6.5 * sd + 1e-12  # two-sided 6.5σ: ~8e-11
    tol = mag * math.sqrt(math.log(2 * d / ALPHA) / (2 * N))  # β_i ∈ {0, sign(α_i)|β|}: range |β|
    assert float((betas.mean(0) - alpha).abs().max()) <= tol
    assert bool(((betas == 0) | (betas.abs() == mag)).all())  # survivors share one magnitude


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(2, 300), phi=st.sampled_from([1.0, 0.3]))
def test_sparsifier_keeps_coordinate_i_when_its_float64_uniform_is_below_p_i(seed, d, phi):
    """Eq. (4)'s Bernoulli(p_i) draws: one float64 uniform U_i per coordinate from the caller's
    generator, kept iff U_i < p_i (53-bit resolution, not float32's 24), re-derived here; the
    generator then sits exactly d float64 draws further on (what the next message sees)."""
    alpha = _vector(seed, d, 0)
    p, mag, _ = wire.sparsify_law(alpha, phi)
    g, ref = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 1)
    beta, _ = wire.sparsify(alpha, phi, g)
    u = torch.rand(d, generator=ref, dtype=torch.float64)
    assert torch.equal(beta, torch.where(u < p, torch.sign(alpha) * mag, torch.zeros_like(alpha)))
    assert torch.equal(g.get_state(), ref.get_state())


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 500), b=st.integers(2, 16))
def test_sparse_then_quantise_is_lossless_and_round_trips(seed, d, b):
    alpha = _vector(seed, d, 0, sparse=True)
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    beta, _ = wire.sparsify(alpha, 1.0, g1)
    msg = wire.sparse_quantized(alpha, b, 1.0, g2)
    out = wire.decode_sparse(msg.data, d, torch.float64)
    assert torch.equal(out != 0, beta != 0)
    assert torch.allclose(out, beta, rtol=2.0**-23, atol=0)  # only the float32 δ on the wire
    assert msg.nnz == int((beta != 0).sum())
