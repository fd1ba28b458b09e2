"""asv suite: zeroth-order family (mezo, sparq) on tiny presets.

Bytes and messages per step are deterministic; seconds and memory are tracked.
"""

from __future__ import annotations

from .common import RunSuite


class ZerothOrder(RunSuite):
    runs = {
        "mezo/w1": ("mezo", dict(world_size=1, backend="threads")),
        "sparq-4bit/w2/gloo": ("sparq", dict(world_size=2, backend="gloo", params={"bits": 4})),
        "sparq-lossless/w2/gloo": ("sparq", dict(world_size=2, backend="gloo", params={"bits": None})),
        "sparq-4bit/w4/threads": ("sparq", dict(world_size=4, backend="threads", params={"bits": 4})),
        # the paper's model shape (random weights), one short step each
        "mezo/opt-125m/w1": ("mezo", dict(world_size=1, backend="threads", model="opt-125m", steps=1,
                                          batch_size=2, seq_len=32)),
        "sparq-4bit/opt-125m/w2/gloo": ("sparq", dict(world_size=2, backend="gloo", model="opt-125m",
                                                      steps=1, batch_size=2, seq_len=32,
                                                      params={"bits": 4})),
    }
    common = dict(model="tiny-opt", data="wiki-en", steps=5, batch_size=8, seq_len=64)
    params = list(runs)
    smallest = ["mezo/w1"]

    def setup_cache(self):
        return self.run_all()


class DistZO2(RunSuite):
    """ZO2 offloading and its distributed modes on small-opt (gloo ranks)."""

    runs = {
        "zo2/w1": ("zo2", dict(world_size=1, backend="threads")),
        "distzo2-pertp/w2": ("distzo2-pertp", dict(world_size=2, backend="gloo")),
        "distzo2-ddp/w2": ("distzo2-ddp", dict(world_size=2, backend="gloo")),
        "distzo2-2d/w4": ("distzo2-2d", dict(world_size=4, backend="gloo")),
    }
    common = dict(model="small-opt", data="wiki-en", steps=4, batch_size=4, seq_len=64)
    params = list(runs)
    smallest = ["zo2/w1"]

    def setup_cache(self):
        return self.run_all()
