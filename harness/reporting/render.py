"""Renderers of a :class:`~harness.reporting.table.Table`: Markdown, CSV (raw values,
unit in the header, parses back exactly), HTML, rich for the terminal; LaTeX
lives in :mod:`harness.reporting.latex`."""

from __future__ import annotations

import csv
import html
import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.results import atomic_write

from .latex import render_latex
from .table import Table

FORMATS = ("md", "csv", "latex", "html")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".tex": "latex",
                  ".latex": "latex", ".html": "html", ".htm": "html"}


def render(table: Table, fmt: str) -> str:
    """Render to ``md``, ``csv``, ``latex`` or ``html``; other names raise ValueError."""
    try:
        fn = _RENDERERS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown table format {fmt!r}; choose one of: {', '.join(FORMATS)}") \
            from None
    return fn(table)


def _md_cell(s: str) -> str:
    return " ".join(s.split()).replace("\\", "\\\\").replace("|", "\\|") or " "


def _md_text(s: str) -> str:
    """A paragraph of plain text: one line, pipes escaped, no accidental block markup."""
    s = _md_cell(s)
    return "\\" + s if s and s[0] in "#-+*>=`~" else s


def render_markdown(table: Table) -> str:
    """GitHub-flavoured Markdown: title in bold, the table, then caption and notes."""
    headers = [_md_cell(c.header_text()) for c in table.columns]
    body = [[_md_cell(s) for s in row] for row in table.formatted_rows()]
    numeric = [table.is_numeric(j) for j in range(len(table.columns))]
    widths = [max([len(h), 3] + [len(r[j]) for r in body]) for j, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if num else c.ljust(w)
                  for c, w, num in zip(cells, widths, numeric, strict=True)]
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if num else (":" + "-" * (w + 1))
                         for w, num in zip(widths, numeric, strict=True)) + "|"
    out: list[str] = []
    if table.title.strip():
        title = _md_cell(table.title).replace("*", r"\*")
        out += [f"**{title}**", ""]
    out.append(line(headers))
    out.append(sep)
    out += [line(r) for r in body]
    for t in [table.caption, *table.display_notes()]:
        if t.strip():
            out += ["", _md_text(t)]
    return "\n".join(out) + "\n"


def _csv_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def render_csv(table: Table) -> str:
    """RFC 4180 CSV: one header row (``key [unit]``) and raw values; missing cells are empty.
    A column with a spread is three: its value, then ``key.lo [unit]`` and ``key.hi [unit]``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    head: list[str] = []
    for c in table.columns:
        head.append(c.csv_header())
        if c.spread is not None:
            unit = f" [{c.unit}]" if c.unit else ""
            head += [f"{c.key}.lo{unit}", f"{c.key}.hi{unit}"]
    w.writerow(head)
    for row in table.rows:
        cells: list[str] = []
        for c, v in zip(table.columns, row, strict=True):
            if c.spread is None:
                cells.append(_csv_value(v))
            elif v is None:
                cells += ["", "", ""]
            else:
                cells += [_csv_value(v.value), _csv_value(v.lo), _csv_value(v.hi)]
        w.writerow(cells)
    return buf.getvalue()


def parse_csv_value(s: str) -> Any:
    """Inverse of the CSV cell encoding for numbers and missing cells."""
    if s == "":
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        return s
    return f if math.isfinite(f) else s



_HTML_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em}"
    "table{border-collapse:collapse}"
    "th,td{padding:.25em .75em;border-bottom:1px solid #ccc}"
    "thead th{border-bottom:2px solid #333;text-align:left}"
    "td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}"
    "caption{font-weight:bold;margin-bottom:.5em}"
    "p.note{font-size:.9em;color:#444}"
)


def render_html(table: Table) -> str:
    """A complete standalone HTML5 document holding the table; every text is escaped."""
    e = html.escape
    numeric = [table.is_numeric(j) for j in range(len(table.columns))]
    cls = [' class="num"' if n else "" for n in numeric]
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{e(table.title or 'commbench table')}</title>",
           f"<style>{_HTML_STYLE}</style>", "</head>", "<body>", "<table>"]
    if table.title:
        out.append(f"<caption>{e(table.title)}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col"{k}>{e(c.header_text())}</th>'
                                       for c, k in zip(table.columns, cls, strict=True)) + "</tr></thead>")
    out.append("<tbody>")
    for row in table.formatted_rows():
        out.append("<tr>" + "".join(f"<td{k}>{e(s)}</td>" for s, k in zip(row, cls, strict=True)) + "</tr>")
    out.append("</tbody>")
    out.append("</table>")
    out += [f'<p class="note">{e(t)}</p>' for t in [table.caption, *table.display_notes()] if t]
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


_RENDERERS: dict[str, Callable[[Table], str]] = {
    "md": render_markdown,
    "csv": render_csv,
    "latex": render_latex,
    "html": render_html,
}


def to_rich(table: Table) -> Any:
    """The table as a :class:`rich.table.Table` (cells are plain text, never markup)."""
    from rich.table import Table as RichTable
    from rich.text import Text

    caption = "\n".join(t for t in [table.caption, *table.display_notes()] if t) or None
    rt = RichTable(title=table.title or None, caption=caption, caption_justify="left")
    for j, c in enumerate(table.columns):
        rt.add_column(Text(c.header_text()), justify="right" if table.is_numeric(j) else "left")
    for row in table.formatted_rows():
        rt.add_row(*(Text(s) for s in row))
    return rt


def print_table(table: Table, console: Any = None) -> None:
    """Print to the terminal with rich (a new ``rich.console.Console`` when none is given),
    folded to the console's width so that no cell is cut (:mod:`.terminal`)."""
    from .terminal import terminal_tables

    if console is None:
        import sys

        from rich.console import Console

        # Piped output (CI logs, files) gets a wide console instead of 80 columns, unless COLUMNS says.
        wide = sys.stdout.isatty() or "COLUMNS" in os.environ
        console = Console(width=None if wide else 220)
    for part in terminal_tables(table, console.width):
        console.print(part)


def write_table(table: Table, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Render and write atomically; ``fmt`` defaults from the suffix (.md .csv .tex .html)."""
    path = Path(path)
    if fmt is None:
        fmt = SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the table format from the suffix "
                             f"{path.suffix!r}; pass fmt, one of: {', '.join(FORMATS)}")
    return atomic_write(path, render(table, fmt))

