"""Double quantisation, exactness: AsyLPG reduces to serial prox-SVRG; the delay
schedule is bounded and deterministic; the simulator equals real ranks
(threads and gloo) forced to the same schedule."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.dataparallel import asylpg, ps
from algorithms.dataparallel.problems import make_problem
from checks._capture import run_capturing
from harness.launcher import run
from harness.registry import ALGORITHMS, get_algorithm, make_config
from harness.results import params_sha256

F64 = torch.float64


def stream(seed, *key):
    """The PS streams' documented seed (harness/seeding.py, ``text=repr``, blake2b, 63 bits),
    re-derived here: 8-byte blake2b of ``repr((seed, *key))``, little-endian, lowest bit dropped."""
    h = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "little") >> 1)


def prox_svrg(prob, lr, m, batch, epochs, seed):
    """Serial prox-SVRG (Reddi et al.), written out independently of the parameter server."""
    xt = prob.init(seed, F64)
    for s in range(epochs):
        g = prob.full_grad(xt)
        x = xt.clone()
        for j in range(m):
            idx = torch.randint(prob.n, (batch,), generator=stream(seed, "batch", s, j))
            u = prob.batch_grad(x, idx) - prob.batch_grad(xt, idx) + g
            x = prob.prox(x - lr * u, lr)
        xt = x
    return xt


def acc_prox_svrg(prob, lr, m, batch, epochs, seed):
    """Serial Acc-prox-SVRG (Algorithm 3 without quantisation, η_s = lr/θ_s)."""
    xt = prob.init(seed, F64)
    y = xt.clone()
    for s in range(epochs):
        theta = 2.0 / (s + 3)
        eta = lr / theta
        g = prob.full_grad(xt)
        x = theta * y + (1 - theta) * xt
        acc = torch.zeros_like(x)
        for j in range(m):
            idx = torch.randint(prob.n, (batch,), generator=stream(seed, "batch", s, j))
            u = prob.batch_grad(x, idx) - prob.batch_grad(xt, idx) + g
            y = prob.prox(y - eta * u, eta)
            x = xt + theta * (y - xt)
            acc += x
        xt = acc / m
    return xt


def _setup(variant, **kw):
    base = dict(lr=0.05, m=12, batch=8, b=32, bx=32, tau=0, workers=1, seed=3)
    return ps.Setup(ps.VARIANTS[variant], **{**base, **kw})


@pytest.mark.parametrize("problem", ["logreg-cancer", "mlp-digits"])
def test_asylpg_full_precision_one_worker_no_delay_is_prox_svrg(problem):
    prob = make_problem(problem, l1=1e-3, l2=1e-3, dtype=F64)
    master = ps.simulate(prob, _setup("asylpg"), 3, F64)
    ref = prox_svrg(prob, 0.05, 12, 8, 3, 3)
    assert torch.equal(master.x, ref)
    assert master.stats.flags == 3 and master.stats.max_delay == 0  # one flag per epoch
    # the code path under test is live: 8-bit quantisation moves the result
    q = ps.simulate(prob, _setup("asylpg", b=8, bx=8), 3, F64)
    assert not torch.equal(q.x, ref)


def test_acc_asylpg_full_precision_is_acc_prox_svrg():
    prob = make_problem("logreg-cancer", l1=1e-3, l2=1e-3, dtype=F64)
    master = ps.simulate(prob, _setup("acc-asylpg"), 3, F64)
    assert torch.equal(master.x, acc_prox_svrg(prob, 0.05, 12, 8, 3, 3))
    fpg = ps.simulate(prob, _setup("acc-asyfpg", b=8, bx=8), 3, F64)  # baseline ignores the bits
    assert torch.equal(master.x, fpg.x)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), s=st.integers(0, 100), j=st.integers(0, 1000))
def test_keyed_streams_are_the_documented_blake2b_seeds(seed, s, j):
    for key in (("batch", s, j), ("g", s, j), ("x", s, j), ("schedule", s)):
        assert ps.keyed_gen(seed, *key).initial_seed() == stream(seed, *key).initial_seed()


@given(m=st.integers(1, 40), workers=st.integers(1, 6), tau=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
def test_schedule_respects_the_delay_bound(m, workers, tau, seed):
    ev = ps.schedule(m, workers, tau, seed, 0)
    assert ev == ps.schedule(m, workers, tau, seed, 0)  # a pure function of the seed
    t, version, holding = 0, {}, set()
    for kind, w, j in ev:
        if kind == "pull":
            assert w not in holding
            holding.add(w)
            version[j] = t
        else:
            assert w in holding
            holding.remove(w)
            assert 0 <= t - version.pop(j) <= tau
            t += 1
    assert t == m and not holding and not version
    assert sum(k == "pull" for k, _, _ in ev) == m
    if tau == 0:
        assert [k for k, _, _ in ev] == ["pull", "push"] * m


def test_some_delays_reach_tau():
    ev = ps.schedule(200, 4, 3, 0, 0)
    prob = make_problem("logreg-cancer", dtype=F64)
    master = ps.simulate(prob, _setup("asylpg", b=8, bx=8, tau=3, workers=4, m=200), 1, F64)
    assert master.stats.max_delay == 3
    assert len({w for _, w, _ in ev}) == 4


def test_simulator_is_deterministic():
    prob = make_problem("logreg-digits", dtype=torch.float32)
    st_ = _setup("sparse-asylpg", b=4, bx=6, tau=2, workers=3, m=20)
    a = ps.simulate(prob, st_, 2, torch.float32)
    b = ps.simulate(prob, st_, 2, torch.float32)
    assert torch.equal(a.x, b.x) and a.stats.trace == b.stats.trace


MODEL = "logreg-cancer"
PARAMS = dict(lr=0.05, m=15, batch=8, b=4, bx=8, tau=2, l1=1e-3, l2=1e-3)


def _sim_sha(variant, workers, dtype):
    from algorithms.dataparallel.asylpg import DQParams

    p = DQParams(**PARAMS)
    prob = make_problem(MODEL, l1=p.l1, l2=p.l2, dtype=dtype)
    master = ps.simulate(prob, p.setup(variant, problem=MODEL, workers=workers, seed=5), 2, dtype)
    return params_sha256([(0, master.x.to(torch.float32))]), master


@pytest.mark.parametrize("variant", ["asylpg", "sparse-asylpg", "acc-asylpg", "qsgd"])
def test_threads_ranks_equal_the_simulator(variant):
    cfg = make_config(variant, world_size=4, backend="threads", steps=2, seed=5, dtype="float64",
                      model=MODEL, params=PARAMS)
    rec = run(cfg)
    sha, master = _sim_sha(variant, 3, F64)
    assert rec.metrics["params_sha256"].value == sha
    assert rec.metrics["final_loss"].value == master.losses[-1]
    # every payload byte the Comm metered is one the master accounted for
    assert rec.metrics["payload_bytes_per_step"].value * 2 == master.stats.bytes_total


@pytest.mark.parametrize("variant, serial, serve", [("asylpg", prox_svrg, "schedule"),
                                                    ("acc-asylpg", acc_prox_svrg, "schedule"),
                                                    ("asylpg", prox_svrg, "arrival")])
def test_rank_program_one_full_precision_worker_is_serial_prox_svrg(variant, serial, serve, monkeypatch):
    # The registered rank functions are built at import, by asylpg._rank_program (before
    # mutation testing picks a mutant); build this one here so that its body is what runs.
    spec = get_algorithm(variant)
    monkeypatch.setitem(ALGORITHMS, variant, dataclasses.replace(spec, entry=asylpg._rank_program(variant)))
    cfg = make_config(variant, world_size=2, backend="threads", steps=3, seed=3, dtype="float64", model=MODEL,
                      params=dict(lr=0.05, m=12, batch=8, b=32, bx=32, tau=0, l1=1e-3, l2=1e-3, serve=serve))
    outs, params = run_capturing(cfg)
    prob = make_problem(MODEL, l1=1e-3, l2=1e-3, dtype=F64)
    assert torch.equal(params[0], serial(prob, 0.05, 12, 8, 3, 3))
    # samples per epoch (module docstring): n for the snapshot gradient + 2 B m for the minibatches
    samples = prob.n + 2 * 8 * 12
    for out in outs:
        assert out.extra["samples_per_step"] == (samples, "samples") and out.tokens_per_step == samples
    assert "max_realised_mu" in outs[0].extra
    if serve == "schedule":
        assert "delay_hist_0" not in outs[0].extra
    else:  # the free-running master reports realised delays (module docstring): one worker never lags,
        # so all 3 epochs x 12 pushes have delay 0 and none breaks the bound tau = 0
        assert outs[0].extra["delay_hist_0"] == (36.0, "pushes") and "delay_hist_1" not in outs[0].extra
        assert outs[0].extra["delay_bound_violations"] == (0.0, "pushes")


@pytest.mark.gloo
def test_gloo_ranks_forced_to_the_schedule_equal_the_simulator():
    cfg = make_config("asylpg", world_size=3, backend="gloo", steps=2, seed=5, dtype="float32",
                      model=MODEL, params=PARAMS)
    rec = run(cfg)
    sha, master = _sim_sha("asylpg", 2, torch.float32)
    assert rec.metrics["params_sha256"].value == sha
    assert rec.metrics["payload_bytes_per_step"].value * 2 == master.stats.bytes_total
    assert rec.metrics["max_delay"].value == master.stats.max_delay == 2
