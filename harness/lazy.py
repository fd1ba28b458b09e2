"""A package's names re-exported from its submodules, each submodule imported on first use
(PEP 562): the package imports fast, and a torch-free submodule stays torch-free."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """The package's ``__getattr__``: ``names`` maps each exported name to its submodule."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    return __getattr__
