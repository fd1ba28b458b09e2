"""Running experiments: one run-and-save helper for their runs, and
``run_experiments`` behind ``commbench reproduce NAME|all``."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from harness import progress
from harness.reporting import Table, print_table, render, write_table
from harness.results import ResultRecord, atomic_write, write_result
from harness.results.files import INCOMPLETE

from . import claims as _claims
from .registry import ORDER, Experiment, get_experiment

ALL_BUDGET_S = 15 * 60  # `reproduce all` at the default scale must fit here on a 2-core machine
# Rough seconds per experiment at the default scale on a loaded 2-core machine: only the
# weights of the overall progress bar; its ETA follows the pace actually measured.
EXPECTED_S = {"double-quant": 130, "clapping": 120, "protocol": 150, "sparq": 100, "distzo2": 60,
              "bandwidth": 120, "sparq-opt125m": 600}


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


def timed_columns_without_spread(table: Table) -> list[str]:
    """Headers of the columns of ``table`` that show a measured time (seconds, a rate per second)
    with no interval; the paper's numbers, which come without one, are exempt."""
    return [c.header for c in table.columns
            if c.is_time and c.spread is None and "paper" not in (c.key + c.header).lower()]


def check_time_spread(exp: Experiment, tables: list[Table]) -> None:
    """Every time an experiment's table shows carries its interval over repeats."""
    for t in tables:
        bare = timed_columns_without_spread(t)
        if bare:
            raise RuntimeError(f"experiment {exp.name!r}: table {t.title!r} shows times without their "
                               f"spread in {', '.join(map(repr, bare))} (Column(spread=...), harness.stats)")


def _cpu_s() -> float:
    """CPU seconds of this process (threads ranks) and of its finished children (gloo ranks)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_experiments(name: str, *, scale: str, out_dir: Path, quiet: bool = False) -> list[Table]:
    chosen = [get_experiment(n) for n in ORDER] if name == "all" else [get_experiment(name)]
    tables = []
    _claims._CLAIMS.clear()
    start, since = time.perf_counter(), time.time()
    overall = progress.Overall({e.name: EXPECTED_S.get(e.name, 60.0) for e in chosen})
    progress.set_overall(overall)
    written: list[str] = []
    # until the end, the directory says it holds an unfinished set (table and compare refuse it)
    marker = out_dir / INCOMPLETE
    atomic_write(marker, f"`commbench reproduce {name}` started {time.strftime('%Y-%m-%d %H:%M:%S')} "
                         f"(pid {os.getpid()}) and has not finished: the records, tables and claims "
                         "here may mix that run's and an earlier one's. Re-run it; a run that "
                         "finishes removes this file.\n")
    try:
        for i, exp in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {exp.name}: {exp.summary} ({overall.status()})", flush=True)
            t0, c0 = time.perf_counter(), _cpu_s()
            overall.begin(exp.name)
            exp_tables = exp.run(scale, out_dir, quiet)
            overall.end(exp.name)
            check_paper_tables(exp, exp_tables)
            check_time_spread(exp, exp_tables)
            _show(exp_tables, quiet)
            files = _write_tables(exp.name, exp_tables, out_dir)
            written += files
            tables.extend(exp_tables)
            print(f"{exp.name}: {time.perf_counter() - t0:.1f} s wall, {_cpu_s() - c0:.1f} CPU-s; "
                  f"tables in {', '.join(files)}", flush=True)
    finally:
        progress.set_overall(None)
    if _claims._CLAIMS:
        summary = _claims.claims_table(list(_claims._CLAIMS))
        summary.notes.insert(0, _claims.provenance())  # the header of claims.md: commit and machine
        _show([summary], quiet)
        stem = "claims" if name == "all" else f"{name}-claims"
        files = _write_tables(stem, [summary], out_dir, header=summary.notes[0])
        atomic_write(out_dir / f"{stem}.json", _claims.claims_json(list(_claims._CLAIMS), summary.notes[0]))
        files.append(str(out_dir / f"{stem}.json"))
        written += files
        print(f"claims: {', '.join(files)}")
        tables.append(summary)
    elapsed = time.perf_counter() - start
    if name == "all" and scale == "tiny":
        verdict = "within" if elapsed <= ALL_BUDGET_S else "OVER"
        print(f"all: {elapsed / 60:.1f} min, {verdict} the {ALL_BUDGET_S // 60} min budget of the "
              "default scale", file=sys.stdout if elapsed <= ALL_BUDGET_S else sys.stderr)
    marker.unlink()  # a complete set
    _print_written(written, out_dir, [e.name for e in chosen], since)
    return tables


def _print_written(tables: list[str], out_dir: Path, names: list[str], since: float) -> None:
    """The run ends with where everything it wrote is: full tables, plots, run records."""
    plots = sorted(str(p) for p in out_dir.glob("*.png") if p.stat().st_mtime >= since)
    runs = [str(out_dir / n / "runs") for n in names if (out_dir / n / "runs").is_dir()]
    print("\nwrote (the full tables, every column, are in the exports):")
    for group, paths in (("tables", tables), ("plots", plots), ("run records", runs)):
        if paths:
            print(f"  {group}:")
            for p in paths:
                print(f"    {p}")


def _show(tables: list[Table], quiet: bool) -> None:
    for table in tables:
        if quiet:
            print(render(table, "md"))
        else:
            print_table(table)


def _write_tables(name: str, tables: list[Table], out_dir: Path, header: str = "") -> list[str]:
    """All of an experiment's tables in one markdown file (after ``header``, a paragraph);
    CSV and HTML one file per table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{name}.md"
    atomic_write(md, "\n\n".join(([header] if header else []) + [render(t, "md") for t in tables]))
    written = [str(md)]
    for i, table in enumerate(tables, 1):
        stem = out_dir / (name if len(tables) == 1 else f"{name}-{i}")
        for fmt in ("csv", "html"):
            write_table(table, stem.with_suffix(f".{fmt}"), fmt)
        written.append(f"{stem}.{{csv,html}}")
    return written
