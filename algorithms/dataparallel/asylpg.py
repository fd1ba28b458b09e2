"""Harness algorithms: AsyLPG, Sparse-AsyLPG, Acc-AsyLPG and the baselines AsyFPG, Acc-AsyFPG, QSVRG, QSGD.

World = 1 master (rank 0) + W = world_size − 1 workers.  **One harness step
is one epoch**: the full-precision snapshot map-reduce plus ``m`` asynchronous
master updates (``serve="schedule"``: served in the order of the seeded delay
schedule, bit-for-bit reproducible; ``serve="arrival"``: first come first
served with the delay bound τ enforced by admission, realised delays reported
as ``delay_hist_<d>``; see ``ps.py``).  The master logs ``loss`` = P(x) at the end of every epoch (the
snapshot x̃ for the accelerated variants).  Samples per step: ``n`` for the
snapshot gradient plus ``2 B m`` (``B m`` without variance reduction) for the
minibatch gradients, reported as ``samples_per_step`` and as the record's
tokens per step (the harness has no samples field yet).

The problem is the run's model (``--model logreg-cancer|logreg-digits|
mlp-digits``); its data (``sklearn-breast-cancer`` or ``sklearn-digits``,
real data shipped inside the scikit-learn wheel) follows from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.registry import register

from . import ps
from .problems import PROBLEM_DATA, PROBLEMS, make_problem

SERVE_MODES = ("schedule", "arrival")
N_SAMPLES = {"logreg-cancer": 569, "logreg-digits": 1797, "mlp-digits": 1797}


@dataclass(frozen=True)
class DQParams:
    lr: float = 0.05
    batch: int = 20
    m: int = 0  # master updates per epoch; 0 = ceil(n / batch)
    b: int = 4  # gradient bits (32 = full precision)
    bx: int = 8  # parameter bits (32 = full precision)
    mu: float = 1.0
    adaptive_bx: bool = False
    bx_max: int = 16
    phi: float = 1.0
    tau: int = 4
    l1: float = 1e-4
    l2: float = 1e-4
    eval_every: int = 0
    serve: str = "schedule"  # "schedule" (seeded event order) | "arrival" (first come, first served)

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

    def setup(self, variant: str, *, problem: str, workers: int, seed: int) -> ps.Setup:
        return ps.Setup(ps.VARIANTS[variant], lr=self.lr, m=self.epoch_length(problem), batch=self.batch, b=self.b,
                        bx=self.bx, mu=self.mu, adaptive_bx=self.adaptive_bx, bx_max=self.bx_max, phi=self.phi,
                        tau=self.tau, workers=workers, seed=seed, eval_every=self.eval_every)


def _check(cfg) -> str | None:
    if cfg.world_size < 2:
        return "needs a master and at least one worker: world size >= 2 (got 0 workers)"
    if cfg.model in PROBLEM_DATA and cfg.data != PROBLEM_DATA[cfg.model]:
        return f"model {cfg.model} trains on data {PROBLEM_DATA[cfg.model]}, not {cfg.data}"
    return None


def _rank_program(variant: str):
    def run(ctx):
        p, cfg = ctx.params, ctx.cfg
        prob = make_problem(cfg.model, l1=p.l1, l2=p.l2, dtype=ctx.dtype)
        st = p.setup(variant, problem=cfg.model, workers=ctx.world_size - 1, seed=cfg.seed)
        samples = (prob.n if st.variant.svrg else 0) + st.m * st.batch * (2 if st.variant.svrg else 1)
        ctx.tokens_per_step = samples
        ctx.extra["samples_per_step"] = (samples, "samples")
        arrival = p.serve == "arrival"
        if ctx.rank == 0:
            master = ps.Master(prob, st, ctx.dtype)
            epoch = ps.master_epoch_arrival if arrival else ps.master_epoch
            for s in ctx.steps():
                epoch(ctx.comm, master, s)
                ctx.log(loss=master.losses[-1])
            ctx.extra.update(master.stats.extra())
            if arrival:
                ctx.extra.update(master.stats.arrival_extra(st.tau))
            return ctx.finish([(0, master.x)])
        worker = ps.Worker(prob, st, ctx.rank - 1)
        epoch = ps.worker_epoch_arrival if arrival else ps.worker_epoch
        for s in ctx.steps():
            epoch(ctx.comm, worker, s)
        return ctx.finish([])

    run.__name__ = variant.replace("-", "_")
    return run


SUMMARIES = {
    "asylpg": "AsyLPG: async prox-SVRG, parameters quantised to b_x bits, gradient differences to b bits",
    "sparse-asylpg": "Sparse-AsyLPG: AsyLPG with unbiased magnitude-proportional sparsification (budget phi)",
    "acc-asylpg": "Acc-AsyLPG: accelerated AsyLPG (theta_s, epoch-average snapshot)",
    "asyfpg": "AsyFPG: async prox-SVRG in full precision (baseline)",
    "acc-asyfpg": "Acc-AsyFPG: accelerated async prox-SVRG in full precision (baseline)",
    "qsvrg": "QSVRG: async prox-SVRG, b-bit gradients, full-precision parameters (baseline)",
    "qsgd": "QSGD: async prox-SGD with b-bit qstoch gradients, no variance reduction (baseline)",
}

for _name, _summary in SUMMARIES.items():
    register(_name, family="dataparallel", params=DQParams, min_world=1, check=_check,
             paper="double-quant", summary=_summary, models=PROBLEMS,
             default_data=PROBLEM_DATA)(_rank_program(_name))
