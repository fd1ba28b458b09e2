"""Micro-benchmarks of the harness itself (pytest-benchmark; skipped in the
test run, run with ``pytest benchmarks/micro/test_bench_harness.py --benchmark-only``).

Meter overhead: the same pipeline-sgd step with and without byte metering,
both measured in the same session; compare the two rows of the group.
"""

from __future__ import annotations

import pytest
import torch

from harness.comm import run_threads
from harness.config import RunConfig
from harness.context import RankContext
from harness.registry import get_algorithm, make_config


def _pipeline_steps(metered: bool, steps: int):
    cfg = make_config("pipeline-sgd", world_size=2, model="tiny-opt", data="synthetic-markov",
                      steps=steps, batch_size=8, seq_len=32, micro_batches=4, metered=metered)
    spec = get_algorithm(cfg.algorithm)

    def body(comm):
        return spec.run(RankContext(cfg, comm))

    return lambda: run_threads(2, body, metered=metered)


@pytest.mark.benchmark(group="meter-overhead")
@pytest.mark.parametrize("metered", [True, False], ids=["metered", "unmetered"])
def test_pipeline_sgd_meter_overhead(benchmark, metered):
    torch.set_num_threads(1)
    benchmark.extra_info["metered"] = metered
    benchmark.pedantic(_pipeline_steps(metered, steps=20), rounds=15, warmup_rounds=2)


def test_config_is_typed():
    # keeps the module importable as a test file even with --benchmark-skip
    assert isinstance(make_config("fo-sgd"), RunConfig)
