"""Tables for a terminal of a given width that never cut a cell.

Rich squeezes a table wider than the console by shortening cells ("256.…").
Here every cell keeps its full text on one line: columns without any value
are left out, and a table wider than the console is folded into parts that
fit, each repeating the first (label) column (text cells may wrap at
spaces, numbers with their units never do); when not even the label and one
more column fit side by side, the table is transposed into one
``field | value`` block per row.  Headers may wrap at spaces, never mid-word.
The full table, every column, is in the exports (Markdown, CSV, HTML).
"""

from __future__ import annotations

from typing import Any

from .table import MISSING, Table


def _border(ncols: int) -> int:
    # rich's default box with padding (0, 1): "│ a │ b │" = 3 per column + 1
    return 3 * ncols + 1


PROSE = 30  # a text column (labels, claims) wraps at spaces beyond this width; numbers never wrap


def _need(header: str, cells: list[str], numeric: bool = True) -> int:
    """Width a column needs: its header's longest word, and its longest cell (a number,
    with its unit, on one line) or, for text, its longest word or ``PROSE``."""
    words = header.split() or [""]
    if numeric:
        body = [len(c) for c in cells]
    else:
        body = [max((len(w) for w in c.split()), default=0) for c in cells]
        body.append(min(PROSE, max((len(c) for c in cells), default=0)))
    return max([len(w) for w in words] + body + [1])


def fold(table: Table, width: int) -> tuple[list[list[int]], bool, list[int]]:
    """Column index groups that fit ``width``, whether the table must be transposed
    instead, and the indices of columns left out for holding no value."""
    rows = table.formatted_rows()
    n = len(table.columns)
    empty = [j for j in range(n) if rows and all(r[j] == MISSING for r in rows)]
    keep = [j for j in range(n) if j not in empty] or list(range(n))
    need = {j: _need(table.columns[j].header_text(), [r[j] for r in rows], table.is_numeric(j)) for j in keep}
    if sum(need.values()) + _border(len(keep)) <= width:
        return [keep], False, empty
    label, rest = keep[0], keep[1:]
    groups: list[list[int]] = []
    cur: list[int] = []
    for j in rest:
        trial = [label, *cur, j]
        if sum(need[k] for k in trial) + _border(len(trial)) <= width:
            cur.append(j)
        elif cur:
            groups.append([label, *cur])
            cur = [j]
            if need[label] + need[j] + _border(2) > width:
                return [], True, empty
        else:
            return [], True, empty
    if cur:
        groups.append([label, *cur])
    return groups or [[label]], False, empty


def _widths(table: Table, rows: list[list[str]], cols: list[int], width: int) -> list[int]:
    """Fixed column widths (rich would otherwise shrink a column below its cells): each
    column what it needs, then the spare width spent on unwrapping text and headers, left first."""
    widths = [_need(table.columns[j].header_text(), [r[j] for r in rows], table.is_numeric(j)) for j in cols]
    spare = width - sum(widths) - _border(len(cols))
    for i, j in enumerate(cols):
        full = max([len(table.columns[j].header_text())] + [len(r[j]) for r in rows])
        more = min(max(0, full - widths[i]), max(0, spare))
        widths[i] += more
        spare -= more
    return widths


def terminal_tables(table: Table, width: int) -> list[Any]:
    """The rich tables to print for ``table`` on a console ``width`` columns wide."""
    from rich.table import Table as RichTable
    from rich.text import Text

    rows = table.formatted_rows()
    groups, transpose, empty = fold(table, width)
    notes = [t for t in [table.caption, *table.display_notes()] if t]
    if empty:
        notes.append("left out here for holding no value: "
                     + ", ".join(table.columns[j].header for j in empty))
    out = []
    if transpose:
        keep = [j for j in range(len(table.columns)) if j not in empty]
        hw = max(_need(table.columns[j].header_text(), []) for j in keep)
        for i, row in enumerate(rows, 1):
            rt = RichTable(title=f"{table.title} (row {i}/{len(rows)})" if table.title else None,
                           show_header=False)
            # a value longer than the whole console folds onto more lines: still never cut
            vw = min(max(len(row[j]) for j in keep), max(1, width - _border(2) - min(hw, 12)))
            rt.add_column(width=max(1, min(max(len(table.columns[j].header_text()) for j in keep),
                                           width - _border(2) - vw)))
            rt.add_column(width=vw, overflow="fold")
            for j in keep:
                rt.add_row(Text(table.columns[j].header_text()), Text(row[j]))
            out.append(rt)
    else:
        for g, cols in enumerate(groups, 1):
            part = f" (part {g}/{len(groups)})" if len(groups) > 1 else ""
            rt = RichTable(title=(table.title + part) if table.title else (part.strip() or None))
            for j, w in zip(cols, _widths(table, rows, cols, width), strict=True):
                c = table.columns[j]
                rt.add_column(Text(c.header_text()), justify="right" if table.is_numeric(j) else "left",
                              width=w)
            for r in rows:
                rt.add_row(*(Text(r[j], no_wrap=table.is_numeric(j)) for j in cols))
            out.append(rt)
    if notes:
        from rich.console import Group

        caption = Text("\n".join(notes))
        return [*out, Group(caption)]
    return out
