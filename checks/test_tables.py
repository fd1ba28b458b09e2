"""Table exporters: one row model rendered to Markdown, CSV, LaTeX, HTML and rich."""

from __future__ import annotations

import csv
import io
import os
import re
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from harness.reporting import (
    FORMATS,
    Column,
    Table,
    TableError,
    format_bytes,
    format_seconds,
    format_si,
    latex_escape,
    load_reference,
    parse_csv_value,
    print_table,
    records_to_table,
    render,
    to_rich,
    with_reference,
    write_table,
)
from harness.results import Metric, ResultRecord

SHA_A = "0123456789abcdef" * 4
SHA_B = "fedcba9876543210" * 4


def record(algorithm="sparq", world_size=2, seed=0, model="tiny-opt", loss=2.5,
           sha=SHA_A, step=0.0125, throughput=("throughput_tokens_per_s", "tokens/s"),
           data_kind=None, **extra_metrics) -> ResultRecord:
    metrics = {
        "payload_bytes_per_step": Metric(3 * 1024 * 1024 + world_size, "bytes", False),
        "messages_per_step": Metric(4 * world_size, "messages", False),
        "peak_memory_bytes": Metric(1536, "bytes", False),
        "step_time_s": Metric(step, "s", False),
        throughput[0]: Metric(123456.0, throughput[1], True),
        "final_loss": Metric(loss, "nats", False),
        "params_sha256": Metric(sha, "sha256"),
        **extra_metrics,
    }
    return ResultRecord(algorithm, {"bits": 4}, world_size, "threads", model, "d", 5, seed,
                        metrics, data_kind=data_kind)


# --------------------------------------------------------------------------- strategies

_specials = st.sampled_from(["_", "%", "&", "#", "$", "{", "}", "\\", "|", "<", ">", '"', "'",
                             ",", "\n", "\r\n", "~", "^", "[", "]", "µ", "↑", "—", "*", "`"])
_text = st.lists(st.one_of(st.characters(blacklist_categories=("Cs", "Cc")), _specials),
                 max_size=10).map("".join)
_cell = st.one_of(st.none(), st.integers(-10**15, 10**15),
                  st.floats(allow_nan=False, allow_infinity=False), _text)


@st.composite
def tables(draw):
    ncols = draw(st.integers(1, 5))
    keys = draw(st.lists(st.text("abcdefghij_", min_size=1, max_size=6), min_size=ncols,
                         max_size=ncols, unique=True))
    columns = [Column(k, draw(_text), draw(st.none() | _text.filter(bool)),
                      draw(st.sampled_from([None, True, False])),
                      draw(st.sampled_from([None, "bytes", "seconds", "si", "sha", ".2f"])))
               for k in keys]
    rows = draw(st.lists(st.lists(_cell, min_size=ncols, max_size=ncols), max_size=5))
    return Table(draw(_text), columns, rows, caption=draw(_text),
                 notes=draw(st.lists(_text, max_size=2)))


# --------------------------------------------------------------------------- CSV


def _same_value(cell: str, v) -> bool:
    if v is None:
        return cell == ""
    if isinstance(v, bool) or isinstance(v, str):
        return cell == (str(v).lower() if isinstance(v, bool) else v)
    if isinstance(v, int):
        return int(cell) == v
    return float(cell) == v


@given(tables())
def test_csv_parses_back_to_the_same_values(table):
    text = render(table, "csv")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == [c.csv_header() for c in table.columns]
    assert len(rows) == 1 + len(table.rows)
    for got, want in zip(rows[1:], table.rows, strict=True):
        assert len(got) == len(want)
        for cell, v in zip(got, want, strict=True):
            assert _same_value(cell, v), (cell, v)
            if v is None or not isinstance(v, str):
                assert parse_csv_value(cell) == v


def test_csv_of_records_keeps_raw_numbers_and_units(tmp_path):
    t = records_to_table([record(), record("mezo", 1, sha=SHA_B)])
    p = write_table(t, tmp_path / "t.csv")
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    head = rows[0]
    assert "payload_bytes_per_step [bytes]" in head and "step_time_s [s]" in head
    assert "params_sha256" in head
    first = dict(zip(head, rows[1], strict=True))
    assert int(first["payload_bytes_per_step [bytes]"]) == 3 * 1024 * 1024 + 2
    assert float(first["step_time_s [s]"]) == 0.0125
    assert first["params_sha256"] == SHA_A  # full digest in CSV
    assert p.read_bytes().count(b"\r\n") == 3


