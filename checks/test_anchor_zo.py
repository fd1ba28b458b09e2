"""Anchors for the ZO estimator (MeZO, SparQ, ZO2 and DistZO2 share it) in calculus.

The equivalence checks compare ZO paths with each other; here every projected
gradient the project computes is held against the directional derivative
``zᵀ∇f(x)`` from torch autograd, with the project's own ``z``
(``algorithms.zo.perturb.z_for``) and a loss the check writes itself.

The bound.  With ``φ(t) = f(x + t z)``, Taylor's theorem gives (SparQ Eq. 3 and Eq. 7)

* forward:  ``g = (φ(μ) - φ(0)) / μ = φ'(0) + (μ/2) φ''(0) + (μ²/6) φ'''(ξ)``,
* central:  ``g = (φ(μ) - φ(-μ)) / (2μ) = φ'(0) + (μ²/6) φ'''(ξ)``, ``|ξ| ≤ μ``.

``φ'(0) = zᵀ∇f`` and ``φ''(t) = zᵀ∇²f(x + t z) z`` come from autograd (double
backward); ``L3 = max |φ'''|`` on ``[-μ, μ]`` is estimated from ``φ''`` at
``-μ, 0, μ`` and taken 10 times over.  The check allows
``10 (μ²/6) L3`` plus the scalar's float32 rounding (``2^-23 |g|``, it travels
as one float32) plus the float64 rounding of the two losses over ``μ``.  The
forward check keeps the ``(μ/2) φ''(0)`` term, so it is a second-order check:
a forward estimator computed as a central one (or any O(μ) error) fails it.
tiny-gpt2 is used because it is smooth in float64 (OPT's ReLU has kinks, and
Llama's RMSNorm computes in float32 even in a float64 model).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.zo.estimator import evaluations, logged_loss, scalars, walk
from algorithms.zo.perturb import Perturber, step_seeds, z_for, zo_update
from harness.data import get_dataset
from harness.models import build_model
from harness.registry import make_config

from ._capture import run_capturing

F64 = torch.float64
MU, LR, P = 1e-4, 1e-2, 3
F64_LOSS_ROUNDING = 4 * 2.0**-52  # relative, of a loss value of order one


def _ce(logits, labels):
    """Mean token cross-entropy, written here (not the project's lm_loss)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _dot(xs, ys):
    return sum((a * b).sum() for a, b in zip(xs, ys, strict=True))


def _phi_derivatives(model, ids, labels, zs, t: float):
    """``(φ'(t), φ''(t))`` along ``zs`` at ``x + t z`` by autograd (x restored after)."""
    params = list(model.parameters())
    with torch.no_grad():
        for p, z in zip(params, zs, strict=True):
            p.add_(z, alpha=t)
    try:
        loss = _ce(model(ids).logits, labels)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        d1 = _dot(grads, zs)
        hz = torch.autograd.grad(d1, params)
        return float(d1.detach()), float(_dot(hz, zs))
    finally:
        with torch.no_grad():
            for p, z in zip(params, zs, strict=True):
                p.sub_(z, alpha=t)


def _loss_at(model, ids, labels, zs, t: float) -> float:
    """``f(x + t z)`` on a perturbed copy of the parameters (not the project's Perturber)."""
    from torch.func import functional_call

    shifted = {n: p.detach() + t * z for (n, p), z in zip(model.named_parameters(), zs, strict=True)}
    with torch.no_grad():
        return float(_ce(functional_call(model, shifted, (ids,)).logits, labels))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
@pytest.mark.parametrize("difference", ["forward", "central"])
def test_mezo_scalars_are_directional_derivatives_and_the_update_averages_them(seed, difference):
    cfg = make_config("mezo", model="tiny-gpt2", steps=1, batch_size=2, seq_len=8, seed=seed, dtype="float64",
                      params=dict(lr=LR, mu=MU, perturbations=P, difference=difference))
    outs, final = run_capturing(cfg)
    g_run = [outs[0].history[f"g{i}"][0] for i in range(P)]

    model = build_model(cfg.model, seed=seed, dtype=F64)  # eval: no dropout in the loss either
    model.eval()
    ids, labels = get_dataset(cfg.data).batch(0, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=seed)
    x0 = [p.detach().clone() for p in model.parameters()]
    expected = [x.clone() for x in x0]
    f0 = _loss_at(model, ids, labels, [torch.zeros_like(x) for x in x0], 0.0)
    for i, s in enumerate(step_seeds(seed, 0, P)):
        zs = [z_for(s, j, x.shape, F64) for j, x in enumerate(x0)]
        d, c0 = _phi_derivatives(model, ids, labels, zs, 0.0)
        _, cp = _phi_derivatives(model, ids, labels, zs, MU)
        _, cm = _phi_derivatives(model, ids, labels, zs, -MU)
        L3 = max(abs(cp - c0), abs(c0 - cm), abs(cp - cm) / 2) / MU
        g = g_run[i]
        bound = 10 * MU**2 / 6 * L3 + 2.0**-23 * abs(g) + 2 * F64_LOSS_ROUNDING * max(1.0, f0) / MU
        if difference == "forward":
            err = g - d - MU / 2 * c0
        else:
            err = g - d
        assert abs(err) <= bound, (i, g, d, c0, err, bound)
        if abs(d) > 2 * bound + MU / 2 * abs(c0):
            assert (g > 0) == (d > 0), (i, g, d)  # the sign, spelt out
        # the single-perturbation scalar, by the check's own difference quotient
        if difference == "forward":
            g_single = (_loss_at(model, ids, labels, zs, MU) - f0) / MU
        else:
            g_single = (_loss_at(model, ids, labels, zs, MU) - _loss_at(model, ids, labels, zs, -MU)) / (2 * MU)
        assert abs(g - g_single) <= 2.0**-23 * abs(g) + 2 * F64_LOSS_ROUNDING * max(1.0, f0) / MU, (i, g, g_single)
        # the P-direction update is the mean of the single-direction updates x - lr g_i z_i
        for e, z in zip(expected, zs, strict=True):
            e.sub_(z, alpha=LR / P * g)
    assert set(final) == set(range(len(x0)))
    for j, e in enumerate(expected):
        assert final[j].dtype == F64
        torch.testing.assert_close(final[j], e, rtol=0, atol=1e-13, msg=f"param {j}")
    assert any(not torch.equal(final[j], x0[j]) for j in final)  # the step happened


# --------------------------------------------------------------------------- a convex problem
N_STEPS = 400


def _logreg(seed: int, m: int = 64, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, n, generator=g, dtype=F64)
    y = torch.where(torch.rand(m, generator=g, dtype=F64) < 0.5, -1.0, 1.0).to(F64)
    w = torch.nn.Parameter(torch.randn(n, generator=g, dtype=F64))
    b = torch.nn.Parameter(torch.randn(1, generator=g, dtype=F64))

    def loss():
        return F.softplus(-y * (A @ w + b)).mean()

    return [w, b], loss


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), difference=st.sampled_from(["forward", "central"]),
       P_dirs=st.integers(1, 4))
