"""The first-order references: ``fo-sgd`` (one process, the unsplit model) and
``pipeline-sgd`` (the same training split into one stage per rank, uncompressed).

Both consume the same batches, split into the same micro-batches, accumulate
gradients in the same order and apply the same SGD update, so for the same
seed they reach the same ``params_sha256`` on every backend.
"""

from __future__ import annotations

import torch

from algorithms.codecs import make_codec
from harness.config import RunConfig
from harness.heldout import evaluate_stages, init_head
from harness.models import PRESETS, build_model, build_stage, max_stages, save_weights

from .engine import LinkCodecs, pipeline_step
from .local import batch, micro_batch_problem, train_local
from .params import CUTS, SGDParams  # noqa: F401  (re-exported)


def _optimizer(params, p: SGDParams) -> torch.optim.Optimizer:
    # foreach=False: the plain per-tensor update, identical for any grouping of
    # parameters into stages.
    if p.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=p.lr, weight_decay=0.0, foreach=False)
    return torch.optim.SGD(params, lr=p.lr, momentum=p.momentum, foreach=False)


def _wire_codec(dtype: torch.dtype):
    return make_codec("fp64" if dtype == torch.float64 else "fp32")  # lossless for the run dtype


def pipeline_bytes_per_step(cfg: RunConfig) -> int:
    """Closed form of pipeline-sgd's payload bytes per step.

    Each of the M-1 links carries, per micro-batch, the boundary tensors
    forward and their gradients backward: the hidden state [b, T, d] for a
    block cut, or the FFN activation [b, T, ffn] plus the residual [b, T, d]
    for an ffn_act cut (b = batch / micro-batches), each as one dense payload.
    """
    p = PRESETS[cfg.model]
    mb = cfg.batch_size // cfg.micro_batches
    widths = [p.d_model] if cfg.params.cut == "block" else [p.ffn_dim, p.d_model]
    codec = _wire_codec(cfg.torch_dtype)
    per_micro = sum(codec.encoded_nbytes(torch.empty(mb, cfg.seq_len, w, dtype=cfg.torch_dtype))
                    for w in widths)
    return 2 * (cfg.world_size - 1) * cfg.micro_batches * per_micro


def _fits_model(cfg: RunConfig) -> str | None:
    """The micro-batch split, then the stages against the model's blocks."""
    msg = micro_batch_problem(cfg)
    if msg or cfg.model not in PRESETS:
        return msg  # an unknown model: the run reports it with the list of presets
    blocks = PRESETS[cfg.model].num_blocks
    if cfg.world_size > max_stages(blocks, cfg.params.cut):
        return (f"{cfg.world_size} stages do not fit {cfg.model}, which has {blocks} blocks "
                f"(at most {max_stages(blocks, cfg.params.cut)} stages with cut={cfg.params.cut})")
    return None


def fo_sgd(ctx):
    cfg, p = ctx.cfg, ctx.params
    model = build_model(cfg.model, seed=cfg.seed, dtype=ctx.dtype, weights=p.weights or None,
                        device=ctx.device)
    train_local(ctx, model, _optimizer(model.parameters(), p))
    if p.save_weights:  # after the measured window
        save_weights(model, p.save_weights)
    return ctx.finish(enumerate(model.parameters()))


def pipeline_fits(cfg: RunConfig) -> str | None:
    if cfg.params.save_weights:
        return "save_weights is written by fo-sgd (the unsplit model); pipeline-sgd cannot save"
    return _fits_model(cfg)


def pipeline_sgd(ctx):
    cfg, p = ctx.cfg, ctx.params
    stage = build_stage(cfg.model, seed=cfg.seed, num_stages=ctx.world_size, stage_index=ctx.rank,
                        cut=p.cut, dtype=ctx.dtype, weights=p.weights or None, device=ctx.device)
    wire = _wire_codec(ctx.dtype)
    codecs = LinkCodecs(forward=wire, backward=wire)
    opt = _optimizer(stage.parameters(), p)
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    init_head(ctx, [(n, t) for _, n, t in stage.global_named_parameters()])
    evaluate_stages(ctx, stage, "start")
    for step in ctx.steps():
        input_ids, labels = batch(cfg, step, ctx.device)
        opt.zero_grad(set_to_none=True)
        loss = pipeline_step(ctx.comm, stage, input_ids, labels, cfg.micro_batches, codecs, p.schedule)
        opt.step()
        if loss is not None:
            ctx.log(loss=loss)
    evaluate_stages(ctx, stage, "end")
    return ctx.finish((i, t) for i, _, t in stage.global_named_parameters())
