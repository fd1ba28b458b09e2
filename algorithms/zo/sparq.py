"""``sparq``: ZO model parallelism with quantised, sparse split activations (SparQ Alg. 1-3).

Stage m holds ``x^(m)`` (build_stage with ``cut="ffn_act"``: every split sits
right after a block's FFN activation).  Per iteration, every stage walks the
same evaluation schedule as MeZO (:func:`~.estimator.walk`), shifting only its
own parameters:

    stage 1:   a = S_1(xi; x^(1) + sign mu u^(1))            -> send C(a), r
    stage m:   a = S_m(C(a_prev); x^(m) + sign mu u^(m))     -> send C(a), r
    stage M:   f = F(S_M(C(a_prev); x^(M) + sign mu u^(M)))
    stage M:   g_i from the losses; broadcast the P float32 scalars to all stages
    all:       x^(m) <- x^(m) - (lr / P) sum_i g_i u_i^(m)

So a link carries P + 1 (forward) or 2P (central) activation messages per
iteration and the only backward traffic is P scalars per stage.  With
``bits=None`` the activation is sent losslessly and the run reaches MeZO's
parameters bit for bit (exact mode).  See ``wire`` for what crosses and its size.
"""

from __future__ import annotations

import torch

from algorithms.codecs.channel import Channel
from harness.config import RunConfig
from harness.heldout import evaluate_stages, init_head
from harness.models import PRESETS, build_stage, lm_loss
from harness.models.families import family_spec

from . import wire
from .estimator import drift_extras, logged_loss, scalars, walk
from .mezo import batch, log_scalars
from .params import SparQParams  # noqa: F401  (re-exported)
from .perturb import Perturber, step_seeds, zo_update
from .split import select_split


def fits(cfg: RunConfig) -> str | None:
    if cfg.model not in PRESETS:
        return None
    n, M, split = PRESETS[cfg.model].num_blocks, cfg.world_size, cfg.params.blocks()
    if M > n:
        return f"M = {M} stages is more than the {n} blocks of {cfg.model} (at most one split per block)"
    if split:
        if len(split) != M - 1:
            return f"split names {len(split)} blocks; {M} stages need {M - 1}"
        if list(split) != sorted(set(split)) or not all(0 <= b < n for b in split):
            return f"split {list(split)} must be strictly increasing blocks in [0, {n - 1}]"
    return None


def choose_split(cfg: RunConfig) -> tuple[tuple[int, ...], dict[int, float]]:
    p = cfg.params
    if p.blocks():
        return p.blocks(), {}
    return select_split(cfg.model, cfg.world_size, window=p.split_window, bits=p.bits, signed=p.signed,
                        granularity=p.granularity, seed=cfg.seed, data=cfg.data, batch_size=cfg.batch_size,
                        seq_len=cfg.seq_len, calib=p.calib_batches, dtype=cfg.torch_dtype)


