"""Reporting: comparison tables, plots and regression reports.

A :class:`Table` holds raw values (numbers, strings, ``None`` for missing)
under typed :class:`Column` s, each carrying its unit, its direction
(``higher_is_better``, shown as an arrow in the header) and how to format a
value for humans. CSV keeps the raw numbers (unit in the header) so it parses
back exactly; Markdown, LaTeX, HTML and rich show human-formatted cells
(bytes in KiB/MiB with base 1024, seconds in s/ms/µs, large counts with
k/M/G). A measured time carries its spread: a column with ``spread`` holds
:class:`~harness.stats.Interval` cells, shown ``value [lo, hi]`` by
:func:`format_interval` (the one way an interval is written) and in CSV as
three columns.

Modules: ``table`` (the row model, :func:`records_to_table`), ``units`` (cell
formats), ``render`` and ``latex`` (the exporters), ``reference`` (a paper's
numbers beside ours), ``plots`` (PNG figures) and ``compare`` (regression
report between two result sets).
"""

from .latex import latex_escape, render_latex
from .reference import REFERENCE_COLUMNS, load_reference, with_reference
from .render import (
    FORMATS,
    SUFFIX_FORMATS,
    parse_csv_value,
    print_table,
    render,
    render_csv,
    render_html,
    render_markdown,
    to_rich,
    write_table,
)
from .table import (
    BYTES_NOTE,
    DEFAULT_METRICS,
    HEADERS,
    MISSING,
    Column,
    Table,
    TableError,
    records_to_table,
)
from .units import (
    NAMED_FORMATS,
    format_bytes,
    format_interval,
    format_number,
    format_seconds,
    format_sha,
    format_si,
    is_time_unit,
)

__all__ = [
    "BYTES_NOTE", "DEFAULT_METRICS", "FORMATS", "HEADERS", "MISSING", "NAMED_FORMATS",
    "REFERENCE_COLUMNS", "SUFFIX_FORMATS", "Column", "Table", "TableError", "format_bytes",
    "format_interval", "format_number", "format_seconds", "format_sha", "format_si", "is_time_unit", "latex_escape", "load_reference",
    "parse_csv_value", "print_table", "records_to_table", "render", "render_csv", "render_html",
    "render_latex", "render_markdown", "to_rich", "with_reference", "write_table",
]
