"""Double quantisation: counted bits and bytes equal the closed forms; the precision
constraint (2)/(7) is checked at every quantised pull and its violations counted;
bad parameters fail with a clear message."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.codecs import make_codec
from algorithms.dataparallel import dq_wire as wire
from algorithms.dataparallel import ps
from algorithms.dataparallel.asylpg import DQParams
from algorithms.dataparallel.problems import make_problem
from harness.config import ConfigError
from harness.registry import make_config

F64 = torch.float64


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 3000), b=st.integers(2, 16))
def test_message_bits_and_bytes_closed_forms(seed, d, b):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g, dtype=F64)
    dense = wire.quantized(x, b, g)
    assert dense.paper_bits == 32 + b * d
    assert dense.nbytes == make_codec(f"qstoch:bits={b}").encoded_nbytes(x) == 23 + math.ceil(b * d / 8)
    sp = wire.sparse_quantized(x, b, 1.0, g)
    w = max(1, math.ceil(math.log2(d)))
    assert sp.paper_bits == 32 + sp.nnz * (w + b)
    # shared codec header (1-D: 23 + 4 bytes, CRCs included), then the (index, code) pairs
    codes = math.ceil(sp.nnz * b / 8)  # after the cheapest positions: index list, bitmap, Elias–Fano
    body = min(math.ceil(sp.nnz * w / 8) + codes, math.ceil(d / 8) + codes, math.ceil(d * b / 8))  # or all d
    low = math.floor(math.log2(d / sp.nnz))  # Elias–Fano: nnz low fields, nnz ones in the upper stream
    body = min(body, math.ceil(sp.nnz * low / 8) + math.ceil((sp.nnz + (d - 1) // 2**low) / 8) + codes)
    assert sp.nbytes == wire.sparse_nbytes(d, sp.nnz, b) == 27 + body
    assert wire.sparse_nnz(sp.data, d) == sp.nnz
    assert 1 <= sp.nnz <= d
    full = wire.full(x)
    assert full.paper_bits == 32 * d and full.nbytes == make_codec("fp64").encoded_nbytes(x)
    assert wire.flag().paper_bits == 1 and wire.flag().nbytes == 1
    # the kinds of the module's table (dq_wire docstring: flag | dense | sparse | full)
    assert (dense.kind, sp.kind, full.kind, wire.flag().kind) == ("dense", "sparse", "full", "flag")
    zero = wire.sparse_quantized(torch.zeros(d, dtype=F64), b, 1.0, g)
    assert zero.paper_bits == 32 and zero.nnz == 0


def _run(variant, epochs=2, **kw):
    base = dict(lr=0.05, m=25, batch=8, b=4, bx=8, tau=3, workers=3, seed=1)
    prob = make_problem("mlp-digits", dtype=torch.float32)
    return prob, ps.simulate(prob, ps.Setup(ps.VARIANTS[variant], **{**base, **kw}), epochs, torch.float32)


def test_run_totals_equal_the_per_message_formulas():
    S, m, W = 2, 25, 3
    prob, M = _run("asylpg")
    d, st_ = prob.d, M.stats
    first = [next(i for i, e in enumerate(ps.schedule(m, W, 3, 1, s)) if e[0] == "push") for s in range(S)]
    assert st_.flags == sum(first) >= S  # pulls before the first update: the workers hold x̃ already
    assert st_.bits_down == st_.flags * 1 + (S * m - st_.flags) * (32 + 8 * d)
    assert st_.bits_up == S * m * (32 + 4 * d)
    assert st_.bits_epoch == S * W * 2 * 32 * d  # snapshot down + partial gradient up, per worker
    _, F = _run("asyfpg")
    assert F.stats.flags == st_.flags
    assert F.stats.bits_down == F.stats.flags + (S * m - F.stats.flags) * 32 * d
    assert F.stats.bits_up == S * m * 32 * d
    _, Q = _run("qsvrg")
    assert Q.stats.checks == 0 and Q.stats.bits_up == st_.bits_up and Q.stats.bits_down == F.stats.bits_down


def test_sparse_run_counts_index_and_value_bits():
    prob, M = _run("sparse-asylpg")
    w = math.ceil(math.log2(prob.d))
    assert M.stats.bits_up == 2 * 25 * 32 + M.stats.nnz * (w + 4)
    assert 0 < M.stats.nnz < 2 * 25 * prob.d  # sparsification ran


def test_constraint_checked_at_every_quantised_pull():
    _, M = _run("asylpg", mu=1e-12)
    assert M.stats.checks == M.stats.pulls - M.stats.flags > 0
    assert M.stats.violations == M.stats.checks  # nothing meets μ = 1e-12 at 8 bits
    # the record's names: a pull violates (2) iff its realised E‖Q(x)−x‖² / ‖x − x̃‖² exceeds μ
    extra = M.stats.extra()
    assert extra["constraint_checks"] == (M.stats.checks, "checks")
    assert extra["constraint_violations"] == (M.stats.checks, "checks")
    assert extra["max_realised_mu"][0] > 1e-12 and extra["max_realised_mu"][1] == "ratio"
    _, M = _run("asylpg", mu=1e12)
    assert M.stats.violations == 0 and M.stats.checks == M.stats.pulls - M.stats.flags
    extra = M.stats.extra()
    assert extra["constraint_violations"] == (0, "checks")
    assert 0 < extra["max_realised_mu"][0] <= 1e12  # 8-bit parameters are lossy, and within μ
    _, A = _run("acc-asylpg", mu=1e-12)
    assert A.stats.checks == A.stats.pulls - A.stats.flags and A.stats.violations == A.stats.checks
    _, F = _run("asyfpg")
    assert F.stats.checks == 0  # full-precision parameters: nothing to check


def test_adaptive_bx_never_violates_and_is_monotone_in_mu():
    _, M = _run("asylpg", mu=0.5, adaptive_bx=True)
    assert M.stats.violations == 0 and sum(M.stats.bx_hist.values()) == M.stats.checks
    g = torch.Generator().manual_seed(0)
    x, xt = torch.randn(500, generator=g, dtype=F64), torch.randn(500, generator=g, dtype=F64)
    dist2 = float((x - xt).pow(2).sum())
    mus = (1e-12, 1e-9, 1e-6, 1e-3, 1e-2, 0.1, 1, 10, 100)
    chosen = [ps.smallest_bits(x, mu * dist2, 16) for mu in mus]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] == wire.FULL and chosen[-1] == 2
    for mu, b in zip(mus, chosen, strict=True):
        if b != wire.FULL:
            assert wire.exact_mse(x, b) <= mu * dist2
        if b not in (2, wire.FULL):
            assert wire.exact_mse(x, b - 1) > mu * dist2  # and it is the smallest such b_x


@pytest.mark.parametrize("kw, text", [
    (dict(b=1), "b (gradient bits) must be 2..16 bits (or 32 = full precision), got 1"),
    (dict(bx=1), "b_x (parameter bits) must be 2..16 bits (or 32 = full precision), got 1"),
    (dict(b=17), "b (gradient bits) must be 2..16 bits (or 32 = full precision), got 17"),
    (dict(bx=31), "b_x (parameter bits) must be 2..16 bits (or 32 = full precision), got 31"),
    (dict(phi=1.5), "phi is a fraction of the largest valid budget ‖α‖₁/‖α‖∞ and must be <= 1, got 1.5"),
    (dict(phi=0.0), "phi must be > 0"),
    (dict(phi=-1.0), "phi must be > 0"),
    (dict(tau=-1), "tau must be >= 0"),
    (dict(workers=0), "at least one worker"),
])
def test_bad_parameters_fail_clearly(kw, text):
    with pytest.raises(ValueError, match=re.escape(text)):
        ps.Setup(ps.VARIANTS["asylpg"], lr=0.1, m=5, **kw)
    if "workers" not in kw:
        with pytest.raises(ValueError, match=re.escape(text)):
            DQParams(**kw)


@pytest.mark.parametrize("b", [2, 16, wire.FULL])
def test_bit_widths_at_the_bounds_are_accepted(b):
    # 2..16 inclusive (the qstoch grid L = 2^(b-1) - 1 >= 1 needs b >= 2, algorithms/codecs/quant.py),
    # or 32 = full precision
    ps.Setup(ps.VARIANTS["asylpg"], lr=0.1, m=5, b=b, bx=b)
    DQParams(b=b, bx=b)


@pytest.mark.parametrize("kw, text", [
    (dict(batch=0), "batch must be >= 1, got 0"),
    (dict(m=-1), "m must be >= 0, got -1"),
    (dict(l1=-1e-3), "l1 and l2 must be >= 0"),
    (dict(l2=-1e-3), "l1 and l2 must be >= 0"),
])
def test_bad_harness_parameters_fail_clearly(kw, text):
    # checked by DQParams itself, before the engine's Setup (whose message is generic)
    with pytest.raises(ValueError, match=re.escape(text)):
        DQParams(**kw)


def test_zero_workers_is_a_config_error():
    with pytest.raises(ConfigError, match="asylpg needs world size >= 2, got 1"):  # a master and a worker
        make_config("asylpg", world_size=1)
    with pytest.raises(ConfigError, match="tau must be >= 0"):
        from harness.config import apply_sets
        apply_sets(make_config("asylpg", world_size=2), {"tau": "-1"})