# --------------------------------------------------------------------------- Markdown


def _md_split(line: str) -> list[str]:
    """Split a GFM table line on unescaped pipes and undo the escapes."""
    assert line.startswith("|") and line.endswith("|"), line
    cells, cur, i = [], "", 1
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line):
            cur += line[i + 1]
            i += 2
            continue
        if ch == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    return cells


@given(tables())
def test_markdown_structure(table):
    text = render(table, "md")
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(lines) == 2 + len(table.rows)
    header, sep, *body = lines
    assert re.fullmatch(r"\|(:-+\||-+:\|)+", sep), sep
    assert len(_md_split(sep)) == len(table.columns)
    assert _md_split(header) == [" ".join(c.header_text().split()) or "" for c in table.columns]
    for line, cells in zip(body, table.formatted_rows(), strict=True):
        assert _md_split(line) == [" ".join(s.split()) for s in cells]
    for j, mark in enumerate(_md_split(sep)):
        assert mark.endswith(":") == table.is_numeric(j)
        assert mark.startswith(":") != table.is_numeric(j)


def test_markdown_of_records():
    t = records_to_table([record(), record("mezo", 1, sha=SHA_B)])
    text = render(t, "md")
    assert "| algorithm" in text
    assert "3.00 MiB" in text and "1.50 KiB" in text and "12.5 ms" in text and "123k" in text
    assert SHA_A[:12] in text and SHA_A not in text
    assert "step time [s] ↓" in text and "throughput [tokens/s] ↑" in text
    assert "1024" in text  # the binary base is stated


# --------------------------------------------------------------------------- LaTeX


def _unescaped(line: str, ch: str) -> int:
    return len(re.findall(rf"(?<!\\){re.escape(ch)}", line))


@given(tables())
def test_latex_balanced_and_escaped(table):
    text = render(table, "latex")
    stack = []
    for kind, env in re.findall(r"\\(begin|end)\{(\w+)\}", text):
        if kind == "begin":
            stack.append(env)
        else:
            assert stack and stack.pop() == env
    assert stack == []
    lines = text.splitlines()
    top, mid, bot = (lines.index(r"\toprule"), lines.index(r"\midrule"),
                     lines.index(r"\bottomrule"))
    assert mid - top == 2 and bot - mid - 1 == len(table.rows)
    for line in lines[top + 1:bot]:
        if line == r"\midrule":
            continue
        assert line.endswith(r" \\")
        body = line[: -len(r" \\")]
        assert _unescaped(body, "&") == len(table.columns) - 1
        for ch in "%#_":
            assert _unescaped(body, ch) == 0, (ch, line)
        assert _unescaped(body, "$") % 2 == 0
        braces = re.sub(r"\\[{}]", "", body)
        depth = 0
        for ch in braces:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            assert depth >= 0
        assert depth == 0
        assert "\n" not in body


def test_latex_escapes_specials():
    assert latex_escape("a_b%c&d#e$f{g}h") == r"a\_b\%c\&d\#e\$f\{g\}h"
    assert latex_escape("x\\y~^") == r"x\textbackslash{}y\textasciitilde{}\textasciicircum{}"
    t = Table("T_1 & 50%", [Column("k", "name_x"), Column("v", "val", "s", False)],
              [["a#1", 0.002], ["{b}", None]])
    text = render(t, "latex")
    assert r"\caption{T\_1 \& 50\%}" in text
    assert r"name\_x & val {[}s{]} \ensuremath{\downarrow} \\" in text
    assert r"a\#1 & 2.00 ms \\" in text and r"\{b\} & --- \\" in text
    assert r"\begin{tabular}{lr}" in text and r"\toprule" in text


# --------------------------------------------------------------------------- HTML


class _Checker(HTMLParser):
    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.cells: list[str] = []
        self.headers: list[str] = []
        self.doctype = None
        self._cur: list[str] | None = None

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        self.stack.append(tag)
        if tag in ("td", "th"):
            self._cur = []

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack}")
            return
        self.stack.pop()
        if tag in ("td", "th"):
            (self.cells if tag == "td" else self.headers).append("".join(self._cur))
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur.append(data)


