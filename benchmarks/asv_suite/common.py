"""Shared machinery of the asv suite.

``RunSuite`` subclasses name a set of runs; ``setup_cache`` executes them
once (so every ``track_*`` of the class reads the same runs) and the
``track_*`` methods return one metric each.

Every benchmark class names ``smallest``: the parameters (a subset of ``params``) that
``checks/test_asv_suite.py`` runs once in CI, calling each ``track_*`` / ``time_*`` directly,
so that a benchmark asv could not record fails there first; a class may name
``smallest_common``, fields of ``common`` the check replaces to keep it cheap.
"""

from __future__ import annotations

import abc


def _run_all(runs: dict, common: dict) -> dict:
    import torch

    from harness.launcher import run
    from harness.registry import make_config

    torch.set_num_threads(1)
    out = {}
    for key, (algo, kw) in runs.items():
        # memory="pass": times without the tensor counter, peak tensor bytes from a memory-only run
        rec = run(make_config(algo, **{"memory": "pass", **common, **kw}))
        out[key] = {k: m.value for k, m in rec.metrics.items()}
    return out


class RunSuite(abc.ABC):
    """Subclasses define ``runs``, ``common``, ``params = list(runs)`` and their
    own one-line ``setup_cache`` (asv keys its cache by where that function is
    defined, so an inherited one would be shared between classes).  The base
    is abstract so that asv, which skips abstract classes, does not collect it
    as a benchmark of every module that imports it."""

    runs: dict = {}
    common: dict = {}
    params: list = []
    param_names = ["run"]
    timeout = 900

    def run_all(self):
        # only the runs in ``params``: the CI check narrows it to ``smallest`` on an instance
        return _run_all({k: v for k, v in self.runs.items() if k in self.params}, self.common)

    @abc.abstractmethod
    def setup_cache(self):
        """``return self.run_all()``, defined in each subclass."""

    def track_payload_bytes_per_step(self, cache, key):
        return cache[key]["payload_bytes_per_step"]

    track_payload_bytes_per_step.unit = "bytes"

    def track_messages_per_step(self, cache, key):
        return cache[key]["messages_per_step"]

    track_messages_per_step.unit = "messages"

    def track_peak_tensor_bytes(self, cache, key):
        return cache[key]["peak_tensor_bytes"]

    track_peak_tensor_bytes.unit = "bytes"

    def track_peak_memory_bytes(self, cache, key):
        return cache[key]["peak_memory_bytes"]

    track_peak_memory_bytes.unit = "bytes"

    def track_peak_memory_growth_bytes(self, cache, key):
        return cache[key]["peak_memory_growth_bytes"]

    track_peak_memory_growth_bytes.unit = "bytes"

    def track_seconds_per_step(self, cache, key):
        return cache[key]["step_time_s"]

    track_seconds_per_step.unit = "seconds"
