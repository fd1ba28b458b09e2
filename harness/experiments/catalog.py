"""The experiments' section of the torch-free catalog, and the command that
regenerates the whole catalog: ``python -m harness.experiments.catalog``.

The catalog module (``harness/catalog.py``) is harness core, which may not
import ``harness.experiments`` (ARCHITECTURE.md); so the experiments' names,
summaries and paper flags are read here, where the registry lives, and handed
to it.
"""

from __future__ import annotations

from harness import catalog

from .registry import all_experiments


def build_experiments() -> list[dict]:
    """Every experiment as ``list experiments`` shows it (imports every experiment module)."""
    return [{"name": e.name, "summary": e.summary, "paper": e.paper} for e in all_experiments()]


if __name__ == "__main__":
    print(f"wrote {catalog.write(build_experiments()).name}")
