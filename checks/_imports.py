"""The import graph of the project's packages, drawn from the source with ``ast``.

Every ``import`` and ``from ... import`` counts, also those inside functions
(a lazy import is still a dependency).  Importing ``a.b.c`` from outside
package ``a.b`` also runs ``a/__init__`` and ``a/b/__init__``, so those
package modules are edges too; a module's own enclosing packages are not
(they are already being imported when it runs).  Imports under ``if
TYPE_CHECKING:`` are annotations only and never run, so they are left out.
Names that do not resolve to a module of the tree (third-party packages) are
dropped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    """Dotted name of ``path`` under ``root`` and whether it is a package ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            found[module_name(root, path)[0]] = path
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def imported_names(name: str, is_pkg: bool, tree: ast.AST) -> Iterable[tuple[str, int]]:
    """Absolute dotted names this module imports (a name may be a module or an attribute), with line."""
    package = name if is_pkg else name.rpartition(".")[0]
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            yield stem, node.lineno
            for alias in node.names:
                yield f"{stem}.{alias.name}", node.lineno


def graph(root: Path, packages: Iterable[str]) -> dict[str, dict[str, int]]:
    """``{module: {imported module: first line}}`` over the modules of ``packages``."""
    mods = modules(root, packages)
    edges: dict[str, dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        own = set(_ancestors(name)) | ({name} if is_pkg else set())
        for target, line in imported_names(name, is_pkg, ast.parse(path.read_text(), str(path))):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            for t in [*_ancestors(target), target]:
                if t in mods and t not in own and t != name:
                    edges[name].setdefault(t, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges.get(w, {}))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# The layer rules of ARCHITECTURE.md: (who, may not import, why)
RULES = (
    ("harness.comm", ("harness",), "harness/comm is the bottom layer: it imports nothing else of the harness"),
    ("harness", ("algorithms", "harness.experiments", "harness.cli"),
     "the harness core knows no algorithm and no experiment"),
    ("algorithms", ("harness.cli", "harness.launcher", "harness.progress", "harness.experiments"),
     "an algorithm never imports the launcher, the CLI or an experiment"),
    ("harness.experiments", ("harness.cli",), "experiments are composed by the CLI, not the other way"),
)
# modules a rule's "who" prefix does not cover
EXEMPT = {"harness": ("harness.cli", "harness.experiments"), "harness.comm": ()}


def violations(edges: dict[str, dict[str, int]]) -> list[str]:
    found = []
    for who, banned, why in RULES:
        for mod, targets in edges.items():
            if not _within(mod, who) or any(_within(mod, e) for e in EXEMPT.get(who, ())):
                continue
            for target, line in targets.items():
                if who == "harness.comm" and _within(target, "harness.comm"):
                    continue
                if any(_within(target, b) for b in banned):
                    found.append(f"{mod}:{line} imports {target} ({why})")
    return found
