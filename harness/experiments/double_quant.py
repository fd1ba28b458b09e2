"""``commbench reproduce double-quant``: Table 1 of the double-quantisation paper, at this machine's scale.

Left: paper bits (both directions, inner iterations; the per-epoch
full-precision map-reduce is shown apart) until the training loss P(x) first
falls below a threshold, for every algorithm, and the ratio to AsyFPG.  Each
algorithm runs at its own constant lr, chosen from a small grid by a rule
decided on the training objective (:func:`choose_lr`), as the paper's protocol
does (§6: a constant lr "tuned" per algorithm "to achieve the best result").
Right: AsyLPG with b_x chosen per pull by enforcing constraint (2) for a
given μ (adaptive mode), bits until loss < 0.5.

Runs use the deterministic simulator (same master/worker code as the rank
programs) so the table is exact and repeatable; one threads-backend run of
AsyLPG checks that the Comm meter counts exactly the bytes the master
accounted for.  Problem: the paper's 784-100-10 MLP shape on sklearn digits
(64-100-10, d = 7510), because real MNIST is not installable offline.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from algorithms.dataparallel import ps
from algorithms.dataparallel.problems import make_problem
from harness.launcher import run
from harness.registry import make_config
from harness.reporting import Column, Table, load_reference, with_reference
from harness.reporting.plots import Curve, note, plot_loss_curves
from harness.stats import IQR, median_iqr

from .claims import claim
from .registry import experiment

ORDER = ["asyfpg", "acc-asyfpg", "qsvrg", "asylpg", "sparse-asylpg", "acc-asylpg", "qsgd"]
MUS = [0.005, 0.01, 0.05, 0.1, 0.5, 2.0, 10.0, 50.0, 150.0, 800.0]
# Table 1 (left)'s lr grid: factor-2 steps around 0.2 (the single lr used before tuning), 1.2
# decades.  The paper's own grid (§6) stops at 0.1, too small for this MLP at this epoch budget
# (every algorithm misses the threshold at 0.05); 0.8 is above every algorithm's best, so each
# choice below is bracketed by a worse lr on both sides unless the table says otherwise.
LR_GRID = (0.05, 0.1, 0.2, 0.4, 0.8)


def settings(scale: str) -> dict:
    tiny = scale == "tiny"
    return dict(problem="mlp-digits", lr=0.2, lr_grid=LR_GRID, batch=20, m=90, b=4, bx=8, tau=4, workers=4,
                seed=0, l1=1e-4, l2=1e-4, threshold=0.2 if tiny else 0.12, max_epochs=10 if tiny else 30,
                mu_threshold=0.5, mu_max_epochs=4, eval_every=10)


RULE = ("each algorithm's lr is the grid value whose run first reaches P(x) < {thr} (training objective, "
        "evaluated every {every} master updates and at epoch ends) after the fewest master updates; ties: "
        "fewest bits (all traffic), then the smaller lr; an lr is excluded as diverged when P(x) is "
        "non-finite or above P(x⁰) before that; when no lr reaches the threshold in {epochs} epochs, the "
        "lowest last P(x) is shown and the algorithm counts as not reaching it")


@dataclass(frozen=True)
class Trial:
    """One grid point's run as the selection rule sees it."""

    lr: float
    updates: int | None  # master updates at the first evaluation with P(x) < threshold; None: not within the run
    bits_total: int  # all traffic (inner + epoch map-reduce) at that evaluation, at the run's end if none
    last_loss: float  # P(x) at the run's last evaluation
    diverged: bool  # P(x) non-finite or above P(x⁰) at an evaluation up to the crossing
    run_updates: int  # master updates the run made (it stops at the end of the crossing's epoch or a cut)

    def __post_init__(self):
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"a trial's lr must be a positive number, got {self.lr!r}")
        if self.updates is not None and not 0 < self.updates <= self.run_updates:
            raise ValueError(f"a crossing at update {self.updates} is outside the run's {self.run_updates} updates")
        if self.bits_total < 0 or self.run_updates < 0:
            raise ValueError("bits and updates must be >= 0")

    def summary(self) -> str:
        """``0.2: 460`` (reached after 460 updates), ``0.1: >460`` (not within the 460 it ran), ``diverged``."""
        got = "diverged" if self.diverged else (f"{self.updates}" if self.updates is not None
                                                 else f">{self.run_updates}")
        return f"{self.lr:g}: {got}"


