"""Running experiments: one run-and-save helper for their runs, and
``run_experiments`` behind ``commbench reproduce NAME|all``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness import progress
from harness.reporting import Table, print_table, render, write_table
from harness.results import ResultRecord, atomic_write, write_result

from . import claims as _claims
from .registry import ORDER, Experiment, get_experiment

ALL_BUDGET_S = 15 * 60  # `reproduce all` at the default scale must fit here on a 2-core machine


def run_and_save(cfg, path: Path | None, quiet: bool) -> ResultRecord:
    """Run one configuration (with a progress bar unless ``quiet``) and write its record to ``path``."""
    rec = progress.run(cfg, quiet)
    if path is not None:
        write_result(rec, path)
    return rec


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
    chosen = [get_experiment(n) for n in ORDER] if name == "all" else [get_experiment(name)]
    tables = []
    _claims._CLAIMS.clear()
    start = time.perf_counter()
    for i, exp in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {exp.name}: {exp.summary}", flush=True)
        t0 = time.perf_counter()
        exp_tables = exp.run(scale, out_dir, quiet)
        check_paper_tables(exp, exp_tables)
        _show(exp_tables, quiet)
        written = _write_tables(exp.name, exp_tables, out_dir)
        tables.extend(exp_tables)
        print(f"{exp.name}: {time.perf_counter() - t0:.1f} s; tables in {', '.join(written)}")
    if _claims._CLAIMS:
        summary = _claims.claims_table(list(_claims._CLAIMS))
        _show([summary], quiet)
        written = _write_tables("claims" if name == "all" else f"{name}-claims", [summary], out_dir)
        print(f"claims: {', '.join(written)}")
        tables.append(summary)
    elapsed = time.perf_counter() - start
    if name == "all" and scale == "tiny":
        verdict = "within" if elapsed <= ALL_BUDGET_S else "OVER"
        print(f"all: {elapsed / 60:.1f} min, {verdict} the {ALL_BUDGET_S // 60} min budget of the "
              "default scale", file=sys.stdout if elapsed <= ALL_BUDGET_S else sys.stderr)
    return tables


def _show(tables: list[Table], quiet: bool) -> None:
    for table in tables:
        if quiet:
            print(render(table, "md"))
        else:
            print_table(table)


def _write_tables(name: str, tables: list[Table], out_dir: Path) -> list[str]:
    """All of an experiment's tables in one markdown file; CSV and HTML one file per table."""
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