@given(tables())
def test_html_parses_and_holds_every_cell(table):
    text = render(table, "html")
    assert text.startswith("<!DOCTYPE html>")
    p = _Checker()
    p.feed(text)
    p.close()
    assert p.errors == [] and p.stack == []
    assert p.doctype.lower() == "doctype html"
    assert p.headers == [c.header_text() for c in table.columns]
    assert p.cells == [s for row in table.formatted_rows() for s in row]


def test_html_escapes():
    t = Table("<b>x</b>", [Column("k", "a&b")], [["<script>alert(1)</script>"]])
    text = render(t, "html")
    assert "<script>" not in text and "&lt;script&gt;" in text and "a&amp;b" in text
    assert "<title>&lt;b&gt;x&lt;/b&gt;</title>" in text


# --------------------------------------------------------------------------- rich


@given(tables())
def test_rich_printing_does_not_crash(table):
    console = Console(file=io.StringIO(), width=60, record=True, color_system=None)
    print_table(table, console)
    assert console.export_text().strip()


def test_rich_shows_markup_literally():
    t = Table("t", [Column("k", "head [x]", "s", True)], [["[bold]x[/]"], [None]])
    console = Console(file=io.StringIO(), width=120, record=True, color_system=None)
    print_table(t, console)
    out = console.export_text()
    assert "[bold]x[/]" in out and "head [x] [s] ↑" in out
    assert to_rich(t).row_count == 2


# --------------------------------------------------------------------------- records_to_table


def test_records_to_table_columns_and_grouping():
    recs = [record(seed=0, loss=2.0, step=0.01), record(seed=1, loss=3.0, step=0.02),
            record("mezo", 1, throughput=("throughput_samples_per_s", "samples/s"),
                   data_kind="synthetic")]
    t = records_to_table(recs)
    keys = [c.key for c in t.columns]
    assert keys[:4] == ["algorithm", "model", "world_size", "backend"]
    assert keys == ["algorithm", "model", "world_size", "backend", "data_kind", "runs",
                    "payload_bytes_per_step", "messages_per_step", "peak_memory_bytes",
                    "step_time_s", "throughput_tokens_per_s", "throughput_samples_per_s",
                    "final_loss", "params_sha256"]
    rows = t.row_dicts()
    assert len(rows) == 2
    assert rows[0]["runs"] == 2 and rows[0]["final_loss"] == 2.5
    assert rows[0]["step_time_s"] == pytest.approx(0.015)
    assert rows[0]["throughput_samples_per_s"] is None
    assert rows[1]["throughput_tokens_per_s"] is None and rows[1]["data_kind"] == "synthetic"
    col = t.columns[t.column_index("final_loss")]
    assert col.unit == "nats" and col.higher_is_better is False
    assert "↓" in col.header_text()


def test_records_to_table_metric_selection_and_errors():
    recs = [record(), record(sha=SHA_B)]
    t = records_to_table(recs, metrics=["final_loss", "params_sha256"], group_by=("algorithm",))
    assert [c.key for c in t.columns] == ["algorithm", "runs", "final_loss", "params_sha256"]
    assert t.rows == [["sparq", 2, 2.5, "2 distinct"]]
    t = records_to_table(recs, metrics=["final_loss"], group_by=("algorithm", "config.bits"))
    assert t.rows[0][:2] == ["sparq", 4]
    with pytest.raises(TableError, match="no record has metric 'nope'"):
        records_to_table(recs, metrics=["nope"])
    with pytest.raises(TableError, match="different units"):
        records_to_table([record(), record(loss=1.0, x=Metric(1, "s")),
                          record(x=Metric(1, "ms"))], metrics=["x"])
    with pytest.raises(TableError, match="no result records"):
        records_to_table([])


