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

from dataclasses import dataclass

import torch

from algorithms.codecs.channel import Channel
from harness.config import ConfigError, RunConfig
from harness.heldout import evaluate_stages, init_head
from harness.models import PRESETS, build_stage, lm_loss
from harness.registry import register

from . import wire
from .estimator import ZOParams, drift_extras, logged_loss, scalars, walk
from .mezo import batch, log_scalars
from .perturb import Perturber, step_seeds, zo_update
from .split import select_split

LABEL_MODES = ("send", "local")


@dataclass(frozen=True)
class SparQParams(ZOParams):
    bits: int | None = 4  # activation quantiser bits (1..8); None: lossless (identity)
    # activation grid: auto = per message, unsigned iff no entry is negative (ReLU); true: the
    # signed AQ-SGD fixpoint quantiser (seed-sparq §2.7) always; false: unsigned always (wire.py)
    signed: str = "auto"
    # what one activation scale covers: tensor (default: the granularity that reproduces SparQ
    # Fig. 2 / §2.4 on real weights, see wire.GRANULARITY), token, or channel (AQ-SGD's)
    granularity: str = wire.GRANULARITY
    format: str = "auto"  # sparse body: auto (cheapest) | dense | bitmap | coo
    residual: str = "auto"  # residual-stream codec (any dense codec): auto = identity if bits is None else fp16
    labels: str = "send"  # send: first stage sends them to the last (counted); local: regenerated
    split: str = "auto"  # ffn_act cut blocks, e.g. "5" or "1,2,3"; auto: choose by measured sparsity
    split_window: int = 1  # selection: blocks within this distance of the even split
    calib_batches: int = 2  # selection: validation batches measured

    def __post_init__(self):
        super().__post_init__()
        if self.bits is not None and not (isinstance(self.bits, int) and 1 <= self.bits <= 8):
            raise ConfigError(f"bits must be an int in 1..8 (or none for lossless activations), got {self.bits!r}")
        if isinstance(self.signed, bool):  # accept a bool from Python callers
            object.__setattr__(self, "signed", "true" if self.signed else "false")
        if self.signed not in wire.SIGNED_MODES:
            raise ConfigError(f"signed must be one of {', '.join(wire.SIGNED_MODES)}, got {self.signed!r}")
        if self.granularity not in wire.GRANULARITIES:
            raise ConfigError(f"granularity must be one of {', '.join(wire.GRANULARITIES)}, "
                              f"got {self.granularity!r}")
        if self.format not in wire.FORMATS:
            raise ConfigError(f"format must be one of {', '.join(wire.FORMATS)}, got {self.format!r}")
        if self.labels not in LABEL_MODES:
            raise ConfigError(f"labels must be one of {', '.join(LABEL_MODES)}, got {self.labels!r}")
        if self.split_window < 0 or self.calib_batches < 1:
            raise ConfigError("split_window must be >= 0 and calib_batches >= 1")
        if self.split != "auto":
            try:
                self.blocks()
            except ValueError:
                raise ConfigError(f"split must be 'auto' or comma-separated block indices, got {self.split!r}") from None
        if self.residual != "auto":
            from algorithms.codecs import make_codec

            make_codec(self.residual)  # CodecError names the valid codecs

    def blocks(self) -> tuple[int, ...]:
        """The explicit split blocks (empty for auto)."""
        return () if self.split == "auto" else tuple(int(b) for b in self.split.split(",") if b.strip())


def _fits(cfg: RunConfig) -> str | None:
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

    def __init__(self, comm, p: SparQParams, run_itemsize: int, vocab: int):
        self.comm, self.p, self.itemsize, self.vocab = comm, p, run_itemsize, vocab
        self.act = Channel(wire.act_codec(p.bits, p.signed, p.format, p.granularity))
        self.res = Channel(wire.residual_codec(p.residual, p.bits))
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

    def recv(self, src: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.act.recv(self.comm, src, "act", device=device)
        return a, self.res.recv(self.comm, src, "residual", device=device)

    def send_labels(self, labels: torch.Tensor, dst: int) -> None:
        self.closed_form += wire.labels_nbytes(tuple(labels.shape), self.vocab)
        self.labels.send(self.comm, labels, dst, "labels")

    def recv_labels(self, src: int, device) -> torch.Tensor:
        return self.labels.recv(self.comm, src, "labels", device=device).to(torch.int64)


@register("sparq", family="zo", params=SparQParams, min_world=2, check=_fits,
          paper="SparQ: ZO model parallelism with quantisation-induced sparse activations",
          summary="ZO model parallelism: quantised sparse FFN-activation splits forward, P scalars back")
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
    link = Link(comm, p, torch.empty((), dtype=ctx.dtype).element_size(), classes)
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
