"""``commbench reproduce double-quant``: Table 1 of the double-quantisation paper, at this machine's scale.

Left: paper bits (both directions, inner iterations; the per-epoch
full-precision map-reduce is shown apart) until the training loss P(x) first
falls below a threshold, for every algorithm, and the ratio to AsyFPG.
Right: AsyLPG with b_x chosen per pull by enforcing constraint (2) for a
given μ (adaptive mode), bits until loss < 0.5.

Runs use the deterministic simulator (same master/worker code as the rank
programs) so the table is exact and repeatable; one threads-backend run of
AsyLPG checks that the Comm meter counts exactly the bytes the master
accounted for.  Problem: the paper's 784-100-10 MLP shape on sklearn digits
(64-100-10, d = 7510), because real MNIST is not installable offline.
"""

from __future__ import annotations

from collections import Counter
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


def settings(scale: str) -> dict:
    tiny = scale == "tiny"
    return dict(problem="mlp-digits", lr=0.2, batch=20, m=90, b=4, bx=8, tau=4, workers=4, seed=0,
                l1=1e-4, l2=1e-4, threshold=0.2 if tiny else 0.12, max_epochs=10 if tiny else 30,
                mu_threshold=0.5, mu_max_epochs=4, eval_every=10)


def run_one(prob, cfg: dict, variant: str, **over):
    kw = dict(lr=cfg["lr"], m=cfg["m"], batch=cfg["batch"], b=cfg["b"], bx=cfg["bx"], tau=cfg["tau"],
              workers=cfg["workers"], seed=cfg["seed"], eval_every=cfg["eval_every"])
    kw.update(over)
    thr = over.pop("threshold", None) or cfg["threshold"]
    kw.pop("threshold", None)
    epochs = kw.pop("max_epochs", cfg["max_epochs"])
    epoch_s: list[float] = []
    master = ps.simulate(prob, ps.Setup(ps.VARIANTS[variant], **kw), epochs, torch.float32, stop_below=thr,
                         epoch_times=epoch_s)
    return master, thr, median_iqr(epoch_s)


def _crossing(master, thr):
    for upd, inner, total, loss in master.stats.trace:
        if loss < thr:
            return upd, inner, total
    return None


def table1_left(prob, cfg: dict, curves: list[Curve] | None = None) -> Table:
    """The table; each algorithm's loss trace (updates, inner bits) is appended to ``curves``."""
    rows, base, base_total = [], None, None
    for name in ORDER:
        master, thr, secs = run_one(prob, cfg, name)
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
        rows.append(dict(algorithm=name, reached="yes" if hit else "no", updates=upd, bits=inner,
                         bits_total=total, ratio=ratio, ratio_total=ratio_total, loss=master.losses[-1], violations=st.violations,
                         checks=st.checks, max_delay=st.max_delay, epoch_s=secs))
    cols = [Column("algorithm", "algorithm"), Column("reached", f"loss < {cfg['threshold']}"),
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
                      "Paper values are for MNIST 784-100-10 at loss < 0.05 (not comparable in absolute bits).",
              notes=["real data: sklearn digits (1797 × 64), not MNIST; one lr (0.2) for every algorithm, "
                     "not tuned per algorithm; deterministic simulator with seeded delay schedule",
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
                      "precision when none of 2..16 qualifies); b = 4")
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
    how = (f"all traffic (inner + per-epoch full precision) until P(x) < {thr}, digits MLP 64-100-10, "
           f"b_x = {cfg['bx']}, b = {cfg['b']}, batch {cfg['batch']}, one lr ({cfg['lr']}) for all, simulator")

    def reached(name: str) -> bool:
        return rows[name]["reached"] == "yes"

    for words, alg, base in PAIRS:
        paper = PAPER_RATIO[alg] / PAPER_RATIO[base]
        crit = f"{base} bits / {alg} bits > 1, {alg} reaching P(x) < {thr}"
        if not reached(alg):
            claim("double quantisation", f"{words} ({QUOTE})", src, crit, f"{paper:.2f}x",
                  f"{alg} never < {thr} in {epochs} epochs", False, how)
            continue
        ratio = rows[base]["bits_total"] / rows[alg]["bits_total"]
        bound = "" if reached(base) else f" (lower bound: {base} never < {thr} in {epochs} epochs)"
        claim("double quantisation", f"{words} ({QUOTE})", src, crit, f"{paper:.2f}x",
              f"{ratio:.2f}x{bound}", ratio > 1, how)
    # Acc-AsyLPG: the largest ratio of Table 1 (19.13x), i.e. the fewest bits of all six
    crit = f"acc-asylpg needs the fewest bits of all to P(x) < {thr}"
    if not reached("acc-asylpg"):
        claim("double quantisation", f"Acc-AsyLPG needs the fewest bits ({QUOTE})", src, crit,
              "19.13x (largest)", f"never < {thr} in {epochs} epochs", False, how)
        return
    best = rows["acc-asylpg"]["bits_total"]
    others = {n: r["bits_total"] for n, r in rows.items() if n not in ("acc-asylpg", "qsgd") and reached(n)}
    runner_up = min(others.values(), default=None)
    claim("double quantisation", f"Acc-AsyLPG needs the fewest bits ({QUOTE})", src, crit,
          "19.13x vs 8.87x next", f"{rows['asyfpg']['bits_total'] / best:.2f}x"
          + (f" vs {rows['asyfpg']['bits_total'] / runner_up:.2f}x next" if runner_up else ""),
          runner_up is None or best < runner_up, how + "; ratios over AsyFPG's bits")
