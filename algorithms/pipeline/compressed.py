"""Compressed pipeline parallelism: ``direct-compress``, ``aq-sgd``, ``clapping-fc``, ``clapping-fu``.

One rank program (:func:`_train`) for all four; they differ only in what the
links keep (spec §1.3, §2.9):

=================  =======================================  =====================================
algorithm          activations, stage e -> e+1              activation gradients, e+1 -> e
=================  =======================================  =====================================
direct-compress    C(y)                                      C(v)
aq-sgd             C(y - ỹ_x), one ỹ_x per training sample   C(v)
clapping-fc        C(y - ỹ), one ỹ per link end              C(v - ṽ), one ṽ per link end
clapping-fu        as FC; fresh rows raw and ỹ <- y          as FC; fresh rows raw and ṽ <- v
=================  =======================================  =====================================

Clapping samples lazily (:mod:`.lazy`): with probability ``1 - p`` a step
reuses the previous batch (``rule="batch"``) or row (``rule="sample"``).
EF21 in the paper's comparisons is ``clapping-fc`` with ``p = 1``.  Codecs
are applied per message (one micro-batch's boundary tensor), not per row.
"""

from __future__ import annotations

import os

import torch

from harness.config import RunConfig
from harness.data import get_dataset
from harness.heldout import evaluate_stages, init_head
from harness.models import PRESETS, build_stage
from harness.seeding import keyed_generator

from .engine import StageLinks, evaluate, run_step
from .lazy import LazyData, fresh_schedule
from .links import (
    Channel,
    EFChannel,
    SampleMemory,
    SlotMemory,
    StepRows,
    make_link_codec,
    state_digest,
    state_nbytes,
)
from .optim import lr_factor, make_optimizer, set_lr
from .params import AQParams, ClappingParams, CompressedParams  # noqa: F401  (re-exported)
from .sgd import _fits_model, _wire_codec


# --------------------------------------------------------------------------- shapes and checks
def boundary_widths(cfg: RunConfig) -> list[int]:
    """Last dimension of each tensor that crosses a link (block cut: hidden; ffn_act: FFN act + residual)."""
    pr = PRESETS[cfg.model]
    return [pr.d_model] if cfg.params.cut == "block" else [pr.ffn_dim, pr.d_model]


def _partial_messages(cfg: RunConfig) -> bool:
    p = cfg.params
    return (cfg.algorithm == "clapping-fu" and p.rule == "sample") or getattr(p, "raw_first_visit", False)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _aq_memory(cfg: RunConfig) -> str | None:
    """AQ-SGD keeps one boundary activation per training sample on both ends of every link:
    refused before any rank starts when that alone exceeds this machine's memory."""
    elements = ef_state_elements("aq-sgd", links=cfg.world_size - 1, batch=cfg.batch_size,
                                 seq_len=cfg.seq_len, width=sum(boundary_widths(cfg)),
                                 dataset_size=cfg.params.dataset_size)
    need = elements * (8 if cfg.dtype == "float64" else 4)
    have = _physical_memory()
    if have is not None and need > have:
        return (f"aq-sgd: dataset_size {cfg.params.dataset_size} needs {need / 2**30:.1f} GiB of "
                f"per-sample activation memory (2 x {cfg.world_size - 1} link(s) x dataset_size x "
                f"seq_len {cfg.seq_len} x width), more than this machine's {have / 2**30:.1f} GiB")
    return None


def check(cfg: RunConfig) -> str | None:
    msg = _fits_model(cfg)
    if msg or cfg.model not in PRESETS:
        return msg
    p = cfg.params
    if p.dataset_size and p.dataset_size % cfg.batch_size:
        return f"dataset_size {p.dataset_size} is not a multiple of batch_size {cfg.batch_size}"
    if cfg.algorithm == "aq-sgd":
        msg = _aq_memory(cfg)
        if msg:
            return msg
    mb = cfg.batch_size // cfg.micro_batches
    rows = 1 if _partial_messages(cfg) else mb
    d = rows * cfg.seq_len * min(boundary_widths(cfg))
    for name in ("fwd", "bwd"):
        codec = make_link_codec(getattr(p, name))
        k = getattr(codec, "k", None)
        if k is not None and k > d:
            return (f"{name}={getattr(p, name)}: K={k} > d={d}, the elements in the smallest message "
                    f"({rows} row(s) x seq_len {cfg.seq_len} x width {min(boundary_widths(cfg))})")
    return None


