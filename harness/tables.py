"""Comparison tables: one plain row model, rendered to Markdown, CSV, LaTeX, HTML and rich.

A :class:`Table` holds raw values (numbers, strings, ``None`` for missing);
each :class:`Column` carries its unit, its direction (``higher_is_better``,
shown as an arrow in the header) and how to format a value for humans. CSV
keeps the raw numbers (unit in the header) so it parses back exactly; the
other formats show human-formatted cells (bytes in KiB/MiB with base 1024,
seconds in s/ms/µs, large counts with k/M/G).

:func:`records_to_table` builds a table from result records, and
:func:`with_reference` puts a paper's numbers (``results/reference/<paper>.csv``)
beside ours.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.results import THROUGHPUT_METRICS, ResultRecord, atomic_write

FORMATS = ("md", "csv", "latex", "html")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".tex": "latex",
                  ".latex": "latex", ".html": "html", ".htm": "html"}
MISSING = "—"

DEFAULT_METRICS = (
    "payload_bytes_per_step",
    "messages_per_step",
    "peak_memory_bytes",
    "step_time_s",
    "throughput",
    "final_loss",
    "params_sha256",
)

HEADERS = {
    "algorithm": "algorithm",
    "model": "model",
    "world_size": "world size",
    "backend": "backend",
    "data": "data",
    "steps": "steps",
    "seed": "seed",
    "runs": "runs",
    "data_kind": "data kind",
    "payload_bytes_per_step": "payload/step",
    "messages_per_step": "messages/step",
    "peak_memory_bytes": "peak memory",
    "step_time_s": "step time",
    "throughput_tokens_per_s": "throughput",
    "throughput_samples_per_s": "throughput",
    "final_loss": "final loss",
    "params_sha256": "params sha256",
}

BYTES_NOTE = "KiB, MiB, GiB = 1024, 1024², 1024³ bytes."


class TableError(ValueError):
    """Bad table input (unknown metric, mixed units, missing or malformed reference file)."""


# --------------------------------------------------------------------------- formatting


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _sig(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, no exponent for ordinary magnitudes."""
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(digits - 1 - mag, 0)
    s = f"{x:.{decimals}f}"
    # rounding may carry into a new digit (9.996 -> 10.00): recompute once
    if len(s.lstrip("-").replace(".", "").lstrip("0")) > digits and decimals > 0:
        s = f"{x:.{decimals - 1}f}"
    return s


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (base 1024); below 1 KiB as '123 B'."""
    if not _is_number(n) or not math.isfinite(n):
        return str(n)
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a < 1024:
        return f"{sign}{a:g} B" if isinstance(n, float) and a != int(a) else f"{sign}{int(a)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        a /= 1024.0
        if a < 1024 or unit == "PiB":
            return f"{sign}{_sig(a)} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """0.0123 -> '12.3 ms'; 4.5e-6 -> '4.50 µs'; 2.5 -> '2.50 s'."""
    if not _is_number(s) or not math.isfinite(s):
        return str(s)
    a = abs(s)
    if a == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale:
            return f"{_sig(s / scale)} {unit}"
    return f"{_sig(s / 1e-9)} ns"


def format_si(x: float) -> str:
    """Large numbers with k/M/G/T (base 1000): 12345 -> '12.3k'; small ones as they are."""
    if not _is_number(x) or not math.isfinite(x):
        return str(x)
    a = abs(x)
    if a < 10_000:
        if x == int(x):
            return str(int(x))
        return f"{x:.0f}" if a >= 1000 else f"{x:.4g}"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{_sig(x / scale)}{suffix}"
    raise AssertionError("unreachable")


def format_number(x: Any) -> str:
    """Default cell format: ints in full below 10⁶, floats with 4 significant digits."""
    if isinstance(x, bool) or not _is_number(x):
        return str(x)
    if isinstance(x, int):
        return str(x) if abs(x) < 1_000_000 else format_si(x)
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def format_sha(x: Any) -> str:
    """A hex digest shortened to its first 12 characters."""
    return x[:12] if isinstance(x, str) else str(x)


NAMED_FORMATS: dict[str, Callable[[Any], str]] = {
    "bytes": format_bytes,
    "seconds": format_seconds,
    "si": format_si,
    "number": format_number,
    "sha": format_sha,
}


# --------------------------------------------------------------------------- row model


@dataclass
class Column:
    """A column: ``key`` (machine name), ``header`` (human name), unit, direction, format.

    ``fmt`` is a name from :data:`NAMED_FORMATS` ("bytes", "seconds", "si",
    "number", "sha"), a format spec for :func:`format` (".3f"), a callable
    value -> str, or None to choose from the unit ("bytes" -> KiB/MiB, "s" ->
    s/ms/µs, "<x>/s" -> k/M/G, otherwise :func:`format_number`). Non-numbers
    are shown as they are.
    """

    key: str
    header: str
    unit: str | None = None
    higher_is_better: bool | None = None
    fmt: str | Callable[[Any], str] | None = None

    @property
    def arrow(self) -> str:
        return {True: "↑", False: "↓"}.get(self.higher_is_better, "")

    def header_text(self) -> str:
        """Header as shown to people: ``step time [s] ↓``."""
        text = self.header
        if self.unit:
            text += f" [{self.unit}]"
        if self.arrow:
            text += f" {self.arrow}"
        return text

    def csv_header(self) -> str:
        """Header in CSV: the machine key with the unit, ``step_time_s [s]``."""
        return f"{self.key} [{self.unit}]" if self.unit else self.key

    def format(self, value: Any) -> str:
        if value is None:
            return MISSING
        fmt = self.fmt if self.fmt is not None else _fmt_for(self.key, self.unit)
        if fmt is None:
            return format_number(value)
        if callable(fmt):
            return fmt(value)
        if fmt in NAMED_FORMATS:
            return NAMED_FORMATS[fmt](value)
        try:
            return format(value, fmt)
        except (TypeError, ValueError):
            return str(value)


@dataclass
class Table:
    """Plain rows of raw values under typed columns, with a title, caption and notes."""

    title: str
    columns: list[Column]
    rows: list[list]
    caption: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        keys = [c.key for c in self.columns]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise TableError(f"duplicate column key(s): {', '.join(dup)}")
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise TableError(f"row {i} has {len(row)} cells, expected {len(self.columns)}")

    def column_index(self, key: str) -> int:
        for i, c in enumerate(self.columns):
            if c.key == key:
                return i
        raise KeyError(key)

    def is_numeric(self, j: int) -> bool:
        """A column is numeric when all its present values are numbers (and one exists)."""
        vals = [r[j] for r in self.rows if r[j] is not None]
        return bool(vals) and all(_is_number(v) for v in vals)

    def display_notes(self) -> list[str]:
        """Notes as shown beside formatted cells: states the 1024 base when bytes are shown."""
        notes = [n for n in self.notes if n.strip()]
        uses_bytes = any(
            (c.fmt if c.fmt is not None else _fmt_for(c.key, c.unit)) == "bytes"
            and any(_is_number(r[j]) and abs(r[j]) >= 1024 for r in self.rows)
            for j, c in enumerate(self.columns))
        if uses_bytes and BYTES_NOTE not in notes:
            notes.append(BYTES_NOTE)
        return notes

    def formatted_rows(self) -> list[list[str]]:
        return [[c.format(v) for c, v in zip(self.columns, row, strict=True)] for row in self.rows]

    def row_dicts(self) -> list[dict[str, Any]]:
        return [{c.key: v for c, v in zip(self.columns, row, strict=True)} for row in self.rows]


# --------------------------------------------------------------------------- from records


def _group_value(rec: ResultRecord, key: str) -> Any:
    if key in ("algorithm", "model", "world_size", "backend", "data", "steps", "seed",
               "data_kind"):
        return getattr(rec, key)
    cur: Any = rec.config
    for part in key.removeprefix("config.").split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur if isinstance(cur, (str, int, float, bool)) or cur is None else str(cur)


def _fmt_for(name: str, unit: str | None) -> str | None:
    if name == "params_sha256" or name.endswith("_sha256"):
        return "sha"
    if unit in ("bytes", "B", "byte"):
        return "bytes"
    if unit == "s":
        return "seconds"
    if unit and ("/s" in unit or unit in ("messages", "count", "tokens", "samples")):
        return "si"
    return None


def records_to_table(
    records: Sequence[ResultRecord],
    metrics: Sequence[str] | None = None,
    group_by: Sequence[str] = ("algorithm", "model", "world_size", "backend"),
    title: str = "commbench results",
) -> Table:
    """One row per distinct ``group_by`` value (in first-seen order), one column per metric.

    ``metrics`` defaults to :data:`DEFAULT_METRICS`; the pseudo-metric
    ``throughput`` stands for whichever of ``throughput_tokens_per_s`` /
    ``throughput_samples_per_s`` the records carry. Several records in one
    group (repeats, seeds) are averaged for numbers; a string metric shows its
    value when all agree and ``"<k> distinct"`` otherwise; a ``runs`` column
    appears. ``group_by`` keys are record fields or ``config.`` paths.
    """
    records = list(records)
    if not records:
        raise TableError("no result records to tabulate")
    requested = list(DEFAULT_METRICS if metrics is None else metrics)
    available = sorted({m for r in records for m in r.metrics})
    names: list[str] = []
    for m in requested:
        if m == "throughput":
            present = [t for t in THROUGHPUT_METRICS if any(t in r.metrics for r in records)]
            names.extend(t for t in present if t not in names)
        elif m not in names:
            if not any(m in r.metrics for r in records):
                raise TableError(f"no record has metric {m!r}; available: {', '.join(available)}")
            names.append(m)

    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault(tuple(_group_value(r, k) for k in group_by), []).append(r)
    multi = any(len(g) > 1 for g in groups.values())
    synthetic = any(r.data_kind == "synthetic" for r in records)

    columns = [Column(k, HEADERS.get(k, k.removeprefix("config."))) for k in group_by]
    if synthetic and "data_kind" not in group_by:
        columns.append(Column("data_kind", HEADERS["data_kind"]))
    if multi:
        columns.append(Column("runs", HEADERS["runs"]))
    for name in names:
        units = {r.metrics[name].unit for r in records if name in r.metrics}
        if len(units) > 1:
            raise TableError(f"metric {name!r} has different units across records: "
                             f"{', '.join(sorted(units))}")
        unit = units.pop()
        hib = next((r.metrics[name].higher_is_better for r in records
                    if name in r.metrics and r.metrics[name].higher_is_better is not None), None)
        shown_unit = None if name == "params_sha256" else unit
        columns.append(Column(name, HEADERS.get(name, name), shown_unit, hib, _fmt_for(name, unit)))

    rows: list[list] = []
    for key, recs in groups.items():
        row: list[Any] = list(key)
        if synthetic and "data_kind" not in group_by:
            kinds = {r.data_kind for r in recs}
            row.append(kinds.pop() if len(kinds) == 1 else "mixed")
        if multi:
            row.append(len(recs))
        for name in names:
            vals = [r.metrics[name].value for r in recs if name in r.metrics]
            if not vals:
                row.append(None)
            elif all(_is_number(v) for v in vals):
                if len(vals) == 1 or all(v == vals[0] for v in vals):
                    row.append(vals[0])
                else:
                    row.append(math.fsum(vals) / len(vals))
            else:
                distinct = list(dict.fromkeys(map(str, vals)))
                row.append(distinct[0] if len(distinct) == 1 else f"{len(distinct)} distinct")
        rows.append(row)

    notes: list[str] = []
    if multi:
        notes.append("Rows with several runs show the mean of numeric metrics.")
    if "params_sha256" in names:
        notes.append("params sha256: first 12 hex digits (full digest in CSV).")
    if synthetic:
        notes.append("data kind 'synthetic': a synthetic task, not real data.")
    return Table(title=title, columns=columns, rows=rows, notes=notes)


# --------------------------------------------------------------------------- renderers


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
    """RFC 4180 CSV: one header row (``key [unit]``) and raw values; missing cells are empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow([c.csv_header() for c in table.columns])
    for row in table.rows:
        w.writerow([_csv_value(v) for v in row])
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


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "[": "{[}", "]": "{]}",
    '"': r"\texttt{\char34}", "—": "---", "–": "--", "−": "-", "§": r"\S{}", "…": r"\ldots{}",
}
# Symbols typeset as math; \ensuremath so that two in a row never make "$$".
_LATEX_MATH = {
    "µ": r"\mu", "±": r"\pm", "↑": r"\uparrow", "↓": r"\downarrow", "→": r"\rightarrow",
    "←": r"\leftarrow", "×": r"\times", "·": r"\cdot", "≤": r"\leq", "≥": r"\geq", "≈": r"\approx",
    "≠": r"\neq", "∞": r"\infty", "‖": r"\|", "√": r"\surd", "∈": r"\in", "∇": r"\nabla",
    "∂": r"\partial", "⌈": r"\lceil", "⌉": r"\rceil", "⌊": r"\lfloor", "⌋": r"\rfloor",
    "⊙": r"\odot", "ℓ": r"\ell", "°": r"^\circ", "|": "|",
}
# Greek capitals with no LaTeX command look like Latin letters.
_GREEK_AS_LATIN = {"ALPHA": "A", "BETA": "B", "EPSILON": "E", "ZETA": "Z", "ETA": "H", "IOTA": "I",
                   "KAPPA": "K", "MU": "M", "NU": "N", "OMICRON": "O", "RHO": "P", "TAU": "T",
                   "CHI": "X"}
