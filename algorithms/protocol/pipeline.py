"""``protocol``: the subspace-constrained pipeline, and ``protocol-central``, the same
constrained model trained unsplit in one process (its reference).

The schedule is the pipeline engine's (``algorithms.pipeline.engine.run_step``):
GPipe by default (all micro-batches forward, then all backward in the same
order; parameter ``schedule``), one stage per rank, tags ``"act"`` / ``"grad"``.  :class:`ProtocolBoundary` is the engine's
boundary map; what crosses a boundary (spec §2.4, §2.5):

* forward, two messages per micro-batch: ``C = (X - PE - T_fixed[ids]) U``
  ([b, n, k] in the transmit dtype, parameter ``wire``) and the token ids ([b, n], the ``ids`` codec:
  1 byte each for a vocabulary up to 256, 2 up to 65 536, else 4).  The receiver rebuilds
  ``X = C Uᵀ + PE + T_fixed[ids]`` exactly;
* backward, one message: ``∂L/∂C = G U`` ([b, n, k]); autograd of the
  sender's encode turns it into ``G U Uᵀ``.

After backward every rank projects the gradients of its constrained tensors
(their projected gradient is what both the split and the unsplit model agree
on, spec I7), steps AdamW (row-constant second moment for the down
projections) and projects the constrained tensors again.  Every
``grassmann_every`` steps the last rank, which accumulated ``Gᵀ G`` of its
full-width input gradient, takes a Grassmann step, broadcasts the new ``U``
(tag ``"grassmann"``), and every rank re-projects its tensors and first moments.
"""

from __future__ import annotations

import torch

from algorithms.codecs import make_codec
from algorithms.codecs.channel import Channel
from algorithms.codecs.ids import id_nbytes
from algorithms.pipeline.engine import Arrival, Boundary, LinkCodecs, StageLinks, run_step
from algorithms.pipeline.local import batch, micro_batch_problem, train_local
from algorithms.pipeline.optim import lr_factor, set_lr
from harness.config import RunConfig
from harness.models import PRESETS, build_model, build_stage, family_spec, max_stages

from .model import ConstrainedModel, first_free_block, residual_problem
from .params import WIRES, CentralParams, ProtocolParams  # noqa: F401  (re-exported)
from .subspace import SubspaceAdamW, Wire, fixed_table, grassmann_step, make_basis


# --------------------------------------------------------------------------- set-up
def check(cfg: RunConfig) -> str | None:
    msg = micro_batch_problem(cfg) or residual_problem(cfg.model)
    if msg:
        return msg
    pr, p = PRESETS[cfg.model], cfg.params
    if p.k >= pr.d_model:
        return f"k = {p.k} must be < d = {pr.d_model} (the model width of {cfg.model}); k >= d compresses nothing"
    stages = cfg.world_size if cfg.algorithm == "protocol" else p.stages
    if stages > max_stages(pr.num_blocks):
        return f"{stages} stages do not fit {cfg.model}, which has {pr.num_blocks} blocks"
    return None


def make_wire(cfg: RunConfig, dtype: torch.dtype, device) -> Wire:
    """``U``, ``T_fixed`` and ``PE_fixed`` from the seed: identical on every rank."""
    pr, p = PRESETS[cfg.model], cfg.params
    U = make_basis(pr.d_model, p.k, seed=cfg.seed * 1_000_003 + p.basis_seed, dtype=dtype).to(device)
    t_fixed = fixed_table(pr.vocab_size, pr.d_model, cfg.seed, "tokens", p.fixed_std, dtype).to(device)
    pe = None
    if family_spec(pr.family).position_embedding is not None:  # learned positions: a fixed high-rank part too
        pe = fixed_table(pr.max_positions, pr.d_model, cfg.seed, "positions", p.fixed_std, dtype).to(device)
    return Wire(U, t_fixed, pe)


def wire_codec(p, dtype: torch.dtype):
    if p.wire == "auto":
        return make_codec("fp64" if dtype == torch.float64 else "fp32")
    return make_codec(p.wire)


def ids_codec(vocab: int):
    """Token ids cross as the ``ids`` codec: the narrowest unsigned width for the vocabulary."""
    return make_codec(f"ids:vocab={vocab}")


# --------------------------------------------------------------------------- one step
class GramAccumulator:
    """``S = Σ Gᵀ G`` of the full-width gradient at the last stage's input, and its count."""

    def __init__(self, d: int, dtype, device):
        self.s = torch.zeros(d, d, dtype=dtype, device=device)
        self.steps = 0

    def add(self, g: torch.Tensor) -> None:
        g = g.detach().reshape(-1, g.shape[-1])
        self.s += g.T @ g

    def reset(self) -> None:
        self.s.zero_()
        self.steps = 0