def test_one_zo_sgd_step_lowers_a_convex_loss_in_expectation(seed, difference, P_dirs):
    """Logistic regression (convex), one ZO-SGD step from the same ``x`` along each of
    ``N_STEPS`` step seeds.

    To first order the step changes f by ``-(lr/P) Σ_i g_i zᵢᵀ∇f`` and ``g_i ≈ zᵢᵀ∇f``,
    so ``E[Δf] ≈ -lr ‖∇f‖²``: ``(zᵀ∇f)²/‖∇f‖²`` is χ²₁ for Gaussian z.  The
    second-order term is at most ``lr² ‖ĝ‖² λmax / 2`` with ``λmax ≤ λmax(AᵀA)/(4m)``,
    about 1 % of the first at this lr.  The mean of N = 400 such decreases falls
    below half its expectation with probability ``< exp(-N (0.5 - 1 - ln 0.5) / 2) ≈
    exp(-19)`` (χ² Chernoff bound with P = 1, smaller for P > 1), so the threshold
    ``mean Δf ≤ -0.5 lr ‖∇f‖²`` fails a correct estimator essentially never; an
    update with the wrong sign raises f by about as much.
    """
    params, loss = _logreg(seed)
    lr, mu = 1e-3, 1e-5
    grad = torch.autograd.grad(loss(), params)
    gnorm2 = float(_dot(grad, grad))
    x0 = [p.detach().clone() for p in params]
    with torch.no_grad():
        f0 = float(loss())
        pert = Perturber(list(enumerate(params)), "exact")
        deltas, mean_updates_ok = [], True
        for t in range(N_STEPS):
            seeds = step_seeds(seed, t, P_dirs)
            losses = [loss() for _ in walk(pert, seeds, mu, difference)]
            g = scalars(losses, difference, mu)
            zo_update(pert, seeds, g, lr)
            deltas.append(float(loss()) - f0)
            # P-averaging: the step is the mean of the P single-direction steps x - lr g_i z_i
            single = [[x - lr * gi * z_for(s, j, x.shape, F64) for j, x in enumerate(x0)]
                      for s, gi in zip(seeds, g, strict=True)]
            for j, p in enumerate(params):
                mean = sum(u[j] for u in single) / P_dirs
                mean_updates_ok &= bool(torch.allclose(p, mean, rtol=0, atol=1e-14))
                p.copy_(x0[j])
    assert mean_updates_ok
    mean_delta = sum(deltas) / N_STEPS
    assert mean_delta <= -0.5 * lr * gnorm2, (mean_delta, -lr * gnorm2)


