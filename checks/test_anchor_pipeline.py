"""Anchors for the uncompressed pipeline and for DistZO2, outside the project's training code.

* ``pipeline-sgd`` (threads, 2 and 3 stages, float64): the parameters after one
  SGD step equal ``x - lr ∇f(x)`` with ``∇f`` from torch autograd on the unsplit
  model and a cross-entropy written here, over the whole batch in one pass (the
  pipeline splits it into micro-batches and stages; the mean over equal
  micro-batches is the mean over the batch, so only rounding differs).
* DistZO2 (``distzo2-pertp``, ``distzo2-ddp``, threads, float64): one step moves
  the parameters to ``x - (lr/P) Σ_i g_i z_i`` (DistZO2 paper §4, the ZO-SGD
  step; SparQ Eq. 3), where the check computes ``g_i`` itself from losses of
  the unsplit model at ``x ± μ z_i`` (central) or ``x + μ z_i`` and ``x``
  (forward) on the whole batch.  The project's ``g`` travels as float32, so the
  check allows its rounding, ``2^-23 |g|``, times ``lr |z|``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from algorithms.zo.perturb import step_seeds, z_for
from harness.data import get_dataset
from harness.models import build_model
from harness.registry import make_config

from ._capture import run_capturing

F64 = torch.float64


def _ce(logits, labels):
    """Mean token cross-entropy, written here (not the project's lm_loss)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _whole_batch(cfg, step: int = 0):
    return get_dataset(cfg.data).batch(step, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed)


@pytest.mark.parametrize("model, world, cut", [("tiny-opt", 2, "block"), ("tiny-opt", 3, "block"),
                                               ("tiny-gpt2", 3, "ffn_act"), ("tiny-llama", 2, "block")])
def test_pipeline_sgd_step_is_x_minus_lr_autograd_gradient(model, world, cut):
    lr = 0.05
    cfg = make_config("pipeline-sgd", world_size=world, model=model, steps=1, seed=11, batch_size=4,
                      seq_len=16, micro_batches=2, dtype="float64", params={"lr": lr, "cut": cut})
    _, final = run_capturing(cfg)

    net = build_model(model, seed=cfg.seed, dtype=F64)
    net.train()  # what the pipeline's stages run in (the presets have no dropout)
    ids, labels = _whole_batch(cfg)
    params = list(net.parameters())
    grads = torch.autograd.grad(_ce(net(ids).logits, labels), params)
    assert set(final) == set(range(len(params)))
    moved = 0
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        expected = p.detach() - lr * g
        assert final[i].dtype == F64
        torch.testing.assert_close(final[i], expected, rtol=0, atol=1e-13, msg=f"param {i}")
        moved += int(g.abs().max() * lr > 1e-10)
    assert moved > len(params) // 2  # most parameters really moved (the step is not vacuous)


@pytest.mark.parametrize("algo, world, difference, P", [("distzo2-pertp", 2, "central", 1),
                                                        ("distzo2-pertp", 2, "central", 2),
                                                        ("distzo2-ddp", 2, "forward", 1),
                                                        ("distzo2-ddp", 2, "central", 2)])
def test_distzo2_step_is_x_minus_lr_g_z_with_g_from_the_unsplit_model(algo, world, difference, P):
    lr, mu = 1e-2, 1e-3
    cfg = make_config(algo, world_size=world, model="tiny-opt", steps=1, seed=5, batch_size=4, seq_len=16,
                      dtype="float64", params=dict(lr=lr, mu=mu, perturbations=P, difference=difference))
    outs, final = run_capturing(cfg, replicated=True)

    net = build_model(cfg.model, seed=cfg.seed, dtype=F64).eval()
    ids, labels = _whole_batch(cfg)
    names = [n for n, _ in net.named_parameters()]
    x0 = [p.detach().clone() for p in net.parameters()]

    def f(shift):
        with torch.no_grad():
            return float(_ce(functional_call(net, dict(zip(names, shift, strict=True)), (ids,)).logits, labels))

    expected = [x.clone() for x in x0]
    slack = [torch.zeros_like(x) for x in x0]
    for i, s in enumerate(step_seeds(cfg.seed, 0, P)):
        zs = [z_for(s, j, x.shape, F64) for j, x in enumerate(x0)]
        plus = f([x + mu * z for x, z in zip(x0, zs, strict=True)])
        if difference == "central":
            g = (plus - f([x - mu * z for x, z in zip(x0, zs, strict=True)])) / (2 * mu)
        else:
            g = (plus - f(x0)) / mu
        g_tol = 2.0**-22 * abs(g) + 1e-11  # float32 transport (rounded twice) + loss rounding / mu
        for r, o in enumerate(outs):
            assert abs(o.history[f"g{i}"][0] - g) <= g_tol, (r, i, o.history[f"g{i}"][0], g)
        for e, sl, z in zip(expected, slack, zs, strict=True):
            e.sub_(z, alpha=lr / P * g)
            sl.add_(z.abs(), alpha=lr / P * g_tol)
    assert set(final) == set(range(len(x0)))
    for j, (e, sl) in enumerate(zip(expected, slack, strict=True)):
        assert final[j].dtype == F64
        err = (final[j] - e).abs()
        assert bool((err <= sl + 1e-15).all()), (j, float(err.max()))
    assert all(not torch.equal(final[j], x0[j]) for j in final)
