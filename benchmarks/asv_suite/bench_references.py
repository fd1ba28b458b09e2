"""asv suite: the first-order references (fo-sgd, pipeline-sgd).

Each class runs its configurations once per commit in ``setup_cache`` (with
the harness's own meters) and exposes the numbers as ``track_*`` benchmarks:
bytes and messages are deterministic; seconds and memory are tracked, never
asserted.  asv treats larger as worse, so time is seconds per step.
"""

from __future__ import annotations

from .common import RunSuite


class FOReferences(RunSuite):
    """fo-sgd and pipeline-sgd on tiny-opt (synthetic data, 10 steps)."""

    runs = {
        "fo-sgd/w1/threads": ("fo-sgd", dict(world_size=1, backend="threads")),
        "pipeline-sgd/w2/threads": ("pipeline-sgd", dict(world_size=2, backend="threads")),
        "pipeline-sgd/w2/gloo": ("pipeline-sgd", dict(world_size=2, backend="gloo")),
        "pipeline-sgd/w4/gloo": ("pipeline-sgd", dict(world_size=4, backend="gloo")),
    }
    common = dict(model="tiny-opt", data="synthetic-markov", steps=10, batch_size=8, seq_len=64,
                  micro_batches=2)
    params = list(runs)
    smallest = ["fo-sgd/w1/threads"]

    def setup_cache(self):
        return self.run_all()
