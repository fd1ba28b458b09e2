"""``zo2``: MeZO with transformer blocks offloaded to the host, one block on the device at a time.

:class:`ZO2Engine` runs one ZO step as a single pass over the modules
(embedding -> blocks -> head).  At each module it first applies the *deferred*
update of the previous step (``x <- x - lr/P sum g_i z_i``), then walks the
step's evaluation points (:func:`~.estimator.walk`), advancing every
evaluation's hidden state through that module.  A block therefore crosses the
host link once per step in each direction (DistZO2 paper, Algorithm 3): the update of
step t cannot be applied at step t because the blocks are already back on the
host when ``g_t`` is known.

Per element the operations are exactly MeZO's (update of t, then the
perturbations of t+1; z a pure function of (seed, global index)), so ZO2 in
``exact`` mode is bit-identical to ``mezo``.  ``flush()`` applies a pending
update (upload -> update -> offload for each block); the rank program calls it
before returning parameters, so no result is ever taken with a pending update.

The blocks follow the three-stage schedule of :meth:`ZO2Engine.run_blocks`
(upload i+1 / compute i / offload i-1, see :mod:`.offload`).

Each module's z is drawn once per use: once for the deferred update (seed of
step t) and once for the step's perturbation (seed of t+1), kept on the
device through the +mu / -2mu / restore passes of that module (Perturber
``keep_z``) — two draws per parameter per step where MeZO's four passes
(Algorithm 1: +eps, -2eps, +eps, update) draw four.  :attr:`ZO2Engine.clock`
times the phases of each step (:mod:`.phases`).

``evals`` restricts which evaluation points this process computes a loss for
(DistZO2 PertP: the + rank the +mu points, the - rank the -mu points); the
parameters still walk every point, so all ranks hold the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from harness.models import build_model, lm_loss, split_model

from .estimator import evaluations, walk
from .offload import BlockOffloader, ScheduleLog
from .params import ZO2Params, ZOParams  # noqa: F401  (re-exported)
from .perturb import Perturber, zo_update
from .phases import PhaseClock


class ZO2Engine:
    """A model whose blocks live on the host, trained by ZO-SGD with deferred updates."""

    def __init__(self, model, *, device: torch.device, mode: str = "exact", budget: int = 3,
                 comm=None, sliced: bool = False, log: ScheduleLog | None = None, trace: bool = False):
        self.model = model
        self.stage = split_model(model, 1)[0]  # the family's embed / block / head functions
        self.fam = self.stage.ops
        index = {id(p): i for i, p in enumerate(model.parameters())}
        self.layers = list(self.fam.layers(model))
        in_blocks = {id(p) for layer in self.layers for p in layer.parameters()}
        embed = [p for p in self.stage.embed.parameters() if id(p) not in in_blocks]
        seen = {id(p) for p in embed}
        head = [p for p in self.stage.head.parameters() if id(p) not in in_blocks]
        # Resident modules stay on the device.  A tied weight is updated once (with the
        # embedding) but perturbed in both walks, so the head sees it at the same point.
        for p in embed + head:
            p.data = p.data.to(device)
        self.clock = PhaseClock()

        def pert(ps):
            return Perturber([(index[id(p)], p) for p in ps], mode, keep_z=True, clock=self.clock)

        self.embed_pert = pert(embed)
        self.head_pert = pert(head)
        self.head_update = pert([p for p in head if id(p) not in seen])
        blocks = [list(layer.parameters()) for layer in self.layers]
        self.block_perts = [pert(b) for b in blocks]
        self.off = BlockOffloader(blocks, device=device, budget=budget, comm=comm, sliced=sliced, log=log,
                                   trace=trace)
        self.device = torch.device(device)
        self.pending: tuple[list[int], list[float], float] | None = None  # (seeds, g, lr)
        self.compute_s = 0.0

    @property
    def log(self) -> ScheduleLog:
        return self.off.log

    @property
    def z_generations(self) -> int:
        """z draws so far (one per parameter tensor per draw), over every perturber."""
        perts = [self.embed_pert, self.head_pert, self.head_update, *self.block_perts]
        return sum(p.z_generations for p in perts)

    # -- schedule ----------------------------------------------------------------------
    def run_blocks(self, compute: Callable[[int], None]) -> None:
        """Upload i+1 / compute i / offload i-1, with at most ``budget`` blocks resident.

        With budget >= 3 the next block is uploaded before (on CUDA: while) the
        current one computes and the previous one offloads after; with 2 the
        previous block leaves first; with 1 there is no prefetch.
        """
        off, N, B = self.off, len(self.layers), self.off.budget
        clock = self.clock
        for i in range(N):
            with clock("offload"):
                if i > 0 and B < 3:
                    off.offload(i - 1)
                if i not in off.where:
                    off.upload(i)
                if i + 1 < N and len(off.where) < B:
                    off.upload(i + 1)
                off.before_compute(i)
            t0 = time.perf_counter()
            compute(i)
            self.compute_s += time.perf_counter() - t0
            off.computed(i)
            if i > 0 and B >= 3:
                with clock("offload"):
                    off.offload(i - 1)
        if N:
            with clock("offload"):
                off.offload(N - 1)
        off.log.pass_id += 1

    def _apply_pending(self, pert: Perturber) -> None:
        if self.pending is not None:
            seeds, g, lr = self.pending
            zo_update(pert, seeds, g, lr)

    # -- one step ----------------------------------------------------------------------
    @torch.no_grad()
    def losses(self, ids: Tensor, labels: Tensor, seeds: Sequence[int], p: ZOParams,
               evals: Sequence[int] | None = None) -> dict[int, Tensor]:
        """Loss at each evaluation point in ``evals`` (default: all), applying the pending update."""
        n_eval = len(evaluations(p.difference, len(seeds)))
        mine = set(range(n_eval) if evals is None else evals)
        fam, st, fwd = self.fam, self.stage, self.clock("forward")
        hs: dict[int, Tensor] = {}
        self._apply_pending(self.embed_pert)
        for k, _ in enumerate(walk(self.embed_pert, seeds, p.mu, p.difference)):
            if k in mine:
                with fwd:
                    hs[k] = fam.embed(st, ids)
        with fwd:
            ctx = fam.context(st, next(iter(hs.values())), ids) if hs else {}

        def compute(i: int) -> None:
            self._apply_pending(self.block_perts[i])
            for k, _ in enumerate(walk(self.block_perts[i], seeds, p.mu, p.difference)):
                if k in mine:
                    with fwd:
                        hs[k] = fam.block(self.layers[i], hs[k], ctx)

        self.run_blocks(compute)
        self._apply_pending(self.head_update)
        out = {}
        for k, _ in enumerate(walk(self.head_pert, seeds, p.mu, p.difference)):
            if k in mine:
                with fwd:
                    out[k] = lm_loss(fam.head(st, hs[k], ids), labels)
        self.pending = None
        return out

    def defer(self, seeds: Sequence[int], g: Sequence[float], lr: float) -> None:
        """Remember step t's update; it is applied module by module in the next pass."""
        if self.pending is not None:
            raise RuntimeError("an update is already pending")
        self.pending = (list(seeds), [float(x) for x in g], float(lr))

    @torch.no_grad()
    def flush(self) -> None:
        """Apply a pending update now (an update-only pass): before save, eval or exit."""
        if self.pending is None:
            return
        self._apply_pending(self.embed_pert)
        self.run_blocks(lambda i: self._apply_pending(self.block_perts[i]))
        self._apply_pending(self.head_update)
        self.pending = None
        self.off.synchronize()

    def named_params(self) -> list[tuple[int, Tensor]]:
        """Every parameter (global index, CPU tensor); refuses while an update is pending."""
        if self.pending is not None:
            raise RuntimeError("flush() the pending update before reading the parameters")
        out = {i: p.detach().cpu() for pert in (self.embed_pert, self.head_pert) for i, p in pert.params}
        for i, pert in enumerate(self.block_perts):
            for (idx, _), t in zip(pert.params, self.off.block_tensors(i), strict=True):
                out[idx] = t
        return sorted(out.items())

    def device_pool_peak_bytes(self) -> int:
        """Simulated device memory: resident modules + the block slots ever in use."""
        res = sum(p.numel() * p.element_size() for pert in (self.embed_pert, self.head_pert)
                  for _, p in pert.params)
        return res + self.off.max_slots_used * self.off.slot_bytes()


def build_engine(ctx, *, comm=None, log: ScheduleLog | None = None) -> ZO2Engine:
    cfg, p = ctx.cfg, ctx.params
    model = build_model(cfg.model, seed=cfg.seed, dtype=ctx.dtype).eval()
    return ZO2Engine(model, device=ctx.device, mode=p.mode, budget=p.budget, comm=comm,
                     sliced=p.sliced, log=log)