class ProtocolBoundary(Boundary):
    """The engine's boundary map for the subspace wire (spec §2.4, §2.5).

    Forward, per micro-batch: ``C = wire.encode(x, ids)`` under key ``(mb, 0)``
    and the token ids under ``(mb, 1)``; the receiver rebuilds ``x`` from both,
    so the gradient that comes back is ``∂L/∂C`` and the received ``C`` is the
    leaf whose gradient goes back.  With a ``gram`` the (last) rank keeps its
    rebuilt inputs to accumulate ``Gᵀ G`` of their full-width gradients.
    """

    def __init__(self, wire: Wire, vocab: int, gram: GramAccumulator | None = None):
        self.wire, self.vocab, self.gram = wire, vocab, gram
        self.ids = Channel(ids_codec(vocab))
        self.rebuilt: list[torch.Tensor] = []

    def send(self, comm, channel, outputs, dst, mb, tokens):
        c = self.wire.encode(outputs[0], tokens)
        channel.send(comm, c, dst, "act", (mb, 0))
        self.ids.send(comm, tokens, dst, "act", (mb, 1))
        return (c,)

    def first_messages(self, stage) -> int:
        return 2  # C and the token ids

    def recv(self, comm, channel, src, mb, stage, device) -> Arrival:
        c = channel.recv(comm, src, "act", (mb, 0), device).requires_grad_()
        self.ids.max_numel = channel.max_numel  # the token ids are smaller than a hidden state
        tokens = self.ids.recv(comm, src, "act", (mb, 1), device)
        x = self.wire.decode(c, tokens)
        if self.gram is not None:
            x.retain_grad()
            self.rebuilt.append(x)
        return Arrival((c,), (x,), tokens)

    def accumulate(self) -> None:
        """After backward: ``Gᵀ G`` of every micro-batch's rebuilt input, in micro-batch order."""
        for x in self.rebuilt:
            self.gram.add(x.grad)
        self.rebuilt.clear()
        self.gram.steps += 1


def protocol_step(comm, stage, wire: Wire, input_ids, labels, micro_batches: int, codec,
                  vocab: int, gram: GramAccumulator | None = None, schedule: str = "gpipe") -> float | None:
    """Forward and backward of one batch on this rank's stage; the loss on the last rank."""
    links = StageLinks.direct(comm.rank, comm.world_size, LinkCodecs(forward=codec, backward=codec))
    boundary = ProtocolBoundary(wire, vocab, gram)
    loss = run_step(comm, stage, input_ids, labels, micro_batches, links, boundary, schedule)
    if gram is not None:
        boundary.accumulate()
    return loss


def grassmann_sync(comm, wire: Wire, model: ConstrainedModel, opt, gram: GramAccumulator | None,
                   eta0: float, src: int) -> None:
    """The ``src`` rank steps ``U``; everyone receives it, re-projects weights and first moments."""
    new = grassmann_step(wire.U, gram.s, gram.steps, eta0) if comm.rank == src else torch.empty_like(wire.U)
    if comm.world_size > 1:
        new = comm.broadcast(new.cpu(), src=src, tag="grassmann").to(wire.U.device)
    wire.U = new
    model.project()
    model.project_moments(opt)
    if gram is not None:
        gram.reset()


def scheduled_lr(cfg: RunConfig, step: int) -> float:
    p = cfg.params
    return p.lr * lr_factor(p.lr_schedule, step, cfg.steps, p.warmup)


def _report(ctx, wire: Wire, model: ConstrainedModel, U0: torch.Tensor, updates: int) -> None:
    U = wire.U.double()
    eye = torch.eye(U.shape[1], dtype=torch.float64, device=U.device)
    ctx.extra["subspace_distance"] = (model.distance(), "ratio")
    ctx.extra["basis_orthonormality_error"] = (float((U.T @ U - eye).abs().max()), "abs")
    # sine of the largest principal angle between the initial and the final subspace
    cos = torch.linalg.svdvals(U0.double().T @ U).clamp(max=1.0)
    ctx.extra["basis_shift_sin"] = (float((1 - cos.min() ** 2).clamp(min=0).sqrt()), "ratio")
    ctx.extra["grassmann_updates"] = (float(updates), "count")
    ctx.extra["compression_ratio"] = (wire.d / wire.k, "ratio")


