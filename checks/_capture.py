"""Run a config on thread ranks and keep each rank's final parameters in the run dtype.

A rank's :class:`~harness.context.RankOutput` holds float32 copies (what the
fingerprint hashes); the anchors compare float64 runs against calculus at
float64 precision, so :class:`CapturingContext` keeps the tensors ``finish``
receives before they are cast.
"""

from __future__ import annotations

import torch

from harness.comm import run_threads
from harness.config import RunConfig
from harness.context import RankContext
from harness.registry import get_algorithm


class CapturingContext(RankContext):
    def finish(self, params):
        params = [(int(i), p) for i, p in params]
        self.captured = {i: p.detach().clone() for i, p in params}
        return super().finish(params)


def run_capturing(cfg: RunConfig, replicated: bool = False) -> tuple[list, dict[int, torch.Tensor]]:
    """``(rank outputs, {global index: final parameter in the run dtype})`` of a threads run.

    Stages hold disjoint parameters, which are merged; with ``replicated`` every rank
    holds the whole model (DistZO2), and every rank's copy must be bit-identical.
    """
    spec = get_algorithm(cfg.algorithm)
    ctxs: dict[int, CapturingContext] = {}

    def body(comm):
        ctx = ctxs[comm.rank] = CapturingContext(cfg, comm)
        return spec.run(ctx)

    outs = run_threads(cfg.world_size, body, timeout_s=cfg.timeout_s)
    params: dict[int, torch.Tensor] = {}
    for r in sorted(ctxs):
        for i, p in ctxs[r].captured.items():
            if i in params and not replicated:
                raise AssertionError(f"parameter {i} finished on two ranks")
            if i in params and not torch.equal(params[i], p):
                raise AssertionError(f"rank {r}'s parameter {i} differs from rank 0's")
            params[i] = p
    return outs, params
