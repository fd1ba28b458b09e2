"""Checks that need CUDA (marker ``gpu``): each skips without a GPU.

``bash scripts/gpu-check.sh`` runs them on a GPU (its ``checks`` part).  They cover
what the CPU suite cannot: ZO2's upload / compute / offload on real CUDA streams,
ZO2 = MeZO bit for bit on the GPU, the CUDA memory meter, two pipeline stages
sharing one GPU through the threads backend (both schedules, and the in-flight bound
with payloads on the GPU), and the nccl backend with one rank (nccl with several
ranks needs several GPUs).
"""

import functools
import math

import pytest
import torch

from algorithms.zo.offload import ScheduleLog, verify_schedule
from algorithms.zo.perturb import step_seeds
from algorithms.zo.zo2 import ZO2Engine, ZO2Params
from benchmarks.gpu_check import run_on
from harness.comm import run_threads
from harness.data import get_dataset
from harness.launcher import run
from harness.models import build_model
from harness.registry import make_config

from .test_comm import _exchange

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda", 0) if torch.cuda.is_available() else None
TINY = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=16)


def _sha(rec) -> str:
    return rec.metrics["params_sha256"].value


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_zo2_schedule_on_real_streams(budget):
    model = build_model("tiny-opt", seed=1).eval()
    eng = ZO2Engine(model, device=CUDA, budget=budget, log=ScheduleLog(), trace=True)
    p = ZO2Params(lr=1e-2)
    for t in range(2):
        ids, labels = get_dataset("synthetic-markov").batch(t, batch_size=2, seq_len=8, seed=1)
        seeds = step_seeds(1, t, 1)
        out = eng.losses(ids.to(CUDA), labels.to(CUDA), seeds, p)
        eng.defer(seeds, [float((out[0] - out[1]) / 2e-3)], p.lr)
    eng.flush()
    N = len(eng.layers)
    assert verify_schedule(eng.log, N, budget) == []
    assert eng.log.max_resident == min(budget, 3)
    # on the streams themselves: every block's upload ends before its compute starts and its
    # offload starts after its compute ends (CUDA event times; 1 us of timer slack)
    tl = eng.off.timeline()
    by = {(e["pass"], e["op"], e["block"]): e for e in tl}
    for pid in range(eng.log.pass_id):
        for i in range(N):
            u, c, o = (by[(pid, op, i)] for op in "UCO")
            assert u["end_ms"] <= c["start_ms"] + 1e-3, (pid, i, u, c)
            assert c["end_ms"] <= o["start_ms"] + 1e-3, (pid, i, c, o)
    assert all(p.numel() == 0 for layer in eng.layers for p in layer.parameters())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zo2_equals_mezo_on_the_gpu(dtype):
    params = dict(lr=1e-2, difference="central")
    a = run_on(make_config("mezo", dtype=dtype, params=params, **TINY), CUDA)
    b = run_on(make_config("zo2", dtype=dtype, params=dict(params, budget=3), **TINY), CUDA)
    assert _sha(a) == _sha(b)
    assert "cuda" in b.env["peak_memory_source"]


def test_cuda_memory_meter_reports_max_memory_allocated():
    rec = run_on(make_config("fo-sgd", **TINY), CUDA)
    assert "max_memory_allocated" in rec.env["peak_memory_source"]
    params = sum(p.numel() * 4 for p in build_model("tiny-opt", seed=0).parameters())
    assert rec.metrics["peak_tensor_bytes"].value >= params  # the model lives on the GPU
    assert rec.metrics["peak_memory_bytes"].value >= params


def test_two_stages_share_one_gpu_on_threads():
    for algo in ("sparq", "aq-sgd", "pipeline-sgd"):
        rec = run_on(make_config(algo, world_size=2, **TINY), CUDA)
        assert math.isfinite(rec.metrics["final_loss"].value), algo
        assert rec.metrics["payload_bytes_per_step"].value > 0, algo


def test_both_schedules_on_one_gpu_reach_the_same_parameters_with_the_cpu_s_messages():
    # 1F1B interleaves the two stages' sends and receives differently from GPipe, with both
    # stages' kernels on the one GPU; the arithmetic and every message are the same
    for algo in ("pipeline-sgd", "clapping-fc"):
        recs = {s: run_on(make_config(algo, world_size=2, params={"schedule": s}, **TINY), CUDA)
                for s in ("gpipe", "1f1b")}
        cpu = run(make_config(algo, world_size=2, **TINY))
        assert _sha(recs["gpipe"]) == _sha(recs["1f1b"]), algo
        for m in ("payload_bytes_per_step", "messages_per_step"):
            assert recs["gpipe"].metrics[m].value == recs["1f1b"].metrics[m].value == cpu.metrics[m].value, (algo, m)


def test_the_in_flight_bound_holds_for_gpu_payloads_on_threads():
    # checks/test_comm.py's exchange (both ranks send, then receive; the bound at 2 frames) with
    # payloads on the GPU: 2 frames pass, 3 stop both ranks with the CPU's explanation
    assert run_threads(2, functools.partial(_exchange, 2, device=CUDA), timeout_s=20, device=CUDA) == [True, True]
    told = run_threads(2, functools.partial(_exchange, 3, device=CUDA), timeout_s=1, device=CUDA)
    assert all("timed out after 1 s" in m and "3 frames (348 bytes) were in flight" in m for m in told), told


def test_nccl_with_one_rank_equals_threads_on_the_gpu():
    cfg = make_config("mezo", backend="nccl", params=dict(lr=1e-2), **TINY)
    rec = run(cfg)
    assert _sha(rec) == _sha(run_on(make_config("mezo", params=dict(lr=1e-2), **TINY), CUDA))
