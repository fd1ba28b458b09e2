"""Another commit's copy of a package that imports only itself (extracted with ``git archive``),
imported beside this tree's under a name of its own: the before/after benchmarks time both in
one process."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def load_package(path: str, name: str) -> ModuleType:
    """The package at ``path`` as ``name`` (its relative imports resolve inside it)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
