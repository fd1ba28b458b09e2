"""``mezo``: centralised ZO-SGD (MeZO) on the unsplit model, and its replay.

One process holds the whole model; per iteration it evaluates the loss at
the points of :func:`~.estimator.walk`, turns them into P scalars, logs them
(``g0..g{P-1}``) and applies the update.  Because z is a pure function of
(seed, parameter index) and the seeds follow a shared schedule, the log of
(seed, scalar) pairs is the whole training run: :func:`replay` rebuilds the
final parameters from the initial ones (in ``exact`` mode, bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.config import RunConfig
from harness.data import get_dataset
from harness.heldout import evaluate_model, init_head
from harness.models import build_model, lm_loss

from .estimator import drift_extras, logged_loss, scalars, walk
from .perturb import Perturber, step_seeds, zo_update


def batch(cfg: RunConfig, step: int, device: torch.device):
    ids, labels = get_dataset(cfg.data).batch(step, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed,
                                              model=cfg.model)
    return ids.to(device), labels.to(device)


def log_scalars(ctx, g: Sequence[float]) -> None:
    ctx.log(**{f"g{i}": v for i, v in enumerate(g)})


def mezo(ctx):
    cfg, p = ctx.cfg, ctx.params
    model = build_model(cfg.model, seed=cfg.seed, dtype=ctx.dtype, device=ctx.device).eval()
    pert = Perturber(list(enumerate(model.parameters())), p.mode, p.track_drift)
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    init_head(ctx, model.named_parameters())
    evaluate_model(ctx, model, "start")
    with torch.no_grad():
        for step in ctx.steps():
            ids, labels = batch(cfg, step, ctx.device)
            seeds = step_seeds(cfg.seed, step, p.perturbations)
            losses = [lm_loss(model(ids).logits, labels) for _ in walk(pert, seeds, p.mu, p.difference)]
            g = scalars(losses, p.difference, p.mu)
            zo_update(pert, seeds, g, p.lr)
            ctx.log(loss=logged_loss(losses, p.difference))
            log_scalars(ctx, g)
    evaluate_model(ctx, model, "end")
    ctx.extra.update(drift_extras(pert))
    return ctx.finish(enumerate(model.parameters()))


# --------------------------------------------------------------------------- replay
def scalar_log(cfg: RunConfig, history: dict[str, list[float]]) -> list[list[tuple[int, float]]]:
    """Per step, the (seed, scalar) pairs of a run, from its logged ``g{i}`` history."""
    P = cfg.params.perturbations
    cols = [history[f"g{i}"] for i in range(P)]
    return [list(zip(step_seeds(cfg.seed, t, P), (c[t] for c in cols), strict=True))
            for t in range(len(cols[0]))]


@torch.no_grad()
def replay(params: Sequence[tuple[int, torch.Tensor]], log: Sequence[Sequence[tuple[int, float]]],
           lr: float) -> None:
    """Apply a run's updates to ``params`` (its initial values) in place, from the log alone."""
    pert = Perturber(params, "exact")
    for pairs in log:
        seeds = [s for s, _ in pairs]
        zo_update(pert, seeds, [g for _, g in pairs], lr)
