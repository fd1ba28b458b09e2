"""The single-process first-order training loop: ``fo-sgd`` and ``protocol-central``.

The unsplit model reads the same batch as every pipeline rank, splits it into
the same micro-batches and accumulates their gradients in the same order as
:func:`.engine.run_step`, so a pipeline and its one-process reference reach the
same parameters.  Algorithm-specific work (projections, Grassmann updates) hooks
in around the backward and the update.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.config import RunConfig
from harness.data import get_dataset
from harness.heldout import evaluate_model, init_head
from harness.models import lm_loss


def micro_batch_problem(cfg: RunConfig) -> str | None:
    """The rule of every algorithm that splits a step's batch into ``micro_batches``
    equal micro-batches (this loop and :func:`.engine.run_step`): the split must be
    exact, or the last micro-batch would be smaller and the pipeline and its
    one-process reference would weight samples differently.  Algorithms that do not
    split (ZO, data-parallel) accept any batch size."""
    if cfg.batch_size % cfg.micro_batches:
        return (f"batch_size {cfg.batch_size} is not divisible by micro_batches {cfg.micro_batches} "
                "(each step splits its batch into micro_batches equal micro-batches)")
    return None


def batch(cfg: RunConfig, step: int, device):
    """Step ``step``'s batch, the one every rank of a run reads."""
    ids, labels = get_dataset(cfg.data).batch(step, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                                              seed=cfg.seed, model=cfg.model)
    return ids.to(device), labels.to(device)


def train_local(ctx, model: torch.nn.Module, opt: torch.optim.Optimizer, *,
                lr_at: Callable[[int], float] | None = None,
                after_backward: Callable[[], None] | None = None,
                before_update: Callable[[], None] | None = None,
                after_update: Callable[[int], None] | None = None) -> None:
    """Train ``model`` for the run's steps, logging each step's loss.

    ``lr_at(step)``: the step's learning rate (a schedule; None keeps the optimiser's);
    ``after_backward`` runs after each micro-batch's backward, ``before_update``
    / ``after_update(step)`` around the optimiser step.
    """
    cfg, M = ctx.cfg, ctx.cfg.micro_batches
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    init_head(ctx, model.named_parameters())
    evaluate_model(ctx, model, "start")
    for step in ctx.steps():
        input_ids, labels = batch(cfg, step, ctx.device)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids, labs in zip(input_ids.chunk(M), labels.chunk(M), strict=True):
            loss = lm_loss(model(ids).logits, labs) / M
            loss.backward()
            if after_backward is not None:
                after_backward()
            total += loss.item()
        if before_update is not None:
            before_update()
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
        opt.step()
        if after_update is not None:
            after_update(step)
        ctx.log(loss=total)
    evaluate_model(ctx, model, "end")