@pytest.mark.parametrize(("fn", "value", "text"), [
    (format_bytes, 0, "0 B"), (format_bytes, 1023, "1023 B"), (format_bytes, 1024, "1.00 KiB"),
    (format_bytes, 1536, "1.50 KiB"), (format_bytes, 5 * 2**20, "5.00 MiB"),
    (format_bytes, 3 * 2**30, "3.00 GiB"),
    (format_seconds, 2.5, "2.50 s"), (format_seconds, 0.0123, "12.3 ms"),
    (format_seconds, 4.5e-6, "4.50 µs"), (format_seconds, 0, "0 s"),
    (format_si, 12, "12"), (format_si, 12345, "12.3k"), (format_si, 2.5e6, "2.50M"),
    (format_si, 1.5, "1.5"), (format_si, 9.999, "9.999"), (format_si, 4.0, "4"),
    (format_si, 0.5, "0.5"), (format_si, 1234.4, "1234"), (format_si, 9999.25, "9999"),
])
def test_human_formats(fn, value, text):
    assert fn(value) == text


def test_column_format_from_unit_and_1024_note():
    t = Table("t", [Column("b", "bytes", "bytes"), Column("t", "time", "s"),
                    Column("r", "rate", "tokens/s"), Column("x", "raw", "bytes", fmt="number"),
                    Column("p", "pct", None, fmt=".1%")],
              [[4096, 0.25, 2.5e6, 4096, 0.125]])
    assert t.formatted_rows() == [["4.00 KiB", "250 ms", "2.50M", "4096", "12.5%"]]
    for fmt in ("md", "latex", "html"):
        assert "1024" in render(t, fmt)
    assert t.notes == []  # the note is added when shown, the table itself is unchanged
    small = Table("t", [Column("b", "bytes", "bytes")], [[12]])
    assert small.display_notes() == []


# --------------------------------------------------------------------------- render / write


def test_unknown_format_lists_choices():
    t = Table("t", [Column("a", "a")], [[1]])
    with pytest.raises(ValueError, match="unknown table format 'xlsx'; choose one of: "
                                         "md, csv, latex, html"):
        render(t, "xlsx")


def test_table_shape_checked():
    with pytest.raises(TableError, match="row 0 has 1 cells, expected 2"):
        Table("t", [Column("a", "a"), Column("b", "b")], [[1]])
    with pytest.raises(TableError, match="duplicate column"):
        Table("t", [Column("a", "a"), Column("a", "b")], [])