def check_grid(grid: Sequence[float]) -> tuple[float, ...]:
    grid = tuple(grid)
    if not grid:
        raise ValueError("the lr grid is empty")
    if any(not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)) for lr in grid):
        raise ValueError(f"every lr of the grid must be a positive number, got {grid}")
    if len(set(grid)) != len(grid):
        raise ValueError(f"the lr grid repeats a value: {grid}")
    return grid


def choose_lr(trials: Sequence[Trial]) -> Trial:
    """The selection rule (:data:`RULE`): among the trials that did not diverge, the fewest master
    updates to the threshold, then the fewest bits, then the smaller lr; if none reached the
    threshold, the lowest last loss (among all trials when every one diverged)."""
    if not trials:
        raise ValueError("no trials to choose an lr from")
    kept = [t for t in trials if not t.diverged]
    reached = [t for t in kept if t.updates is not None]
    if reached:
        return min(reached, key=lambda t: (t.updates, t.bits_total, t.lr))

    def last(t: Trial) -> float:
        return t.last_loss if math.isfinite(t.last_loss) else math.inf

    return min(kept or trials, key=lambda t: (last(t), t.lr))


def run_one(prob, cfg: dict, variant: str, **over):
    kw = dict(lr=cfg["lr"], m=cfg["m"], batch=cfg["batch"], b=cfg["b"], bx=cfg["bx"], tau=cfg["tau"],
              workers=cfg["workers"], seed=cfg["seed"], eval_every=cfg["eval_every"])
    kw.update(over)
    thr = over.pop("threshold", None) or cfg["threshold"]
    kw.pop("threshold", None)
    epochs = kw.pop("max_epochs", cfg["max_epochs"])
    stop_above = kw.pop("stop_above", None)
    epoch_s: list[float] = []
    master = ps.simulate(prob, ps.Setup(ps.VARIANTS[variant], **kw), epochs, torch.float32, stop_below=thr,
                         stop_above=stop_above, epoch_times=epoch_s)
    return master, thr, median_iqr(epoch_s)


def _crossing(master, thr):
    for upd, inner, total, loss in master.stats.trace:
        if loss < thr:
            return upd, inner, total
    return None


def _trial(master, thr: float, lr: float, p0: float) -> Trial:
    hit = _crossing(master, thr)
    st = master.stats
    seen = [loss for upd, _, _, loss in st.trace if hit is None or upd <= hit[0]]
    return Trial(lr=lr, updates=hit[0] if hit else None,
                 bits_total=hit[2] if hit else st.bits_inner + st.bits_epoch,
                 last_loss=master.losses[-1] if master.losses else math.nan,
                 diverged=any(not math.isfinite(x) or x > p0 for x in seen), run_updates=master.updates)


