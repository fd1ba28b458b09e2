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

from . import ps
from .params import PROBLEM_DATA, DQParams  # noqa: F401  (re-exported)
from .problems import make_problem


def check(cfg) -> str | None:
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


def rank_program(ctx):
    """The rank function of every variant (the declared name picks the variant)."""
    return _rank_program(ctx.cfg.algorithm)(ctx)
