"""checks/README.md stays true: every check it names exists, every core property and every
paper has a check, and every check file is in one of its groups."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness.registry import PAPERS

HERE = Path(__file__).resolve().parent
CORE = ("lossless subspace reconstruction", "unbiased quantiser", "identical DDP / PertP results",
        "seed-consistent ZO updates")


def _sections() -> dict[str, list[list[str]]]:
    """``### heading`` -> the rows (cells) of the table under it, and the groups' table."""
    out: dict[str, list[list[str]]] = {}
    head = None
    for line in (HERE / "README.md").read_text().splitlines():
        if line.startswith("#"):
            head = line.lstrip("#").strip()
        elif line.startswith("| ") and not line.startswith("|---") and head is not None:
            out.setdefault(head, []).append([c.strip() for c in line.strip("|").split("|")])
    return {h: rows[1:] for h, rows in out.items()}  # without each table's header row


def _tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_named_check_exists_and_every_row_names_its_bug():
    rows = [r for h, rs in _sections().items() if h in ("Core", *PAPERS) for r in rs]
    assert len(rows) >= len(CORE) + len(PAPERS)
    for prop, check, bug in rows:
        file, _, test = check.strip("`").partition("::")
        assert (HERE / file).is_file(), f"{prop}: no check file {file}"
        assert test in _tests(HERE / file), f"{prop}: no check {test} in {file}"
        assert bug, f"{prop}: which planted bug does {test} catch?"


def test_every_core_property_and_every_paper_has_a_check():
    sections = _sections()
    assert [r[0] for r in sections["Core"]] == list(CORE)
    assert all(sections.get(key) for key in PAPERS), "a paper without a property and its check"


def test_every_check_file_is_in_one_group():
    groups = [f for _, files in _sections()["Check files by what they test"]
              for f in re.findall(r"`(test_\w+\.py)`", files)]
    assert sorted(groups) == sorted(p.name for p in HERE.glob("test_*.py"))
