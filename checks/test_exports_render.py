"""Exported tables render for real: HTML in a headless Chromium (the DOM it
builds holds every header and cell; a screenshot has ink on it) and LaTeX
through pdflatex with booktabs (no error, no missing glyph).

Each check skips, saying why, when its tool is not installed;
``scripts/system-tools.sh`` installs both on Debian (CI runs it).
"""

from __future__ import annotations

import os
import shutil
import string
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks.test_tables import tables
from harness.experiments import Claim, claims_table
from harness.reporting import REFERENCE_COLUMNS, Column, Table, load_reference, render, write_table

PAPERS = ("sparq", "distzo2", "clapping", "protocol", "double-quant")
# every character the project's own labels use that is not plain ASCII
PROJECT_SYMBOLS = "↑↓—–−²³₁₂ᵀ×·≤≥≈→←∞‖√∈∇∂⌈⌉⊙ℓµμ±§τδφαβηλθσεωΣ ũỹ"


def _browser() -> str | None:
    return os.environ.get("COMMBENCH_BROWSER") or next(
        (b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)


needs_browser = pytest.mark.skipif(_browser() is None, reason="no Chromium/Chrome installed "
                                   "(bash scripts/system-tools.sh installs Debian's chromium)")
needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex installed "
                               "(bash scripts/system-tools.sh installs Debian's texlive)")


def _reference_table(paper: str) -> Table:
    rows = load_reference(paper)
    return Table(f"{paper}: the paper's numbers", [Column(c, c) for c in REFERENCE_COLUMNS],
                 [[r[c] for c in REFERENCE_COLUMNS] for r in rows],
                 caption=f"results/reference/{paper}.csv")


def _symbols_table() -> Table:
    text = string.printable.strip() + " " + PROJECT_SYMBOLS
    return Table("every character: " + text,
                 [Column("text", "text ‖x‖²"), Column("bytes", "payload/step", "bytes", False),
                  Column("ratio", "speed-up", "ratio", True, ".2f")],
                 [[text, 123456789, 3.25], [string.punctuation, None, float("nan")], ["", 0, 1e-9]],
                 caption="caption with <b>markup</b> & 50% of {braces}", notes=["note: a_b ≤ c^d"])


def _claims() -> Table:
    return claims_table([Claim("sparq.m", "SparQ", "“more than 3×” lower memory than AQ-SGD", "Table 2", "ratio > 3",
                               "13×", "1.20×", "not supported", "peak tensor bytes, M=2"),
                         Claim("dq.b", "DQ", "AsyLPG needs fewer bits", "Table 1 (left)", "ratio > 1", "7.28×", "—",
                               "not measurable here", "never ran")])


def exported_tables() -> list[Table]:
    return [_symbols_table(), _claims()] + [_reference_table(p) for p in PAPERS]


# --------------------------------------------------------------------------- HTML in Chromium


class _Cells(HTMLParser):
    """Header and data cell texts of the first table in a serialized DOM."""

    def __init__(self):
        super().__init__()
        self.headers: list[str] = []
        self.cells: list[str] = []
        self._cur: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("td", "th"):
            self._cur = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cur is not None:
            (self.cells if tag == "td" else self.headers).append(" ".join("".join(self._cur).split()))
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur.append(data)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _dom_after_render(path: Path, profile: Path) -> str:
    res = _chromium(f"--user-data-dir={profile}", "--dump-dom", path.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _assert_browser_holds(table: Table, dom: str) -> None:
    # The browser repairs malformed markup silently (moving cells out of the
    # table, dropping tags), so its DOM, not our string, is what is compared.
    p = _Cells()
    p.feed(dom)
    norm = [" ".join(s.split()) for s in (c.header_text() for c in table.columns)]
    assert p.headers == norm
    assert p.cells == [" ".join(s.split()) for row in table.formatted_rows() for s in row]
    assert "<script" not in dom.lower()


@needs_browser
@pytest.mark.parametrize("table", exported_tables(), ids=lambda t: t.title.split(":")[0][:20])
def test_html_renders_in_chromium(table, tmp_path):
    path = write_table(table, tmp_path / "t.html")
    _assert_browser_holds(table, _dom_after_render(path, tmp_path / "profile"))


@needs_browser
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables())
def test_html_of_any_table_renders_in_chromium(table, tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    path = write_table(table, d / "t.html")
    _assert_browser_holds(table, _dom_after_render(path, d / "profile"))


@needs_browser
def test_html_screenshot_has_ink(tmp_path):
    import matplotlib.image

    path = write_table(_claims(), tmp_path / "t.html")
    png = tmp_path / "shot.png"
    res = _chromium(f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                    "--window-size=1000,400", path.as_uri())
    assert res.returncode == 0 and png.exists(), res.stderr[-2000:]
    img = matplotlib.image.imread(png)
    dark = (img[..., :3].mean(axis=-1) < 0.5).mean()
    assert 0.001 < dark < 0.5  # text was drawn, and the page is not one dark block


# --------------------------------------------------------------------------- LaTeX with pdflatex


def _compile(body: str, tmp: Path) -> str:
    doc = "\n".join([r"\documentclass{article}", r"\usepackage{booktabs}",
                     r"\usepackage[margin=1cm,landscape]{geometry}", r"\begin{document}", body,
                     r"\end{document}"])
    (tmp / "doc.tex").write_text(doc, encoding="utf-8")
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape",
                          "doc.tex"], cwd=tmp, capture_output=True, text=True, timeout=120, check=False)
    log = (tmp / "doc.log").read_text(errors="replace") if (tmp / "doc.log").exists() else res.stdout
    assert res.returncode == 0 and (tmp / "doc.pdf").stat().st_size > 0, log[-3000:]
    assert "Missing character" not in log, [ln for ln in log.splitlines() if "Missing character" in ln]
    return log


@needs_tex
def test_latex_exports_compile(tmp_path):
    body = "\n\\clearpage\n".join(render(t, "latex") for t in exported_tables())
    log = _compile(body, tmp_path)
    assert "Output written on doc.pdf" in log


@needs_tex
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(max_size=30), min_size=1, max_size=8))
def test_latex_of_any_text_compiles(texts, tmp_path_factory):
    table = Table(texts[0], [Column("k", texts[-1]), Column("v", "value", "bytes", False)],
                  [[t, i] for i, t in enumerate(texts)], caption=" ".join(texts), notes=texts[:2])
    _compile(render(table, "latex"), tmp_path_factory.mktemp("tex"))
