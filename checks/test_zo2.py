"""``zo2``: block offloading with a 3-stage schedule and deferred updates equals ``mezo``."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.zo.offload import ScheduleLog, verify_schedule
from algorithms.zo.perturb import step_seeds
from algorithms.zo.zo2 import ZO2Engine, ZO2Params
from harness.config import ConfigError
from harness.data import get_dataset
from harness.launcher import run
from harness.models import PRESETS, build_model
from harness.registry import make_config

COMMON = dict(steps=3, batch_size=4, seq_len=16)


def _sha(algo, model="tiny-opt", dtype="float64", seed=0, **params):
    cfg = make_config(algo, model=model, dtype=dtype, seed=seed, params=dict(dict(lr=1e-2, difference="central"),
                                                                          **params), **COMMON)
    return run(cfg)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(1, 4),
       model=st.sampled_from(["tiny-opt", "tiny-gpt2", "tiny-llama"]),
       difference=st.sampled_from(["central", "forward"]), dtype=st.sampled_from(["float32", "float64"]))
def test_zo2_equals_mezo_exact(seed, budget, model, difference, dtype):
    a = _sha("mezo", model, dtype, seed, difference=difference)
    b = _sha("zo2", model, dtype, seed, difference=difference, budget=budget)
    assert b.metrics["params_sha256"].value == a.metrics["params_sha256"].value
    assert b.metrics["device_blocks_peak"].value == min(budget, 3)


def test_zo2_inplace_equals_mezo_inplace():
    # untied presets: per element the +mu, -2mu, +mu chain is MeZO's, block by block.  float32:
    # in float64 this run's inplace restore happens to be exact, so exact mode would agree too
    a = _sha("mezo", dtype="float32", mode="inplace")
    b = _sha("zo2", dtype="float32", mode="inplace")
    assert b.metrics["params_sha256"].value == a.metrics["params_sha256"].value


def test_zo2_trains_and_moves_bytes_in_closed_form():
    rec = _sha("zo2", dtype="float32")
    pre = PRESETS["tiny-opt"]
    block = sum(p.numel() for p in build_model("tiny-opt", seed=0).model.decoder.layers[0].parameters())
    m = rec.metrics
    assert m["h2d_bytes_per_step"].value == m["d2h_bytes_per_step"].value == pre.num_blocks * block * 4
    assert m["d2d_bytes_per_step"].value == 0 and m["payload_bytes_per_step"].value == 0
    assert rec.metrics["params_sha256"].value != _sha("zo2", dtype="float32", lr=2e-2).metrics["params_sha256"].value


def _engine(budget, steps=2):
    model = build_model("tiny-gpt2", seed=1, dtype=torch.float64).eval()
    log = ScheduleLog()
    eng = ZO2Engine(model, device=torch.device("cpu"), budget=budget, log=log)
    p = ZO2Params(lr=1e-2)
    for t in range(steps):
        ids, labels = get_dataset("wiki-en").batch(t, batch_size=2, seq_len=8, seed=1)
        seeds = step_seeds(1, t, 1)
        out = eng.losses(ids, labels, seeds, p)
        eng.defer(seeds, [float((out[0] - out[1]) / 2e-3)], p.lr)
    return eng


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_schedule_each_block_once_in_order_within_budget(budget):
    eng = _engine(budget)
    with pytest.raises(RuntimeError, match="flush"):
        eng.named_params()  # never read with a pending update
    eng.flush()
    N = len(eng.layers)
    assert eng.log.pass_id == 3  # two forwards and the flush pass
    assert verify_schedule(eng.log, N, budget) == []
    assert eng.log.max_resident == min(budget, 3)
    assert all(p.numel() == 0 for layer in eng.layers for p in layer.parameters())  # all offloaded
    assert len(eng.named_params()) == len(list(eng.model.parameters()))


def test_schedule_checker_catches_violations():
    eng = _engine(3, steps=1)
    ev = eng.log.events
    swapped = ScheduleLog(events=[ev[1], ev[0]] + ev[2:])
    assert verify_schedule(swapped, len(eng.layers), 3)
    dropped = ScheduleLog(events=[e for e in ev if e[1:3] != ("O", 1)])
    assert any("lacks" in p for p in verify_schedule(dropped, len(eng.layers), 3))
    assert any("budget" in p for p in verify_schedule(eng.log, len(eng.layers), 2))


def test_flush_applies_the_last_update():
    eng = _engine(3, steps=1)
    pending_free = ZO2Engine(build_model("tiny-gpt2", seed=1, dtype=torch.float64).eval(),
                             device=torch.device("cpu"))
    eng.flush()
    before = dict(pending_free.named_params())
    after = dict(eng.named_params())
    assert any(not torch.equal(before[i], after[i]) for i in before)


def test_bad_budget_fails_clearly():
    with pytest.raises(ConfigError, match="budget"):
        make_config("zo2", params=dict(budget=0))


@pytest.mark.parametrize("model, mode", [("tiny-opt", "inplace"), ("tiny-llama", "inplace"), ("tiny-gpt2", "exact")])
def test_z_drawn_once_per_use(monkeypatch, model, mode):
    """Counted at perturb.z_for: MeZO's Algorithm 1 draws z four times per parameter per step
    (+eps, -2eps, +eps, update); ZO2 twice (the deferred update's z and the step's z, kept through
    the module's passes), plus the head's second walk over a tied weight."""
    import algorithms.zo.perturb as perturb

    calls = []
    real = perturb.z_for
    monkeypatch.setattr(perturb, "z_for", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    net = build_model(model, seed=1, dtype=torch.float64).eval()
    U = len(list(net.parameters()))  # unique tensors (tied ones once)
    tied = int(net.get_output_embeddings().weight is net.get_input_embeddings().weight)
    p = ZO2Params(lr=1e-2, difference="central", mode=mode)
    ids, labels = get_dataset("wiki-en").batch(0, batch_size=2, seq_len=8, seed=1)

    mezo = perturb.Perturber(list(enumerate(net.parameters())), mode)
    from algorithms.zo.estimator import walk
    with torch.no_grad():
        for _ in walk(mezo, [5], p.mu, p.difference):
            net(ids)
        perturb.zo_update(mezo, [5], [0.5], p.lr)
    emb = [i for i, q in enumerate(net.parameters()) if q is net.get_input_embeddings().weight] * tied
    assert len(calls) == (4 if mode == "inplace" else 3) * U  # Algorithm 1 (exact: restore copies)

    eng = ZO2Engine(build_model(model, seed=1, dtype=torch.float64).eval(), device=torch.device("cpu"))
    per_step = []
    for t in range(3):
        calls.clear()
        seeds = step_seeds(1, t, 1)
        out = eng.losses(ids, labels, seeds, p)
        eng.defer(seeds, [float((out[0] - out[1]) / 2e-3)], p.lr)
        per_step.append(len(calls))
        assert sorted(calls) == sorted(list(range(U)) * (t > 0) + list(range(U)) + emb)
    assert per_step == [U + tied, 2 * U + tied, 2 * U + tied]
    assert eng.z_generations == sum(per_step)


def test_phase_clock_adds_each_spans_elapsed_wall_and_cpu(monkeypatch):
    from algorithms.zo import phases

    wall, cpu = iter([100.0, 100.25, 200.0, 200.5]), iter([7.0, 7.125, 8.0, 8.0625])  # (enter, exit) pairs
    monkeypatch.setattr(phases, "time", SimpleNamespace(perf_counter=lambda: next(wall),
                                                        thread_time=lambda: next(cpu)))
    clock = phases.PhaseClock()
    for _ in range(2):
        with clock("zgen"):
            pass
    walls, cpus = clock.take()
    zero = dict.fromkeys(phases.PHASES, 0.0)
    assert walls == {**zero, "zgen": 0.25 + 0.5} and cpus == {**zero, "zgen": 0.125 + 0.0625}
    assert clock.take() == (zero, zero)  # take starts over


def test_achievable_speedup_is_the_closed_form():
    from algorithms.zo.phases import achievable_speedup

    F, Z, k = 0.3, 0.05, 4  # one evaluation's forward, one z draw, draws per step
    assert achievable_speedup(2 * F, k * Z, 2) == pytest.approx((2 * F + k * Z) / (F + k * Z))
    assert achievable_speedup(1.0, 0.0, 2) == pytest.approx(2.0)  # nothing replicated: the ideal
    assert achievable_speedup(0.0, 1.0, 4) == pytest.approx(1.0)  # nothing split: no gain
    msg = "^need n > 0 and non-negative phase times with a positive sum$"
    with pytest.raises(ValueError, match=msg):
        achievable_speedup(1.0, 0.0, 0)
    with pytest.raises(ValueError, match=msg):  # zero sum: 0/0, no speedup to report
        achievable_speedup(0.0, 0.0, 2)