_GREEK = set(_GREEK_AS_LATIN) | {"GAMMA", "DELTA", "THETA", "LAMBDA", "XI", "PI", "SIGMA",
                                 "UPSILON", "PHI", "PSI", "OMEGA"}


def _latex_char(ch: str) -> str:
    """One character as pdflatex (utf8 input, default fonts) can typeset it."""
    if ch in _LATEX_SPECIALS:
        return _LATEX_SPECIALS[ch]
    if ch in _LATEX_MATH:
        return rf"\ensuremath{{{_LATEX_MATH[ch]}}}"
    if ch.isascii():
        return ch if ch.isprintable() else " "
    name = unicodedata.name(ch, "").replace("LAMDA", "LAMBDA")  # Unicode's spelling
    for prefix, capital in (("GREEK SMALL LETTER ", False), ("GREEK CAPITAL LETTER ", True)):
        letter = name[len(prefix):]
        if name.startswith(prefix) and letter in _GREEK:
            if letter in _GREEK_AS_LATIN and (capital or letter == "OMICRON"):
                return _GREEK_AS_LATIN[letter] if capital else "o"
            return rf"\ensuremath{{\{letter.capitalize() if capital else letter.lower()}}}"
    tag, _, code = unicodedata.decomposition(ch).partition(" ")
    if tag in ("<super>", "<sub>") and code:
        inner = "".join(_latex_char(chr(int(c, 16))) for c in code.split())
        return rf"\text{'superscript' if tag == '<super>' else 'subscript'}{{{inner}}}"
    if unicodedata.category(ch) == "Mn":
        return ""  # a combining mark: the base letter is kept, the accent dropped
    # Latin letters with accents: their ASCII base (é -> e); anything else -> "?"
    base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return "".join(_latex_char(b) for b in base) if base else "?"


