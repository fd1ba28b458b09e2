"""The data-parallel (double quantisation) family's declarations: the parameter dataclass and
the seven parameter-server algorithms (torch-free).

The rank function lives in :mod:`.asylpg` (one for every variant); it is imported only when a
rank runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.registry import AlgorithmSpec, declare, param

from .tables import PROBLEM_DATA, PROBLEMS

SERVE_MODES = ("schedule", "arrival")
N_SAMPLES = {"logreg-cancer": 569, "logreg-digits": 1797, "mlp-digits": 1797}


@dataclass(frozen=True)
class DQParams:
    lr: float = param(0.05, "learning rate")
    batch: int = param(20, "minibatch size B")
    m: int = param(0, "master updates per epoch; 0 = ceil(n / batch)")
    b: int = param(4, "gradient bits (32 = full precision)")
    bx: int = param(8, "parameter bits (32 = full precision)")
    mu: float = param(1.0, "parameter quantiser's scale bound (the paper's mu)")
    adaptive_bx: bool = param(False, "raise bx as the iterates converge, up to bx_max")
    bx_max: int = param(16, "adaptive_bx: the most parameter bits")
    phi: float = param(1.0, "Sparse-AsyLPG: the sparsification budget")
    tau: int = param(4, "the delay bound (master updates a worker's gradient may be behind)")
    l1: float = param(1e-4, "l1 regulariser weight (the proximal step)")
    l2: float = param(1e-4, "l2 regulariser weight")
    eval_every: int = param(0, "also evaluate the objective every this many master updates (0: per epoch)")
    serve: str = param("schedule", '"schedule" (seeded event order) | "arrival" (first come, first served)')

    def __post_init__(self):
        if self.serve not in SERVE_MODES:
            raise ValueError(f"serve must be one of {', '.join(SERVE_MODES)}, got {self.serve!r}")
        if self.l1 < 0 or self.l2 < 0:
            raise ValueError("l1 and l2 must be >= 0")
        if self.m < 0:
            raise ValueError(f"m must be >= 0, got {self.m}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        # the engine's own checks (bits, tau, phi, ...)
        self.setup("asylpg", problem=PROBLEMS[0], workers=1, seed=0)

    def epoch_length(self, problem: str) -> int:
        return self.m or math.ceil(N_SAMPLES[problem] / self.batch)

    def setup(self, variant: str, *, problem: str, workers: int, seed: int):
        from . import ps

        return ps.Setup(ps.VARIANTS[variant], lr=self.lr, m=self.epoch_length(problem), batch=self.batch, b=self.b,
                        bx=self.bx, mu=self.mu, adaptive_bx=self.adaptive_bx, bx_max=self.bx_max, phi=self.phi,
                        tau=self.tau, workers=workers, seed=seed, eval_every=self.eval_every)


SUMMARIES = {
    "asylpg": "AsyLPG: async prox-SVRG, parameters quantised to b_x bits, gradient differences to b bits",
    "sparse-asylpg": "Sparse-AsyLPG: AsyLPG with unbiased magnitude-proportional sparsification (budget phi)",
    "acc-asylpg": "Acc-AsyLPG: accelerated AsyLPG (theta_s, epoch-average snapshot)",
    "asyfpg": "AsyFPG: async prox-SVRG in full precision (baseline)",
    "acc-asyfpg": "Acc-AsyFPG: accelerated async prox-SVRG in full precision (baseline)",
    "qsvrg": "QSVRG: async prox-SVRG, b-bit gradients, full-precision parameters (baseline)",
    "qsgd": "QSGD: async prox-SGD with b-bit qstoch gradients, no variance reduction (baseline)",
}

# World = 1 master + W >= 1 workers.
for _name, _summary in SUMMARIES.items():
    declare(AlgorithmSpec(
        _name, family="dataparallel", params=DQParams, min_world=2, paper="double-quant", summary=_summary,
        models=PROBLEMS, default_data=PROBLEM_DATA, entry="algorithms.dataparallel.asylpg:rank_program",
        check="algorithms.dataparallel.asylpg:check"))