def _point_and_seeds(seed, n, P_dirs):
    """A float64 point x, a copy of it, and the step's P direction seeds."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x, x.clone(), step_seeds(seed, 0, P_dirs)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), P_dirs=st.integers(1, 3), n=st.integers(1, 7))
@pytest.mark.parametrize("difference", ["forward", "central"])
def test_logged_loss_is_f_x_or_the_mean_of_the_perturbed_losses(seed, P_dirs, n, difference):
    # The loss a ZO run reports (SparQ Eq. 3 / Eq. 7 evaluate it anyway): f(x_t)
    # for forward differences, the mean of f(x ± mu z_i) for central ones, each
    # written here from the check's own f(x) = sum(x^2) and the z of z_for.
    mu = 1e-2
    x, x0, seeds = _point_and_seeds(seed, n, P_dirs)
    losses = []
    for _ in walk(Perturber([(0, x)]), seeds, mu, difference):
        losses.append((x * x).sum().clone())

    def f(v):
        return float((v * v).sum())

    if difference == "forward":
        expected = f(x0)
    else:
        zs = [z_for(s, 0, (n,), F64) for s in seeds]
        pts = [f(x0 + sign * mu * z) for z in zs for sign in (1, -1)]
        expected = sum(pts) / len(pts)
    assert logged_loss(losses, difference) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), P_dirs=st.integers(1, 4), n=st.integers(1, 6))
@pytest.mark.parametrize("difference", ["forward", "central"])
def test_walk_visits_the_points_evaluations_names_in_its_order(seed, P_dirs, n, difference):
    # ZO2 and DistZO2 index the evaluations of a step by evaluations() and run
    # them with walk(): both must name the same (direction, sign) sequence, and
    # at each yield the parameters sit at x + sign mu z_i (SparQ Eq. 3 / Eq. 7),
    # z_i from z_for; x comes back bit-exactly after the walk (exact mode).
    mu = 1e-2
    x, x0, seeds = _point_and_seeds(seed, n, P_dirs)
    visited = []
    for i, sign in walk(Perturber([(0, x)]), seeds, mu, difference):
        at = x0 if i is None else x0 + sign * mu * z_for(seeds[i], 0, (n,), F64)
        torch.testing.assert_close(x, at, rtol=0, atol=1e-12, msg=f"evaluation {(i, sign)}")
        visited.append((i, sign))
    assert visited == evaluations(difference, P_dirs)
    assert torch.equal(x, x0)
