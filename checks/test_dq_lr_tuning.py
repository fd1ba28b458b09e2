"""double-quant Table 1 (left): each algorithm's lr is chosen from a grid by the rule the caption
states (fewest master updates to the training-loss threshold, ties by bits, diverged lrs excluded),
the chosen lr is a column of the table, the run-time cuts do not change the choice, and the bits
still count all traffic, the per-epoch full-precision snapshot and gradient included."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.dataparallel import ps
from algorithms.dataparallel.problems import make_problem
from harness.experiments import double_quant as dq
from harness.experiments.claims import _CLAIMS, NOT_MEASURABLE, NOT_SUPPORTED
from harness.stats import median_iqr


def T(lr, updates, bits, last=0.1, diverged=False, run=1000):
    return dq.Trial(lr=lr, updates=updates, bits_total=bits, last_loss=last, diverged=diverged, run_updates=run)


# ---------------------------------------------------------------------------- the rule on fake trials
def test_fewest_updates_wins_even_with_more_bits():
    trials = [T(0.1, 300, 9_000), T(0.2, 200, 10_000), T(0.4, None, 1_000)]
    assert dq.choose_lr(trials).lr == 0.2


def test_ties_on_updates_go_to_fewest_bits_then_the_smaller_lr():
    assert dq.choose_lr([T(0.2, 200, 10_000), T(0.4, 200, 5_000), T(0.1, 300, 1)]).lr == 0.4
    assert dq.choose_lr([T(0.4, 200, 5_000), T(0.2, 200, 5_000)]).lr == 0.2


def test_a_diverged_lr_is_excluded():
    # fewest updates and fewest bits, but diverged before the crossing: not chosen
    assert dq.choose_lr([T(0.8, 100, 1, diverged=True), T(0.2, 400, 10_000)]).lr == 0.2
    # nothing reached: the lowest last loss among those that did not diverge
    none = [T(0.05, None, 5, last=0.3), T(0.1, None, 5, last=0.25), T(0.8, None, 5, last=0.01, diverged=True)]
    got = dq.choose_lr(none)
    assert got.lr == 0.1 and got.updates is None
    # every lr diverged: the lowest finite last loss, a NaN never chosen over a number
    assert dq.choose_lr([T(0.4, None, 5, last=math.nan, diverged=True),
                         T(0.8, None, 5, last=3.0, diverged=True)]).lr == 0.8


def test_bad_trials_and_grids_fail_clearly():
    with pytest.raises(ValueError, match="no trials"):
        dq.choose_lr([])
    with pytest.raises(ValueError, match="positive"):
        T(0.0, None, 1)
    with pytest.raises(ValueError, match="outside the run"):
        T(0.1, 2000, 1, run=1000)
    for grid, text in (((), "empty"), ((0.1, -0.2), "positive"), ((0.1, 0.1), "repeats")):
        with pytest.raises(ValueError, match=text):
            dq.check_grid(grid)


trial_lists = st.lists(
    st.builds(T, lr=st.sampled_from(dq.LR_GRID), updates=st.one_of(st.none(), st.integers(1, 900)),
              bits=st.integers(0, 10**9), last=st.floats(0, 5), diverged=st.booleans()),
    min_size=1, max_size=8)


@given(trials=trial_lists)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_choice_satisfies_the_stated_rule(trials):
    got = dq.choose_lr(trials)
    assert got in trials
    kept = [t for t in trials if not t.diverged]
    if kept:
        assert not got.diverged
    reached = [t for t in kept if t.updates is not None]
    if reached:
        assert got.updates is not None
        for t in reached:  # no kept trial reaches in fewer updates, or as few with fewer bits
            assert (got.updates, got.bits_total) <= (t.updates, t.bits_total)
    else:
        assert all(got.last_loss <= t.last_loss for t in kept)


# ---------------------------------------------------------------------------- the table records the choice
M = 90  # updates per epoch (settings)


def fake_master(crossing: int | None, diverge: bool, epochs: int, thr: float, stop_above):
    """Evaluations at epoch ends: above the threshold until update ``crossing``, then below; or
    above P(x⁰) from the first epoch (``diverge``).  Bits grow 1000 inner and 640 epoch per epoch."""
    trace = []
    for k in range(1, epochs + 1):
        upd = k * M
        loss = 9.0 if diverge else (thr - 0.01 if crossing is not None and upd >= crossing else thr + 0.1)
        trace.append((upd, 1000 * k, 1640 * k, loss))
        if loss < thr or (stop_above is not None and not loss <= stop_above):
            break
    stats = SimpleNamespace(trace=trace, bits_inner=trace[-1][1], bits_epoch=trace[-1][2] - trace[-1][1],
                            violations=0, checks=0, max_delay=0, nnz=0)
    return SimpleNamespace(stats=stats, updates=trace[-1][0], losses=[t[3] for t in trace], s=len(trace) - 1)


# per algorithm: lr -> epochs to the crossing (None: never; "div": diverges)
PLAN = {
    "asyfpg": {0.05: None, 0.1: 7, 0.2: 5, 0.4: 6, 0.8: "div"},
    "acc-asyfpg": {0.05: 3, 0.1: 4, 0.2: 4, 0.4: None, 0.8: None},  # chosen below the paper grid's top
    "qsvrg": {0.05: None, 0.1: None, 0.2: 6, 0.4: 4, 0.8: "div"},  # reaches only on the extended lrs
    "asylpg": {0.05: None, 0.1: None, 0.2: None, 0.4: None, 0.8: 2},
    "sparse-asylpg": {0.05: None, 0.1: None, 0.2: None, 0.4: "div", 0.8: "div"},  # never, at any lr
    "acc-asylpg": {0.05: None, 0.1: 2, 0.2: 2, 0.4: 3, 0.8: "div"},  # tie at 2 epochs: 0.1 (same bits, smaller lr)
    "qsgd": {0.05: 9, 0.1: 8, 0.2: 8, 0.4: 8, 0.8: 8},
}
# (paper-grid choice, choice with the extended lrs)
CHOSEN = {"asyfpg": (0.1, 0.2), "acc-asyfpg": (0.05, 0.05), "qsvrg": (0.05, 0.4), "asylpg": (0.05, 0.05),
          "sparse-asylpg": (0.05, 0.05), "acc-asylpg": (0.1, 0.1), "qsgd": (0.1, 0.1)}


def test_table_rows_carry_the_chosen_lr_and_claims_count_never_as_not_supported(monkeypatch):
    cfg = {**dq.settings("tiny"), "lr_grid": (0.1, 0.05), "extended_grid": (0.2, 0.4, 0.8), "threshold": 0.2,
           "max_epochs": 10}
    calls = []

    def run_one(prob, cfg_, variant, **over):
        plan = PLAN[variant][over["lr"]]
        calls.append((variant, over["lr"], over["max_epochs"]))
        crossing = plan * M if isinstance(plan, int) else None
        return fake_master(crossing, plan == "div", over["max_epochs"], cfg_["threshold"],
                           over.get("stop_above")), cfg_["threshold"], median_iqr([0.1])

    monkeypatch.setattr(dq, "run_one", run_one)
    prob = SimpleNamespace(init=lambda seed, dtype: None, objective=lambda x: 2.5, d=7510)
    reaches: dict = {}
    table = dq.table1_left(prob, cfg, reaches=reaches)
    rows = {r["algorithm"]: r for r in table.row_dicts()}
    for name, (lr, ext) in CHOSEN.items():
        assert rows[name]["lr"] == lr and rows[name]["ext_lr"] == ext, name
        assert (rows[name]["reached"] == "yes") == isinstance(PLAN[name][lr], int), name
    assert rows["acc-asyfpg"]["edge"] == "" and rows["asyfpg"]["edge"] == "yes"
    # the paper grid walks down from 0.1 and stops at the first lr that is not the choice; the
    # extended lrs walk up, cut at the best crossing so far (0.4 would reach at 540, cut at 450)
    assert rows["asyfpg"]["grid"] == "0.8: not run; 0.4: >450; 0.2: 450; 0.1: 630; 0.05: >630"
    assert [e for v, lr, e in calls if v == "asyfpg"] == [10, 7, 7, 5]
    assert rows["acc-asylpg"]["grid"].startswith("0.8: not run; 0.4: not run; 0.2: 180; 0.1: 180")
    # qsvrg reaches only beyond the paper's grid: the extended choice is kept apart
    assert reaches["paper"]["qsvrg"].updates is None and reaches["extended"]["qsvrg"].updates == 4 * M
    # the caption states the grid, the rule and the threshold with its value
    assert "Paper lr grid {0.1, 0.05}" in table.caption and "fewest master updates" in table.caption
    assert f"threshold P(x) < {cfg['threshold']}" in table.caption
    # claims: sparse-asylpg reaches at no lr; asylpg neither: the pair is not measurable, not refuted
    _CLAIMS.clear()
    try:
        dq._claims(reaches, cfg)
        got = {c.id: c for c in _CLAIMS}
        assert got["double-quant.sparse-asylpg-vs-asylpg"].outcome == NOT_MEASURABLE
        # asylpg never reaches, asyfpg does: not supported
        assert got["double-quant.asylpg-vs-asyfpg"].outcome == NOT_SUPPORTED
        assert all("lr per algorithm from the paper's grid" in c.how for c in _CLAIMS)
    finally:
        _CLAIMS.clear()


# ---------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def prob():
    return make_problem("mlp-digits", l1=1e-4, l2=1e-4, dtype=torch.float32)


def small(seed: int) -> dict:
    return {**dq.settings("tiny"), "m": 30, "max_epochs": 3, "threshold": 1.2, "seed": seed,
            "lr_grid": (0.05, 0.2, 0.8, 3.2), "extended_grid": ()}


@given(seed=st.integers(0, 2**31 - 1))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_cuts_do_not_change_the_choice(prob, seed):
    cfg = small(seed)
    p0 = prob.objective(prob.init(seed, torch.float32))
    cut = dq.tune(prob, cfg, "asylpg", p0)
    full = dq.tune(prob, cfg, "asylpg", p0, cut=False)
    a, b = cut.chosen()[0], full.chosen()[0]
    assert (a.lr, a.updates, a.bits_total) == (b.lr, b.updates, b.bits_total)
    # the cut ran: no run went further than in full, and together they ran fewer updates
    assert all(cut.runs[lr][0].run_updates <= full.runs[lr][0].run_updates for lr in cut.runs)
    assert sum(r[0].run_updates for r in cut.runs.values()) < sum(r[0].run_updates for r in full.runs.values())


def test_table_bits_count_every_epochs_full_precision_snapshot_and_gradient(prob):
    cfg = small(0)
    table = dq.table1_left(prob, cfg)
    d, W = prob.d, cfg["workers"]
    for r in table.row_dicts():
        assert r["reached"] == "yes", r["algorithm"]  # the threshold is loose: every algorithm crosses
        epochs = -(-r["updates"] // cfg["m"])  # epochs begun by the crossing
        svrg = ps.VARIANTS[r["algorithm"]].svrg
        # x̃ down and the partial ∇f(x̃) up, 32 bits a coordinate, for every worker and epoch begun
        assert r["bits_total"] - r["bits"] == (2 * 32 * d * W * epochs if svrg else 0), r["algorithm"]
        assert r["lr"] in cfg["lr_grid"]
