"""Which experiments exist, in which order ``reproduce all`` runs them, and how
a name is found.

An experiment module registers itself with :func:`experiment`; the registry
imports a module only when one of its names is looked up (``MODULES``), so
nothing outside this package has to import an experiment for it to exist.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError, did_you_mean


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    run: Callable[[str, Path, bool], list]  # (scale, out_dir, quiet) -> tables
    paper: bool = True  # part of ``all``; its tables put the paper's numbers beside ours


# name -> module of this package that defines it
MODULES = {
    "double-quant": "double_quant",
    "clapping": "clapping",
    "protocol": "protocol",
    "sparq": "sparq",
    "distzo2": "distzo2",
    "bandwidth": "bandwidth",
    "foundation": "foundation",
    "scaling": "scaling",
    "codecs": "codecs",
    "sparq-opt125m": "sparq",
    "sparq-activations": "sparq_activations",
    "sparq-gemma": "sparq_gemma",
}
# ``reproduce all``: the papers' experiments, each family's first, the cross-family sweep last
ORDER = ("double-quant", "clapping", "protocol", "sparq", "distzo2", "bandwidth")
SUPPORTING = ("foundation", "scaling", "codecs", "sparq-opt125m", "sparq-activations", "sparq-gemma")  # run by name only

EXPERIMENTS: dict[str, Experiment] = {}


def experiment(name: str, summary: str, *, paper: bool = True):
    """Register the decorated ``run(scale, out_dir, quiet) -> tables`` as experiment ``name``."""
    if name not in MODULES:
        raise RuntimeError(f"experiment {name!r} is not listed in harness.experiments.registry.MODULES")

    def deco(fn):
        EXPERIMENTS[name] = Experiment(name, summary, fn, paper)
        return fn

    return deco


def get_experiment(name: str) -> Experiment:
    if name not in MODULES:
        raise ConfigError(f"unknown experiment {name!r}{did_you_mean(name, [*MODULES, 'all'])}; "
                          f"choose from all, {', '.join(MODULES)}")
    if name not in EXPERIMENTS:
        importlib.import_module(f"{__package__}.{MODULES[name]}")
    return EXPERIMENTS[name]


def all_experiments() -> list[Experiment]:
    """Every experiment, the papers' in ``ORDER`` first, then the supporting ones."""
    return [get_experiment(n) for n in (*ORDER, *SUPPORTING)]
