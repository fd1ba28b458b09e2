"""The peer pipeline: ``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``) on
the project's stage modules, micro-batches, loss and SGD over 2 gloo ranks updates the
parameters bit for bit as the engine's ``pipeline-sgd`` does, under either schedule.

Bitwise, not close: both run the same per-micro-batch forward, the same loss ``lm_loss / M``
(the peer's ``scale_grads`` is off, as the engine scales the loss, not the summed gradients),
the same ``autograd.backward`` of each micro-batch in order 0, 1, ... into the same ``.grad``,
and the same SGD (``benchmarks/pipelining_ratio.py``)."""

from __future__ import annotations

import pytest

from benchmarks.pipeline_interleaved import CONTESTANTS, WARMUP, measure
from benchmarks.pipelining_ratio import engine_config, peer
from harness.launcher import run
from harness.models import build_stage
from harness.results.fingerprint import params_sha256


@pytest.mark.gloo
@pytest.mark.slow
def test_pipelining_updates_the_parameters_as_pipeline_sgd_does():
    kw = dict(steps=3, seq_len=16, batch_size=8, micro_batches=4, seed=3)
    # the engine's 1F1B reaches GPipe's parameters (checks/test_pipeline_schedules.py)
    engine = run(engine_config("gpipe", **kw)).metrics["params_sha256"].value
    cfg = engine_config("gpipe", **kw)
    start = params_sha256(sorted(
        ((i, t) for r in range(2) for i, _, t in build_stage(cfg.model, seed=cfg.seed, num_stages=2, stage_index=r,
                                                              cut=cfg.params.cut).global_named_parameters()),
        key=lambda p: p[0]))
    assert engine != start  # the steps changed the parameters
    for schedule in ("gpipe", "1f1b"):
        assert peer(engine_config(schedule, **kw), schedule)[2] == engine


@pytest.mark.gloo
@pytest.mark.slow
def test_the_interleaved_benchmarks_contestants_all_reach_the_same_parameters():
    # the step-by-step benchmark times five implementations of one step: a ratio between them
    # compares equal arithmetic only if all five end where the engine does
    # rounds of two steps back to back: the contestants take the launcher's batches in its order
    kw = dict(seq_len=16, batch_size=8, micro_batches=4, seed=3)
    first, later, cpu, threads, shas = measure(engine_config("gpipe", steps=WARMUP + 2, **kw), run=2)
    engine = run(engine_config("gpipe", steps=2 * (WARMUP + 2), **kw)).metrics["params_sha256"].value
    assert set(shas) == set(CONTESTANTS)
    assert set(shas.values()) == {engine}
    assert all(len(first[n]) == len(later[n]) == 2 and len(cpu[n]) == 4
               and set(threads[n]) == {"main", "gloo", "other"} for n in CONTESTANTS)
