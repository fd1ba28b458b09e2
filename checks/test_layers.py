"""The layers of ARCHITECTURE.md hold: ``harness/comm`` ← harness core ←
``algorithms/`` ← ``harness/experiments`` ← ``harness/cli.py``, no cycle, no
back-edge, no import for its side effect in a family's ``__init__``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from checks._imports import cycles, graph, violations

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "algorithms")


@pytest.fixture(scope="module")
def edges():
    return graph(ROOT, PACKAGES)


def test_the_graph_sees_every_module_and_their_imports(edges):
    # the check is only as good as its graph: known edges of each layer are in it
    assert len(edges) > 70
    assert "harness.comm.base" in edges["harness.comm.threads"]
    assert "harness.launcher" in edges["harness.progress"]
    assert "algorithms.codecs" in edges["algorithms.zo.wire"]
    assert "harness.experiments.runner" in edges["harness.experiments.sparq"]
    assert "harness.experiments" in edges["harness.cli"]  # a lazy import inside a function counts


def test_no_import_cycle(edges):
    assert cycles(edges) == []


def test_no_layer_back_edge(edges):
    assert violations(edges) == []


def test_family_inits_import_nothing():
    for init in [ROOT / "algorithms" / "__init__.py",
                 *(p / "__init__.py" for p in (ROOT / "algorithms").iterdir()
                   if p.is_dir() and p.name not in ("codecs", "__pycache__"))]:
        tree = ast.parse(init.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        assert imports == [], f"{init.relative_to(ROOT)} imports for a side effect"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TINY_TREE = {
    "harness/__init__.py": "", "harness/comm/__init__.py": "", "harness/comm/base.py": "import torch\n",
    "harness/launcher.py": "from .comm import base\n", "harness/cli.py": "from .experiments import run\n",
    "harness/experiments/__init__.py": "", "harness/experiments/run.py": "from algorithms.fam import algo\n",
    "algorithms/__init__.py": "", "algorithms/fam/__init__.py": "",
    "algorithms/fam/algo.py": "from harness.comm.base import x\n",
}


@pytest.mark.parametrize("plant, expected", [
    ("harness/launcher.py", "harness.launcher:3 imports algorithms.fam.algo"),          # core -> algorithms
    ("harness/comm/base.py", "harness.comm.base:3 imports harness.launcher"),           # comm -> core
    ("algorithms/fam/algo.py", "algorithms.fam.algo:3 imports harness.experiments.run"),  # algorithm -> experiment
    ("harness/experiments/run.py", "harness.experiments.run:3 imports harness.cli"),
])
def test_a_planted_back_edge_is_caught(tmp_path, plant, expected):
    _write(tmp_path, TINY_TREE)
    assert violations(graph(tmp_path, PACKAGES)) == []
    target = {"harness/launcher.py": "algorithms.fam.algo", "harness/comm/base.py": "harness.launcher",
              "algorithms/fam/algo.py": "harness.experiments.run", "harness/experiments/run.py": "harness.cli"}[plant]
    path = tmp_path / plant
    path.write_text(path.read_text() + f"def f():\n    import {target}\n")
    found = violations(graph(tmp_path, PACKAGES))
    assert any(v.startswith(expected) for v in found), found


def test_a_planted_cycle_is_caught(tmp_path):
    _write(tmp_path, TINY_TREE)
    assert cycles(graph(tmp_path, PACKAGES)) == []
    # a package __init__ re-exporting its own modules is not a cycle, nor is a chain
    _write(tmp_path, {"algorithms/fam/other.py": "from . import algo\n",
                      "algorithms/fam/__init__.py": "from .algo import f\nfrom .other import g\n"})
    assert cycles(graph(tmp_path, PACKAGES)) == []
    _write(tmp_path, {"algorithms/fam/algo.py": "def f():\n    from .other import g\n"})  # lazy, still a cycle
    assert cycles(graph(tmp_path, PACKAGES)) == [["algorithms.fam.algo", "algorithms.fam.other"]]
    # ... unless the import is for annotations only
    _write(tmp_path, {"algorithms/fam/algo.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from .other import g\n"})
    assert cycles(graph(tmp_path, PACKAGES)) == []
    # importing a package from outside runs its __init__: harness.launcher -> algorithms.fam (init)
    # -> algorithms.fam.algo -> harness.launcher is a cycle through the package
    _write(tmp_path, {"algorithms/fam/algo.py": "import harness.launcher\n", "algorithms/fam/other.py": "",
                      "harness/launcher.py": "from algorithms.fam.other import g\n"})
    assert ["algorithms.fam", "algorithms.fam.algo", "harness.launcher"] in cycles(graph(tmp_path, PACKAGES))


def test_importing_the_codecs_loads_no_model_zoo():
    code = ("import sys, json, algorithms.codecs; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('transformers', 'sklearn', 'harness', 'matplotlib', 'rich'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert not [m for m in loaded if not m.startswith("harness.seeding") and m != "harness"], loaded
