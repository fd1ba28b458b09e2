"""asv suite: compressed pipelines (direct compression, AQ-SGD, Clapping) on
tiny-opt with 3 stages, Top-10 % both ways; the uncompressed pipeline is in
bench_references."""

from __future__ import annotations

from .common import RunSuite


class CompressedPipelines(RunSuite):
    runs = {
        "direct-compress/w3": ("direct-compress", dict()),
        "aq-sgd/w3": ("aq-sgd", dict()),
        "clapping-fc-p0.5/w3": ("clapping-fc", dict(params={"p": 0.5})),
        "clapping-fu-p0.5/w3": ("clapping-fu", dict(params={"p": 0.5})),
        "ef21/w3": ("clapping-fc", dict(params={"p": 1.0})),
        # a larger preset, two gloo stages
        "direct-compress/small-opt/w2/gloo": ("direct-compress", dict(model="small-opt", world_size=2,
                                                                      backend="gloo", steps=4)),
        "clapping-fc-p0.5/small-opt/w2/gloo": ("clapping-fc", dict(model="small-opt", world_size=2,
                                                                   backend="gloo", steps=4,
                                                                   params={"p": 0.5})),
    }
    common = dict(model="tiny-opt", data="wiki-en", steps=10, batch_size=8, seq_len=64,
                  micro_batches=2, world_size=3, backend="threads")
    params = list(runs)
    smallest = ["direct-compress/w3"]

    def setup_cache(self):
        return self.run_all()