class Link:
    """One stage boundary: a channel per message kind; keeps the closed form of what it sent."""

    def __init__(self, comm, p: SparQParams, run_itemsize: int, vocab: int, half: str = "fp16"):
        self.comm, self.p, self.itemsize, self.vocab = comm, p, run_itemsize, vocab
        self.act = Channel(wire.act_codec(p.bits, p.signed, p.format, p.granularity))
        self.res = Channel(wire.residual_codec(p.residual, p.bits, half))
        self.labels = Channel(wire.label_codec(vocab))
        self.closed_form = 0  # bytes this rank sent this step, from the closed forms
        self.nnz = self.numel = 0

    def send(self, a: torch.Tensor, r: torch.Tensor, dst: int) -> None:
        p = self.p
        k = wire.act_nnz(a, p.bits, p.signed, p.granularity)
        self.nnz, self.numel = self.nnz + k, self.numel + a.numel()
        self.closed_form += wire.act_nbytes(tuple(a.shape), k, p.bits, self.itemsize, p.format, p.granularity)
        self.closed_form += wire.residual_nbytes(tuple(r.shape), self.res.codec, self.itemsize)
        self.act.send(self.comm, a, dst, "act")
        self.res.send(self.comm, r, dst, "residual")

    def expect(self, max_numel: int) -> None:
        for channel in (self.act, self.res, self.labels):
            channel.max_numel = max_numel

    def recv(self, src: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.act.recv(self.comm, src, "act", device=device)
        return a, self.res.recv(self.comm, src, "residual", device=device)

    def send_labels(self, labels: torch.Tensor, dst: int) -> None:
        self.closed_form += wire.labels_nbytes(tuple(labels.shape), self.vocab)
        self.labels.send(self.comm, labels, dst, "labels")

    def recv_labels(self, src: int, device) -> torch.Tensor:
        return self.labels.recv(self.comm, src, "labels", device=device).to(torch.int64)


def sparq(ctx):
    cfg, p, comm = ctx.cfg, ctx.params, ctx.comm
    M, rank = ctx.world_size, ctx.rank
    first, last = rank == 0, rank == M - 1
    cuts, rho = choose_split(cfg)
    stage = build_stage(cfg.model, seed=cfg.seed, num_stages=M, stage_index=rank, cut="ffn_act",
                        boundaries=list(cuts), dtype=ctx.dtype, device=ctx.device).eval()
    pert = Perturber([(i, t) for i, _, t in stage.global_named_parameters()], p.mode, p.track_drift)
    preset = PRESETS[cfg.model]
    # the labels are class ids for a classifier, token ids for a causal LM
    classes = preset.num_labels if preset.task == "classify" else preset.vocab_size
    link = Link(comm, p, torch.empty((), dtype=ctx.dtype).element_size(), classes,
                family_spec(preset.family).half_dtype)
    # the receiving ends' expectation: nothing larger than this stage's largest input
    link.expect(stage.largest_numel(cfg.batch_size, cfg.seq_len))
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    nnz_total = numel_total = 0
    init_head(ctx, [(n, t) for _, n, t in stage.global_named_parameters()])
    evaluate_stages(ctx, stage, "start")
    with torch.no_grad():
        for step in ctx.steps():
            link.closed_form, link.nnz, link.numel = 0, 0, 0
            seeds = step_seeds(cfg.seed, step, p.perturbations)
            ids = labels = None
            # a padded encoder's stages build their attention mask from the token ids, which
            # each rank reads itself (like the labels with labels=local): nothing crosses for it
            if first or (last and p.labels == "local") or stage.needs_input_ids:
                ids, labels = batch(cfg, step, ctx.device)
            if p.labels == "send" and first:
                link.send_labels(labels, M - 1)
            if p.labels == "send" and last:
                labels = link.recv_labels(0, ctx.device)
            losses = []
            for _ in walk(pert, seeds, p.mu, p.difference):
                out = stage(ids) if first else stage(*link.recv(rank - 1, ctx.device), input_ids=ids)
                if last:
                    losses.append(lm_loss(out[0], labels))
                else:
                    link.send(*out, rank + 1)
            g = torch.tensor(scalars(losses, p.difference, p.mu) if last else [0.0] * p.perturbations,
                             dtype=torch.float32)
            g = comm.broadcast(g, src=M - 1, tag="scalars")  # the only backward traffic
            zo_update(pert, seeds, g.tolist(), p.lr)
            if last:
                link.closed_form += wire.scalars_nbytes(p.perturbations, M)
                ctx.log(loss=logged_loss(losses, p.difference))
                log_scalars(ctx, g.tolist())
            else:
                ctx.log(act_nnz_ratio=link.nnz / max(1, link.numel))
            ctx.log(closed_form_bytes=link.closed_form)
            nnz_total, numel_total = nnz_total + link.nnz, numel_total + link.numel
    evaluate_stages(ctx, stage, "end")
    for m, c in enumerate(cuts):
        ctx.extra[f"split_block{m}"] = (float(c), "block")
        if c in rho:
            ctx.extra[f"split_nnz_ratio{m}"] = (rho[c], "ratio")
    if not last:
        ctx.extra["act_nnz_ratio"] = (nnz_total / max(1, numel_total), "ratio")
    ctx.extra.update(drift_extras(pert))
    return ctx.finish((i, t) for i, _, t in stage.global_named_parameters())