# --------------------------------------------------------------------------- the rank program
def build_links(algorithm: str, rank: int, world: int, p, dtype: torch.dtype, seed: int) -> StageLinks:
    fwd, bwd, wire = make_link_codec(p.fwd), make_link_codec(p.bwd), _wire_codec(dtype)

    def end(direction: str, link: int, sender: bool):
        codec = fwd if direction == "act" else bwd
        g = keyed_generator(seed, "codec", direction, link) if sender else None  # only the sender draws
        if algorithm == "direct-compress" or (algorithm == "aq-sgd" and direction == "grad"):
            return Channel(codec, g)
        if algorithm == "aq-sgd":
            memory = SampleMemory(p.dataset_size, p.raw_first_visit)
        else:
            memory = SlotMemory(reset_fresh=algorithm == "clapping-fu")
        return EFChannel(codec, wire, memory, dtype, g)

    first, last = rank == 0, rank == world - 1
    return StageLinks(fwd_in=None if first else end("act", rank - 1, False),
                      bwd_out=None if first else end("grad", rank - 1, True),
                      fwd_out=None if last else end("act", rank, True),
                      bwd_in=None if last else end("grad", rank, False))


def _digests(links: StageLinks, rank: int) -> dict[str, float]:
    named = {f"ef_act_link{rank - 1}": links.fwd_in, f"ef_grad_link{rank - 1}": links.bwd_out,
             f"ef_act_link{rank}": links.fwd_out, f"ef_grad_link{rank}": links.bwd_in}
    return {k: state_digest(c) for k, c in named.items() if c is not None and c.memory is not None}


def _train(ctx):
    cfg, p = ctx.cfg, ctx.params
    stage = build_stage(cfg.model, seed=cfg.seed, num_stages=ctx.world_size, stage_index=ctx.rank,
                        cut=p.cut, dtype=ctx.dtype, weights=p.weights or None, device=ctx.device)
    links = build_links(cfg.algorithm, ctx.rank, ctx.world_size, p, ctx.dtype, cfg.seed)
    opt = make_optimizer(stage.parameters(), p)
    lazy = LazyData(cfg.data, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed,
                    p=getattr(p, "p", 1.0), rule=getattr(p, "rule", "batch"), dataset_size=p.dataset_size,
                    model=cfg.model)
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    init_head(ctx, [(n, t) for _, n, t in stage.global_named_parameters()])
    evaluate_stages(ctx, stage, "start")
    fresh_rows = 0
    for step in ctx.steps():
        fresh = lazy.next(step)
        fresh_rows += int(fresh.sum())
        rows = StepRows(fresh, lazy.sample_ids, cfg.micro_batches)
        for ch in links.all():
            ch.begin_step(rows)
        opt.zero_grad(set_to_none=True)
        loss = run_step(ctx.comm, stage, lazy.ids.to(ctx.device), lazy.labels.to(ctx.device),
                        cfg.micro_batches, links, schedule=p.schedule)
        if p.clip_grad:
            torch.nn.utils.clip_grad_norm_(stage.parameters(), p.clip_grad, foreach=False)
        if p.lr_schedule != "constant":
            set_lr(opt, p.lr * lr_factor(p.lr_schedule, step, cfg.steps, p.warmup))
        opt.step()
        if loss is not None:
            ctx.log(loss=loss)
        if p.log_state_digests:
            ctx.log(**_digests(links, ctx.rank))
        if p.eval_every and (step + 1) % p.eval_every == 0 and step + 1 < cfg.steps:
            with ctx.unmetered():  # the final validation below closes the curve
                _evaluate(ctx, stage, p.eval_batches, at_step=step + 1)
    # after the measured window: nothing below is counted as training traffic
    mine = sum(state_nbytes(c) for c in links.all())
    total = ctx.comm.all_reduce(torch.tensor([float(mine)], dtype=torch.float64), op="sum", tag="ef-memory")
    ctx.extra["ef_state_bytes_rank_max"] = (float(mine), "bytes")
    ctx.extra["ef_state_bytes_total"] = (float(total[0]), "bytes")
    ctx.extra["fresh_fraction"] = (fresh_rows / (cfg.steps * cfg.batch_size), "ratio")
    _evaluate(ctx, stage, p.eval_batches, at_step=cfg.steps if p.eval_every else None)
    evaluate_stages(ctx, stage, "end")
    return ctx.finish((i, t) for i, _, t in stage.global_named_parameters())