def latex_escape(s: str) -> str:
    """Text safe for a pdflatex document: specials escaped, symbols and Greek as math,
    sub/superscripts as text sub/superscripts; characters it cannot typeset become '?'."""
    return "".join(_latex_char(ch) for ch in s)


def render_latex(table: Table) -> str:
    """A booktabs ``tabular`` inside a ``table`` float (needs ``\\usepackage{booktabs}``)."""
    spec = "".join("r" if table.is_numeric(j) else "l" for j in range(len(table.columns)))
    out = [r"% requires \usepackage{booktabs}", r"\begin{table}[htbp]", r"\centering"]
    cap = ". ".join(t for t in (table.title, table.caption) if t)
    if cap:
        out.append(rf"\caption{{{latex_escape(' '.join(cap.split()))}}}")
    out.append(rf"\begin{{tabular}}{{{spec}}}")
    out.append(r"\toprule")
    out.append(" & ".join(latex_escape(" ".join(c.header_text().split()))
                          for c in table.columns) + r" \\")
    out.append(r"\midrule")
    for row in table.formatted_rows():
        out.append(" & ".join(latex_escape(" ".join(s.split())) for s in row) + r" \\")
    out.append(r"\bottomrule")
    out.append(r"\end{tabular}")
    notes = table.display_notes()
    if notes:
        out.append(r"\par\smallskip\footnotesize")
        out.append(r"\\ ".join(latex_escape(" ".join(n.split())) for n in notes))
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


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
    """Print to the terminal with rich (a new ``rich.console.Console`` when none is given)."""
    if console is None:
        import sys

        from rich.console import Console

        # Piped output (CI logs, files) gets a wide console instead of 80 columns.
        console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(to_rich(table))


