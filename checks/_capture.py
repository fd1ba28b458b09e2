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


def run_capturing(cfg: RunConfig) -> tuple[list, dict[int, torch.Tensor]]:
    """``(rank outputs, {global index: final parameter in the run dtype})`` of a threads run."""
    spec = get_algorithm(cfg.algorithm)
    ctxs: dict[int, CapturingContext] = {}

    def body(comm):
        ctx = ctxs[comm.rank] = CapturingContext(cfg, comm)
        return spec.run(ctx)

    outs = run_threads(cfg.world_size, body, timeout_s=cfg.timeout_s)
    params: dict[int, torch.Tensor] = {}
    for ctx in ctxs.values():
        for i, p in ctx.captured.items():
            if i in params:
                raise AssertionError(f"parameter {i} finished on two ranks")
            params[i] = p
    return outs, params
