"""``pipeline-sgd`` against ``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``)
on 2 gloo ranks: the same stages, batches, micro-batches, loss and SGD.

The peer runs the project's own stage modules (``build_stage``) in a
:class:`PipelineStage` through a thin adapter (:class:`StageModule`: the token
ids as a keyword, chunked with the micro-batches, and a lone output tensor
unwrapped), with ``loss_fn`` = the engine's per-micro-batch loss ``lm_loss / M``
and ``scale_grads=False`` (the engine scales the loss, not the gradients, so the
gradients are bit-identical: ``checks/test_pipelining_peer.py``).  Both are timed
per step inside their step loops.  A repeat runs, alternately, ``pipeline-sgd``
with ``schedule=gpipe``, the peer's ``ScheduleGPipe``, ``pipeline-sgd`` with
``schedule=1f1b`` and the peer's ``Schedule1F1B``; the table gives each
engine ÷ peer ratio of median step times per repeat (median [min, max]) and the
peer's CPU time per step.  ``params_sha256`` of every run is printed: all equal.
The load average is printed: the machine may be shared, and only ratios of one
run compare.

    python3 -m benchmarks.pipelining_ratio [--model tiny-opt] [--repeats 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os

import torch

from benchmarks.pipeline_ratio import timed_reference
from benchmarks.spread import extremes
from harness.launcher import run
from harness.registry import make_config

PEER_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


class StageModule(torch.nn.Module):
    """A project stage as ``PipelineStage`` runs a module: positional boundary tensors, the
    micro-batch's token ids as a keyword (split with the batch), one tensor out when the
    stage has one (the peer hands a lone tensor to the loss and to the next stage)."""

    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def forward(self, *inputs, input_ids):
        out = self.stage(*inputs, input_ids=input_ids)
        return out[0] if len(out) == 1 else out


def _peer_schedule(schedule: str, cfg, rank: int, stage):
    """The peer's step on ``stage``: ``schedule`` ("gpipe" or "1f1b") of ``torch.distributed.pipelining``."""
    from torch.distributed import pipelining

    from harness.models import lm_loss

    M = cfg.micro_batches
    pstage = pipelining.PipelineStage(StageModule(stage), rank, 2, torch.device("cpu"))
    cls = getattr(pipelining, PEER_SCHEDULES[schedule])
    kw = {"scale_grads": False} if "scale_grads" in inspect.signature(cls.__init__).parameters else {}
    sched = cls(pstage, M, loss_fn=lambda out, y: lm_loss(out, y) / M, **kw)

    def step(ids: torch.Tensor, labels: torch.Tensor) -> None:
        if rank == 0:
            sched.step(ids, input_ids=ids)
        else:
            sched.step(input_ids=ids, target=labels, losses=[])
    return step


def peer(cfg, schedule: str) -> tuple[float, float, str]:
    """``torch.distributed.pipelining`` with ``schedule`` ("gpipe" or "1f1b"): (median step s of
    the slower rank, its CPU s per step, params_sha256 of both stages)."""
    return timed_reference(cfg, functools.partial(_peer_schedule, schedule))


def engine_config(schedule: str, *, model="tiny-opt", batch_size=8, seq_len=64, micro_batches=4, steps=10,
                  seed=0):
    return make_config("pipeline-sgd", model=model, world_size=2, backend="gloo", steps=steps, seed=seed,
                       batch_size=batch_size, seq_len=seq_len, micro_batches=micro_batches,
                       params={"schedule": schedule})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-opt")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cfgs = {s: engine_config(s, model=a.model, batch_size=a.batch_size, seq_len=a.seq_len,
                             micro_batches=a.micro_batches, steps=a.steps) for s in PEER_SCHEDULES}
    print(f"torch {torch.__version__}  load average before: {os.getloadavg()}  cpus: {os.cpu_count()}")
    print(f"{a.model} batch {a.batch_size}x{a.seq_len}, {a.micro_batches} micro-batches, {a.steps} steps, "
          "gloo, 2 ranks")
    ratios: dict[str, list[float]] = {s: [] for s in PEER_SCHEDULES}
    shas = set()
    for _ in range(a.repeats):
        for s, name in PEER_SCHEDULES.items():
            rec = run(cfgs[s])
            eng = rec.metrics["step_time_s"].value
            ref, ref_cpu, sha = peer(cfgs[s], s)
            shas |= {sha, rec.metrics["params_sha256"].value}
            ratios[s].append(eng / ref)
            print(f"  pipeline-sgd[{s}] {1e3 * eng:8.2f} ms   {name} {1e3 * ref:8.2f} ms "
                  f"(cpu {1e3 * ref_cpu:.2f} ms)   ratio {eng / ref:.3f}", flush=True)
    for s, name in PEER_SCHEDULES.items():
        r = ratios[s]
        print(f"pipeline-sgd[{s}] / torch.distributed.pipelining {name}: median {extremes(r)} "
              f"over {a.repeats} interleaved repeats")
    print(f"params_sha256 of every run: {' '.join(sorted(shas))} ({'equal' if len(shas) == 1 else 'DIFFER'})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