def write_table(table: Table, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Render and write atomically; ``fmt`` defaults from the suffix (.md .csv .tex .html)."""
    path = Path(path)
    if fmt is None:
        fmt = SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the table format from the suffix "
                             f"{path.suffix!r}; pass fmt, one of: {', '.join(FORMATS)}")
    return atomic_write(path, render(table, fmt))


# --------------------------------------------------------------------------- references

REFERENCE_COLUMNS = ("table", "setting", "metric", "value", "unit", "source")


def _reference_dirs() -> list[Path]:
    dirs = [Path.cwd() / "results" / "reference",
            Path(__file__).resolve().parent.parent / "results" / "reference"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def load_reference(path_or_paper: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a paper's reference CSV as dicts, ``value`` parsed to a number where it is one.

    ``path_or_paper`` is a CSV path or a paper name looked up as
    ``results/reference/<paper>.csv`` (in the working directory, then in the
    source checkout). Lines starting with ``#`` are comments. The CSV needs at
    least the columns ``table, setting, metric, value, unit, source``.
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

    settings = [None if (s := key_fn(d)) is None else str(s) for d in table.row_dicts()]
    columns: list[Column] = []
    col_values: list[list[Any]] = []
    sources: list[str] = []
    matched = 0
    for j, c in enumerate(table.columns):
        columns.append(c)
        col_values.append([row[j] for row in table.rows])
        hits = [lookup.get((s, c.key)) if s is not None else None for s in settings]
        if not any(hits):
            continue
        units = {h.get("unit") or None for h in hits if h}
        unit = units.pop() if len(units) == 1 else None
        columns.append(Column(f"paper:{c.key}", f"{c.header} (paper)", unit,
                              c.higher_is_better, c.fmt if unit == c.unit else None))
        col_values.append([h["value"] if h else None for h in hits])
        matched += sum(1 for h in hits if h)
        sources += [str(h["source"]) for h in hits if h and h.get("source")]
    rows = [list(r) for r in zip(*col_values, strict=True)] if table.rows else []
    notes = list(table.notes)
    if matched:
        srcs = list(dict.fromkeys(sources))
        notes.append("(paper) columns: reported values" + (f" from {'; '.join(srcs)}" if srcs
                                                            else "") + ".")
    else:
        notes.append("No reference values matched these rows.")
    return replace(table, columns=columns, rows=rows, notes=notes)