def tune(prob, cfg: dict, variant: str, p0: float, cut: bool = True):
    """Run ``variant`` at every lr of the grid; returns (chosen trial, its master, its s/epoch, all trials).

    With ``cut`` (the default; ``False`` runs every lr to the end, for the check that the cuts
    change nothing), a run stops at the end of the epoch in which P(x) first exceeds P(x⁰) or is
    not finite (it is excluded as diverged whatever follows), and once some lr has reached the
    threshold after U updates, later runs stop after the epoch that holds update U: a run that
    has not crossed by then cannot win (fewer updates wins, and the tie at U is still seen).  The
    grid is run outwards from ``cfg["lr"]`` so that a good lr usually sets the cut early."""
    grid = check_grid(cfg["lr_grid"])
    order = sorted(grid, key=lambda lr: (abs(math.log(lr / cfg["lr"])), -lr))
    cap, runs = cfg["max_epochs"], {}
    for lr in order:
        master, thr, secs = run_one(prob, cfg, variant, lr=lr, max_epochs=cap, stop_above=p0 if cut else None)
        trial = _trial(master, thr, lr, p0)
        runs[lr] = (trial, master, secs)
        if cut and trial.updates is not None and not trial.diverged:
            cap = min(cap, -(-trial.updates // cfg["m"]))  # epochs holding update U (ceil)
    trials = [runs[lr][0] for lr in sorted(grid)]
    best = choose_lr(trials)
    _, master, secs = runs[best.lr]
    return best, master, secs, trials


def table1_left(prob, cfg: dict, curves: list[Curve] | None = None) -> Table:
    """The table, one row per algorithm at its chosen lr (:func:`tune`); each chosen run's loss
    trace (updates, inner bits) is appended to ``curves``."""
    rows, base, base_total = [], None, None
    thr = cfg["threshold"]
    p0 = prob.objective(prob.init(cfg["seed"], torch.float32))
    for name in ORDER:
        chosen, master, secs, trials = tune(prob, cfg, name, p0)
        if curves is not None:
            trace = master.stats.trace
            curves.append(Curve(name, [t[3] for t in trace], steps=[t[0] for t in trace],
                                bits=[t[1] for t in trace]))
        hit = _crossing(master, thr)
        st = master.stats
        upd, inner, total = hit if hit else (master.updates, st.bits_inner, st.bits_inner + st.bits_epoch)
        base, base_total = (inner, total) if name == "asyfpg" else (base, base_total)
        ratio = base / inner if hit and base else None
        ratio_total = base_total / total if hit and base_total else None
        rows.append(dict(algorithm=name, lr=chosen.lr, grid="; ".join(t.summary() for t in trials),
                         edge="yes" if hit and chosen.lr in (min(cfg["lr_grid"]), max(cfg["lr_grid"])) else "",
                         reached="yes" if hit else "no", updates=upd, bits=inner,
                         bits_total=total, ratio=ratio, ratio_total=ratio_total, loss=master.losses[-1], violations=st.violations,
                         checks=st.checks, max_delay=st.max_delay, epoch_s=secs))
    grid = ", ".join(f"{lr:g}" for lr in cfg["lr_grid"])
    cols = [Column("algorithm", "algorithm"), Column("lr", "lr (chosen)", fmt="g"),
            Column("grid", f"updates to P(x) < {thr} per lr"), Column("edge", "chosen lr at the grid's edge"),
            Column("reached", f"loss < {cfg['threshold']}"),
            Column("updates", "master updates"),
            Column("bits", "paper bits (inner)", "bits", False, "si"),
            Column("bits_total", "+ epoch map-reduce", "bits", False, "si"),
            Column("ratio", "AsyFPG / algorithm", "x", True, ".2f"),
            Column("ratio_total", "AsyFPG / algorithm (all traffic)", "x", True, ".2f"),
            Column("loss", "last loss"), Column("violations", "(2) violations"),
            Column("checks", "(2) checks"), Column("max_delay", "max delay"),
            Column("epoch_s", "s / epoch", "s", False, spread=f"{IQR} of the epochs run")]
    t = Table(title=f"double-quant Table 1 (left): bits until P(x) < {cfg['threshold']}, "
                    f"MLP 64-100-10 on sklearn digits, b_x={cfg['bx']}, b={cfg['b']}, "
                    f"W={cfg['workers']}, tau={cfg['tau']}",
              columns=cols, rows=rows,
              caption="paper bits: 32 + b·d per quantised message, 32d full precision, 1 per flag, "
                      "32 + nnz(⌈log₂d⌉ + b) sparse; ratio over inner-iteration bits (both directions), the paper's accounting; 'all traffic' adds every "
                      "epoch's full-precision snapshot and gradient map-reduce, and is what the claims use. "
                      "Paper values are for MNIST 784-100-10 at loss < 0.05 (not comparable in absolute bits). "
                      f"lr grid {{{grid}}} (one run per grid point, deterministic); threshold P(x) < {thr}; "
                      + RULE.format(thr=thr, every=cfg["eval_every"], epochs=cfg["max_epochs"])
                      + ". 'N' per lr: updates at the first P(x) < threshold; '>N': not within the N updates "
                      "run (a run stops once it cannot beat the best so far). Acc variants: lr is the step on "
                      "x, η_s = lr/θ_s (paper §6).",
              notes=["real data: sklearn digits (1797 × 64), not MNIST; lr tuned per algorithm on the grid "
                     "above, as the paper's protocol allows (§6), the paper's grid itself stops at 0.1; "
                     "deterministic simulator with seeded delay schedule",
                     "(2) is checked at every quantised pull with the exact closed-form variance; "
                     "violations at fixed b_x are expected right after each epoch start (paper Fig. 2)"])
    return with_reference(t, load_reference("double-quant"), key="algorithm", table_name="table1-left")


def table1_right(prob, cfg: dict) -> Table:
    rows = []
    for mu in MUS:
        master, thr, secs = run_one(prob, cfg, "asylpg", mu=mu, adaptive_bx=True,
                                    threshold=cfg["mu_threshold"], max_epochs=cfg["mu_max_epochs"])
        hit = _crossing(master, thr)
        hist: Counter = master.stats.bx_hist
        mode = hist.most_common(1)[0][0] if hist else None
        rows.append(dict(mu=f"{mu:g}", bx=mode, hist=" ".join(f"{b}:{n}" for b, n in sorted(hist.items())),
                         bits=hit[1] if hit else None, updates=hit[0] if hit else None,
                         violations=master.stats.violations))
    cols = [Column("mu", "mu"), Column("bx", "b_x (most chosen)", "bits"), Column("hist", "b_x histogram"),
            Column("bits", "paper bits (inner)", "bits", False, "si"), Column("updates", "master updates"),
            Column("violations", "(2) violations")]
    t = Table(title=f"double-quant Table 1 (right): AsyLPG, b_x from constraint (2), bits until P(x) < "
                    f"{cfg['mu_threshold']}", columns=cols, rows=rows,
              caption="adaptive b_x: the fewest bits whose exact E‖Q(x)−x‖² ≤ μ‖x − x̃‖² (32 = full "
                      f"precision when none of 2..16 qualifies); b = 4; one lr ({cfg['lr']:g}) for every μ, "
                      "not tuned: the comparison is across μ")
    return with_reference(t, load_reference("double-quant"), key="mu", table_name="table1-right")


def meter_check(cfg: dict) -> list[str]:
    """One real run over the threads Comm: metered payload bytes = the master's accounted bytes."""
    params = dict(lr=0.1, m=30, batch=20, b=cfg["b"], bx=cfg["bx"], tau=2)
    rec = run(make_config("asylpg", world_size=3, backend="threads", steps=2, seed=0,
                          model="logreg-digits", params=params))
    metered = rec.metrics["payload_bytes_per_step"].value * 2
    accounted = rec.metrics["payload_bytes_total"].value
    return [f"meter check (asylpg, threads, 1 master + 2 workers, 2 epochs): Comm-metered payload "
            f"{metered:.0f} B, master-accounted {accounted:.0f} B ({'equal' if metered == accounted else 'DIFFER'})"]


@experiment("double-quant", "AsyLPG / Sparse-AsyLPG / Acc-AsyLPG vs AsyFPG, Acc-AsyFPG, QSVRG, QSGD: "
            "bits to a loss threshold (Table 1) and the mu / b_x study")
def double_quant(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    cfg = settings(scale)
    prob = make_problem(cfg["problem"], l1=cfg["l1"], l2=cfg["l2"], dtype=torch.float32)
    curves: list[Curve] = []
    left = table1_left(prob, cfg, curves)
    left.notes.extend(meter_check(cfg))
    left.notes.append(_plot(curves, cfg, out_dir))
    _claims(left, cfg)
    return [left, table1_right(prob, cfg)]


def _plot(curves: list[Curve], cfg: dict, out_dir: Path) -> str:
    # No wall-clock panel: the simulator runs master and workers in one process, so its
    # clock holds no communication; the paper plots loss against bits anyway.
    png = plot_loss_curves(curves, out_dir / "double-quant-loss.png",
                           f"double-quant: training loss P(x) until < {cfg['threshold']} (dashed), "
                           f"digits MLP, simulator", hline=cfg["threshold"], step_label="master updates",
                           bits_label="paper bits, inner iterations, both directions (cumulative)",
                           smooth=False)  # P(x) is the exact objective, not a noisy batch loss
    return note(png)


PAPER_RATIO = {"asyfpg": 1.0, "acc-asyfpg": 3.52, "qsvrg": 5.38, "asylpg": 7.28, "sparse-asylpg": 8.87,
               "acc-asylpg": 19.13}  # Table 1 (left): AsyFPG bits / algorithm bits, MNIST, loss < 0.05
# (claim words, fewer-bits algorithm, baseline): §6.2 "our new low-precision algorithms can
# significantly reduce communication overhead compared to their full-precision counterparts and QSVRG",
# and the ordering Table 1 shows among the low-precision ones
PAIRS = (("AsyLPG needs fewer bits than its full-precision counterpart", "asylpg", "asyfpg"),
         ("Acc-AsyLPG needs fewer bits than its full-precision counterpart", "acc-asylpg", "acc-asyfpg"),
         ("AsyLPG needs fewer bits than QSVRG", "asylpg", "qsvrg"),
         ("Sparse-AsyLPG needs fewer bits than AsyLPG", "sparse-asylpg", "asylpg"))
QUOTE = "\"our new low-precision algorithms can significantly reduce communication overhead\""


def _claims(left: Table, cfg: dict) -> None:
    """Table 1 (left): bits until the loss first falls below the threshold, all traffic counted
    (inner iterations both ways and every epoch's full-precision snapshot and gradient map-reduce).
    An algorithm that never reaches the threshold needs more bits than any that does."""
    rows = {row["algorithm"]: row for row in left.row_dicts()}
    thr, epochs = cfg["threshold"], cfg["max_epochs"]
    src = "Table 1 (left), MNIST 784-100-10, loss < 0.05"
    lrs = ", ".join(f"{n} {r['lr']:g}" for n, r in rows.items())
    how = (f"all traffic (inner + per-epoch full precision) until P(x) < {thr}, digits MLP 64-100-10, "
           f"b_x = {cfg['bx']}, b = {cfg['b']}, batch {cfg['batch']}, lr per algorithm from the grid "
           f"{{{', '.join(f'{lr:g}' for lr in cfg['lr_grid'])}}}, fewest updates to P(x) < {thr} "
           f"(chosen: {lrs}), simulator")
    never = f"in {epochs} epochs at any lr of the grid"

    def reached(name: str) -> bool:
        return rows[name]["reached"] == "yes"

    for words, alg, base in PAIRS:
        paper = PAPER_RATIO[alg] / PAPER_RATIO[base]
        crit = f"{base} bits / {alg} bits > 1, {alg} reaching P(x) < {thr}"
        if not reached(alg):
            claim(f"double-quant.{alg}-vs-{base}", "double quantisation", f"{words} ({QUOTE})", src, crit, f"{paper:.2f}x",
                  f"{alg} never < {thr} {never}", False, how)
            continue
        ratio = rows[base]["bits_total"] / rows[alg]["bits_total"]
        bound = "" if reached(base) else f" (lower bound: {base} never < {thr} {never})"
        claim(f"double-quant.{alg}-vs-{base}", "double quantisation", f"{words} ({QUOTE})", src, crit, f"{paper:.2f}x",
              f"{ratio:.2f}x{bound}", ratio > 1, how)
    # Acc-AsyLPG: the largest ratio of Table 1 (19.13x), i.e. the fewest bits of all six
    crit = f"acc-asylpg needs the fewest bits of all to P(x) < {thr}"
    if not reached("acc-asylpg"):
        claim("double-quant.acc-asylpg-fewest", "double quantisation", f"Acc-AsyLPG needs the fewest bits ({QUOTE})", src, crit,
              "19.13x (largest)", f"never < {thr} {never}", False, how)
        return
    best = rows["acc-asylpg"]["bits_total"]
    others = {n: r["bits_total"] for n, r in rows.items() if n not in ("acc-asylpg", "qsgd") and reached(n)}
    runner_up = min(others.values(), default=None)
    claim("double-quant.acc-asylpg-fewest", "double quantisation", f"Acc-AsyLPG needs the fewest bits ({QUOTE})", src, crit,
          "19.13x vs 8.87x next", f"{rows['asyfpg']['bits_total'] / best:.2f}x"
          + (f" vs {rows['asyfpg']['bits_total'] / runner_up:.2f}x next" if runner_up else ""),
          runner_up is None or best < runner_up, how + "; ratios over AsyFPG's bits")