def test_dict_rows_are_keyed_by_column_and_checked():
    cols = [Column("a", "a"), Column("b", "b", "s"), Column("c", "c", default=None)]
    by_key = Table("t", cols, [{"b": 0.5, "a": "x", "c": 3}, {"a": "y", "b": 1.0}])
    assert by_key.rows == [["x", 0.5, 3], ["y", 1.0, None]]  # column order, default filled in
    assert by_key.row_dicts()[1] == {"a": "y", "b": 1.0, "c": None}
    positional = Table("t", cols, [["x", 0.5, 3], ["y", 1.0, None]])
    for fmt in FORMATS:
        assert render(by_key, fmt) == render(positional, fmt)
    with pytest.raises(TableError, match=r"row 1 has unknown column key\(s\) 'd'"):
        Table("t", cols, [{"a": "x", "b": 0.5}, {"a": "y", "b": 1.0, "d": 2}])
    with pytest.raises(TableError, match=r"row 0 has no value for column key\(s\) 'b'"):
        Table("t", cols, [{"a": "x", "c": 1}])
    with pytest.raises(TableError, match="'b'"):  # None is a value (missing cell), not a missing key
        Table("t", cols, [{"a": None}])
    assert Table("t", cols, [{"a": None, "b": None}]).rows == [[None, None, None]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_table_atomic_and_by_suffix(tmp_path, fmt):
    t = records_to_table([record()])
    suffix = {"md": ".md", "csv": ".csv", "latex": ".tex", "html": ".html"}[fmt]
    p = write_table(t, tmp_path / "exports" / f"t{suffix}")
    assert p.read_bytes().decode("utf-8") == render(t, fmt)
    assert os.listdir(p.parent) == [p.name]
    q = write_table(t, tmp_path / "other.txt", fmt)
    assert q.read_bytes() == p.read_bytes()
    with pytest.raises(ValueError, match="cannot tell the table format"):
        write_table(t, tmp_path / "t.xlsx")


def test_write_table_keeps_old_file_on_failure(tmp_path, monkeypatch):
    t = records_to_table([record()])
    p = write_table(t, tmp_path / "t.md")
    before = p.read_bytes()
    import harness.results.files as R

    def boom(*a, **k):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(R.os, "fsync", boom)
    with pytest.raises(OSError):
        write_table(records_to_table([record("other")]), p)
    monkeypatch.undo()
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["t.md"]


# --------------------------------------------------------------------------- references

REF_CSV = """\
# SparQ paper, Table 2 (bytes per step at 80 Mbit/s)
table,setting,metric,value,unit,source
t2,sparq,payload_bytes_per_step,2048,bytes,"SparQ Table 2"
t2,sparq,final_loss,2.40,nats,"SparQ Table 2"
t2,mezo,final_loss,n/a,nats,"SparQ Table 2"
t3,sparq,final_loss,9.9,nats,"SparQ Table 3"
"""


def test_load_reference_by_path_and_by_name(tmp_path, monkeypatch):
    ref_dir = tmp_path / "results" / "reference"
    ref_dir.mkdir(parents=True)
    (ref_dir / "sparq.csv").write_text(REF_CSV, encoding="utf-8")
    rows = load_reference(ref_dir / "sparq.csv")
    assert len(rows) == 4
    assert rows[0]["value"] == 2048 and rows[1]["value"] == 2.4 and rows[2]["value"] == "n/a"
    assert rows[0]["source"] == "SparQ Table 2"
    monkeypatch.chdir(tmp_path)
    assert load_reference("sparq") == rows
    with pytest.raises(TableError, match=r"no reference table for 'nope'.*nope\.csv not found"
                                         r".*available: .*sparq"):
        load_reference("nope")
    with pytest.raises(TableError, match="reference table not found"):
        load_reference(tmp_path / "missing.csv")
    (ref_dir / "bad.csv").write_text("table,setting,value\nx,y,1\n", encoding="utf-8")
    with pytest.raises(TableError, match="lacks column.*metric.*unit.*source"):
        load_reference("bad")


def test_with_reference_adds_paper_columns(tmp_path):
    p = tmp_path / "sparq.csv"
    p.write_text(REF_CSV, encoding="utf-8")
    refs = load_reference(p)
    t = records_to_table([record(), record("mezo", 1), record("aqsgd", 2)],
                         metrics=["payload_bytes_per_step", "final_loss"])
    with pytest.raises(TableError, match="repeat setting 'sparq' metric 'final_loss'"):
        with_reference(t, refs)
    t2 = with_reference(t, refs, table_name="t2")
    keys = [c.key for c in t2.columns]
    assert keys == ["algorithm", "model", "world_size", "backend", "payload_bytes_per_step",
                    "paper:payload_bytes_per_step", "final_loss", "paper:final_loss"]
    rows = t2.row_dicts()
    assert rows[0]["paper:payload_bytes_per_step"] == 2048 and rows[0]["paper:final_loss"] == 2.4
    assert rows[1]["paper:final_loss"] == "n/a" and rows[1]["paper:payload_bytes_per_step"] is None
    assert rows[2]["paper:final_loss"] is None
    assert any("SparQ Table 2" in n for n in t2.notes)
    assert [c.key for c in t.columns][-1] == "final_loss"  # the input is not modified
    for fmt in FORMATS:
        assert "(paper)" in render(t2, fmt) or fmt == "csv"
    assert "2.00 KiB" in render(t2, "md")
    t3 = with_reference(t, refs, key=lambda row: f"{row['algorithm']}", table_name="t3")
    assert t3.row_dicts()[0]["paper:final_loss"] == 9.9
    t4 = with_reference(t, [], table_name="t2")
    assert t4.columns == t.columns and "No reference values matched" in t4.notes[-1]


# --------------------------------------------------------------------------- times with their spread


@settings(deadline=None, max_examples=30)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 60))
def test_median_and_iqr_are_torch_quantiles(seed, n):
    import torch

    from harness.stats import median_iqr, quantile

    g = torch.Generator().manual_seed(seed)
    xs = torch.rand(n, generator=g, dtype=torch.float64) * 0.1
    iv = median_iqr(xs.tolist())
    # torch.quantile interpolates linearly, as quantile() does; the median is the middle (or the mean of two)
    assert iv.lo == pytest.approx(torch.quantile(xs, 0.25).item(), rel=1e-12)
    assert iv.hi == pytest.approx(torch.quantile(xs, 0.75).item(), rel=1e-12)
    assert iv.value == pytest.approx(torch.quantile(xs, 0.5).item(), rel=1e-12)
    assert quantile(xs.tolist(), 0.0) == xs.min().item() and quantile(xs.tolist(), 1.0) == xs.max().item()
    assert iv.lo <= iv.value <= iv.hi


