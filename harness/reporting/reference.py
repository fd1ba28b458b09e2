"""The papers' numbers (``results/reference/<paper>.csv``) and :func:`with_reference`,
which puts them beside ours in a table."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .render import parse_csv_value
from .table import Column, Table, TableError

REFERENCE_COLUMNS = ("table", "setting", "metric", "value", "unit", "source")


def _reference_dirs() -> list[Path]:
    dirs = [Path.cwd() / "results" / "reference",
            Path(__file__).resolve().parents[2] / "results" / "reference"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def load_reference(path_or_paper: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a paper's reference CSV as dicts, ``value`` parsed to a number where it is one.

    ``path_or_paper`` is a CSV path or a paper name looked up as
    ``results/reference/<paper>.csv`` (in the working directory, then in the
    source checkout). Lines starting with ``#`` are comments. The CSV needs at
    least the columns ``table, setting, metric, value, unit, source``; an optional
    ``note`` says what a cell's reading depends on ("uncertain reading: ..." for a
    cell read from garbled text; why a value is empty, e.g. out of memory).
    """
    p = Path(path_or_paper)
    looks_like_path = p.suffix.lower() == ".csv" or len(p.parts) > 1
    if looks_like_path:
        candidates = [p]
    else:
        candidates = [d / f"{p.name}.csv" for d in _reference_dirs()]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        if looks_like_path:
            raise TableError(f"{p}: reference table not found")
        known = sorted({f.stem for d in _reference_dirs() if d.is_dir()
                        for f in d.glob("*.csv")})
        raise TableError(f"no reference table for {str(path_or_paper)!r}: "
                         f"results/reference/{p.name}.csv not found "
                         f"(available: {', '.join(known) or 'none'})")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: cannot read reference table ({exc})") from None
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.lstrip().startswith("#")]
    try:
        reader = csv.DictReader(lines)
        fields = [f.strip() for f in (reader.fieldnames or [])]
        missing = [c for c in REFERENCE_COLUMNS if c not in fields]
        if missing:
            raise TableError(f"{path}: reference table lacks column(s) {', '.join(missing)}")
        rows = []
        for i, raw in enumerate(reader, start=2):
            if None in raw:
                raise TableError(f"{path}: row {i} has more cells than the header")
            row = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in raw.items()}
            if not any(row.values()):
                continue
            row["value"] = parse_csv_value(row["value"] or "")
            rows.append(row)
    except csv.Error as exc:
        raise TableError(f"{path}: malformed CSV ({exc})") from None
    return rows


def with_reference(
    table: Table,
    reference_rows: Iterable[dict[str, Any]],
    key: str | Callable[[dict[str, Any]], Any] = "algorithm",
    table_name: str | None = None,
) -> Table:
    """A copy of ``table`` with a "paper" column right after each metric the paper reports.

    A reference row matches one of our rows when its ``setting`` equals
    ``key(row)`` (``key`` is a column key or a function of the row as a dict
    column key -> value) and its ``metric`` is one of our column keys. Use
    ``table_name`` to keep only the reference rows of one paper table. Two
    reference rows for the same setting and metric are ambiguous and raise.
    """
    refs = [r for r in reference_rows if table_name is None or r.get("table") == table_name]
    if isinstance(key, str):
        if key not in {c.key for c in table.columns}:
            raise TableError(f"reference key column {key!r} is not in the table")
        col = key

        def key_fn(row: dict[str, Any]) -> Any:
            return row[col]
    else:
        key_fn = key

    lookup: dict[tuple[str, str], dict[str, Any]] = {}
    for r in refs:
        k = (str(r.get("setting")), str(r.get("metric")))
        if k in lookup:
            raise TableError(f"reference rows repeat setting {k[0]!r} metric {k[1]!r}; "
                             f"pass table_name to choose one paper table")
        lookup[k] = r

    rows = table.row_dicts()
    settings = [None if (s := key_fn(d)) is None else str(s) for d in rows]
    columns: list[Column] = []
    sources: list[str] = []
    matched = 0
    for c in table.columns:
        columns.append(c)
        hits = [lookup.get((s, c.key)) if s is not None else None for s in settings]
        if not any(hits):
            continue
        units = {h.get("unit") or None for h in hits if h}
        unit = units.pop() if len(units) == 1 else None
        paper = Column(f"paper:{c.key}", f"{c.header} (paper)", unit, c.higher_is_better,
                       c.fmt if unit == c.unit else None)
        columns.append(paper)
        for row, h in zip(rows, hits, strict=True):
            row[paper.key] = h["value"] if h else None
        matched += sum(1 for h in hits if h)
        sources += [str(h["source"]) for h in hits if h and h.get("source")]
    notes = list(table.notes)
    if matched:
        srcs = list(dict.fromkeys(sources))
        # a source may itself say how the value was obtained ("derived from Table 1 ..."), so the
        # sources are listed after a colon rather than after "from"
        notes.append("(paper) columns: the paper's values" + (f"; sources: {'; '.join(srcs)}" if srcs
                                                               else "") + ".")
    else:
        notes.append("No reference values matched these rows.")
    return replace(table, columns=columns, rows=rows, notes=notes)