def _evaluate(ctx, stage, batches: int, at_step: int | None = None) -> None:
    """Uncompressed validation on the same ``batches`` val batches every time; the last stage
    records val_loss / val_accuracy, and with ``at_step`` appends them to the history (the curve)."""
    if not batches:
        return
    cfg, data = ctx.cfg, get_dataset(ctx.cfg.data)
    results = []
    for i in range(batches):
        ids, labels = data.batch(i, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed, split="val",
                                 model=cfg.model)
        results.append(evaluate(ctx.comm, stage, ids.to(ctx.device), labels.to(ctx.device), _wire_codec(ctx.dtype)))
    if results[0] is not None:
        loss, acc = sum(r[0] for r in results) / batches, sum(r[1] for r in results) / batches
        ctx.extra["val_loss"] = (loss, "nats/token")
        ctx.extra["val_accuracy"] = (acc, "fraction")
        if at_step is not None:
            ctx.log(val_loss=loss, val_accuracy=acc, val_step=at_step)


def direct_compress(ctx):
    return _train(ctx)


def aq_sgd(ctx):
    return _train(ctx)


def clapping_fc(ctx):
    return _train(ctx)


def clapping_fu(ctx):
    return _train(ctx)


# --------------------------------------------------------------------------- closed forms
def expected_bytes_per_step(cfg: RunConfig) -> float:
    """Closed-form payload bytes per step (codecs whose size depends only on shape and dtype).

    Per link and micro-batch, each boundary tensor ``[b, T, w]`` crosses once
    each way.  Direct, AQ-SGD (zero-start buffers) and FC send the codec's size;
    FU sends fresh rows in the lossless wire codec and kept rows compressed, as
    separate messages.
    """
    p, dt = cfg.params, cfg.torch_dtype
    fwd, bwd, wire = make_link_codec(p.fwd), make_link_codec(p.bwd), _wire_codec(dt)
    mb = cfg.batch_size // cfg.micro_batches
    if getattr(p, "raw_first_visit", False):
        raise ValueError("no closed form implemented for aq-sgd with raw_first_visit")

    def size(codec, rows, w):
        return codec.encoded_nbytes(torch.zeros(rows, cfg.seq_len, w, dtype=dt)) if rows else 0

    total = 0
    if cfg.algorithm == "clapping-fu":
        masks = fresh_schedule(cfg.data, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed,
                               p=p.p, rule=p.rule, dataset_size=p.dataset_size, steps=cfg.steps)
        for fresh in masks:
            for m in range(cfg.micro_batches):
                raw = int(fresh[m * mb:(m + 1) * mb].sum())
                for w in boundary_widths(cfg):
                    total += size(wire, raw, w) * 2 + size(fwd, mb - raw, w) + size(bwd, mb - raw, w)
        total /= cfg.steps
    else:
        total = cfg.micro_batches * sum(size(fwd, mb, w) + size(bwd, mb, w) for w in boundary_widths(cfg))
    return (cfg.world_size - 1) * total


def ef_state_elements(algorithm: str, *, links: int, batch: int, seq_len: int, width: int,
                      dataset_size: int) -> int:
    """Error-feedback elements held by all ranks (both replicas of every state).

    Clapping: ỹ and ṽ, ``B x s x h`` each, on both ends of each link: ``4 (E-1) B s h``
    (paper App. H).  AQ-SGD: one ỹ per training sample on both ends:
    ``2 (E-1) N s h``.  Direct compression keeps nothing.
    """
    if algorithm in ("clapping-fc", "clapping-fu"):
        return 4 * links * batch * seq_len * width
    if algorithm == "aq-sgd":
        return 2 * links * dataset_size * seq_len * width
    return 0