def test_an_interval_is_shown_one_way_with_its_unit_once():
    from harness.reporting import format_interval
    from harness.stats import IQR, Interval

    assert format_interval(0.0123, 0.0119, 0.0130, format_seconds) == "12.3 ms [11.9, 13.0]"
    assert format_interval(0.00095, 0.0009, 0.00102, format_seconds) == "950 µs [900 µs, 1.02 ms]"
    assert format_interval(1.234, 1.1, 1.4, ".2f") == "1.23 [1.10, 1.40]"
    t = Table("t", [Column("k", "k"), Column("s", "step time", "s", False, spread=IQR),
                    Column("r", "speed-up", "ratio", True, ".2f", spread="95 % CI", default=None)],
              [dict(k="a", s=Interval(0.0123, 0.0119, 0.013), r=Interval(1.5, 1.25, 1.75)), dict(k="b", s=None)])
    md = render(t, "md")
    assert "12.3 ms [11.9, 13.0]" in md and "1.50 [1.25, 1.75]" in md
    assert f"value [lo, hi] in step time: {IQR}" in md and "value [lo, hi] in speed-up: 95 % CI" in md
    assert t.is_numeric(1) and t.is_numeric(2)
    rows = list(csv.reader(io.StringIO(render(t, "csv"))))
    assert rows[0] == ["k", "s [s]", "s.lo [s]", "s.hi [s]", "r [ratio]", "r.lo [ratio]", "r.hi [ratio]"]
    assert [parse_csv_value(v) for v in rows[1]] == ["a", 0.0123, 0.0119, 0.013, 1.5, 1.25, 1.75]
    assert rows[2] == ["b", "", "", "", "", "", ""]


def test_a_column_with_a_spread_holds_intervals_only():
    from harness.stats import Interval

    with pytest.raises(TableError, match="must be an Interval, not 0.5"):
        Table("t", [Column("s", "step", "s", spread="IQR")], [[0.5]])
    with pytest.raises(TableError, match="declares no spread"):
        Table("t", [Column("s", "step", "s")], [[Interval(0.5, 0.4, 0.6)]])
    with pytest.raises(ValueError, match="lo > hi"):
        Interval(1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="finite"):
        Interval(float("nan"), 0.0, 1.0)


def test_records_table_shows_step_time_and_throughput_with_their_iqr():
    from harness.stats import Interval, median_iqr

    steps = [0.010, 0.012, 0.011, 0.020, 0.013]
    a = record(step=0.012, **{"tokens_per_step": Metric(64, "tokens")})
    a.history = {"step_time_s": steps}
    b = record(seed=1, step=0.5, **{"tokens_per_step": Metric(64, "tokens")})
    b.history = {"step_time_s": [0.5, 0.6]}
    t = records_to_table([a, b], group_by=("algorithm", "seed"))
    rows = t.row_dicts()
    assert rows[0]["step_time_s"] == median_iqr(steps) and rows[0]["step_time_s"].value == 0.012
    tp = rows[0]["throughput_tokens_per_s"]
    assert isinstance(tp, Interval) and tp.value == pytest.approx(64 / 0.012)
    assert tp.lo == pytest.approx(64 / median_iqr(steps).hi) and tp.hi == pytest.approx(64 / median_iqr(steps).lo)
    assert rows[1]["step_time_s"] == Interval(0.55, 0.525, 0.575)
    assert "12.0 ms [11.0, 13.0]" in render(t, "md")
    # records from before the per-step times were kept: the bare value, no invented spread
    old = records_to_table([record()])
    assert old.row_dicts()[0]["step_time_s"] == 0.0125
    assert all(c.spread is None for c in old.columns)