# --------------------------------------------------------------------------- the algorithms
def protocol(ctx):
    cfg, p = ctx.cfg, ctx.params
    S, last = ctx.world_size, ctx.world_size - 1
    pr = PRESETS[cfg.model]
    stage = build_stage(cfg.model, seed=cfg.seed, num_stages=S, stage_index=ctx.rank,
                        dtype=ctx.dtype, device=ctx.device)
    wire = make_wire(cfg, ctx.dtype, ctx.device)
    model = ConstrainedModel(stage, wire, first_free_block(pr.num_blocks, S))
    opt = model.optimizer(p)
    codec = wire_codec(p, ctx.dtype)
    gram = GramAccumulator(pr.d_model, ctx.dtype, ctx.device) if p.grassmann_every and ctx.rank == last else None
    U0, updates = wire.U.clone(), 0
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    for step in ctx.steps():
        input_ids, labels = batch(cfg, step, ctx.device)
        opt.zero_grad(set_to_none=True)
        loss = protocol_step(ctx.comm, stage, wire, input_ids, labels, cfg.micro_batches, codec,
                             pr.vocab_size, gram, p.schedule)
        model.project_grads()
        set_lr(opt, scheduled_lr(cfg, step))
        opt.step()
        model.project()
        if p.grassmann_every and (step + 1) % p.grassmann_every == 0:
            grassmann_sync(ctx.comm, wire, model, opt, gram, p.grassmann_eta, src=last)
            updates += 1
        if loss is not None:
            ctx.log(loss=loss)
    _report(ctx, wire, model, U0, updates)
    return ctx.finish((i, t) for i, _, t in stage.global_named_parameters())


def protocol_central(ctx):
    cfg, p = ctx.cfg, ctx.params
    pr = PRESETS[cfg.model]
    net = build_model(cfg.model, seed=cfg.seed, dtype=ctx.dtype, device=ctx.device)
    wire = make_wire(cfg, ctx.dtype, ctx.device)
    free = first_free_block(pr.num_blocks, p.stages)
    model = ConstrainedModel(net, wire, free) if p.constrained else None
    if model is not None:
        opt = model.optimizer(p)
    else:
        opt = SubspaceAdamW([{"params": [w]} for w in net.parameters()], lr=p.lr,
                            betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
    grassmann = bool(p.grassmann_every and model is not None)
    gram = GramAccumulator(pr.d_model, ctx.dtype, ctx.device) if grassmann else None
    boundary: list[torch.Tensor] = []
    if grassmann:  # the full-width gradient at the input of the first free block
        layer = net.get_submodule(family_spec(pr.family).block(free))

        def keep(module, args):
            args[0].retain_grad()
            boundary.append(args[0])

        layer.register_forward_pre_hook(keep)
    U0, updates = wire.U.clone(), 0

    def after_backward():
        gram.add(boundary[0].grad)
        boundary.clear()

    def before_update():
        if gram is not None:
            gram.steps += 1
        if model is not None:
            model.project_grads()

    def after_update(step):
        nonlocal updates
        if model is not None:
            model.project()
        if grassmann and (step + 1) % p.grassmann_every == 0:
            grassmann_sync(ctx.comm, wire, model, opt, gram, p.grassmann_eta, src=0)
            updates += 1

    train_local(ctx, net, opt, lr_at=lambda step: scheduled_lr(cfg, step), after_backward=after_backward if gram is not None else None,
                before_update=before_update, after_update=after_update)
    if model is not None:
        _report(ctx, wire, model, U0, updates)
    return ctx.finish(enumerate(net.parameters()))


# --------------------------------------------------------------------------- closed forms
def expected_bytes(cfg: RunConfig) -> dict[str, float]:
    """Closed-form payload bytes per step by tag (``act``, ``grad``), headers included.

    Per boundary and micro-batch of ``b x n`` tokens: forward ``C`` ([b, n, k])
    plus the ids ([b, n]), backward ``∂L/∂C`` ([b, n, k]); each message also
    carries its codec header.
    """
    pr, p, dt = PRESETS[cfg.model], cfg.params, cfg.torch_dtype
    b, n = cfg.batch_size // cfg.micro_batches, cfg.seq_len
    codec = wire_codec(p, dt)
    c = codec.encoded_nbytes(torch.empty(b, n, p.k, dtype=dt))
    ids = ids_codec(pr.vocab_size).encoded_nbytes(torch.zeros(b, n, dtype=torch.int64))
    links = cfg.world_size - 1
    return {"act": links * cfg.micro_batches * (c + ids), "grad": links * cfg.micro_batches * c}


def bytes_per_token(cfg: RunConfig) -> dict[str, int]:
    """Values per token per boundary (no headers): forward ``k s + s_id``, backward ``k s``;
    the uncompressed pipeline sends ``d s`` each way."""
    pr, p, dt = PRESETS[cfg.model], cfg.params, cfg.torch_dtype
    s = wire_codec(p, dt).encoded_nbytes(torch.empty(1, dtype=dt)) - wire_codec(p, dt).encoded_nbytes(
        torch.empty(0, dtype=dt))
    s_id = id_nbytes(pr.vocab_size)
    return {"fwd": p.k * s + s_id, "bwd": p.k * s, "uncompressed": pr.d_model * s}
