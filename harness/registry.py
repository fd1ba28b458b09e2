"""Algorithm registry: the harness looks algorithms up by name.

An algorithm is *declared* (:class:`AlgorithmSpec`): its name, family, paper
key, parameter dataclass, world-size rule, models and default data, and the
dotted paths of its rank function and extra fit rule.  The declarations live
in torch-free modules, one per family (``algorithms/<family>/params.py``),
named in ``FAMILY_MODULES`` and imported the first time a name is looked up;
so ``commbench --help``, ``list`` and ``describe`` read them without torch.
The rank function's module (which imports torch) is imported only when a rank
runs.  The harness core never imports ``algorithms`` statically (see
ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import (
    ConfigError,
    NoParams,
    RunConfig,
    check_finite_params,
    did_you_mean,
    params_from_dict,
    split_config_dict,
)

# The papers, by the one key that algorithms, experiments, results/reference/<key>.csv and the
# claims share; the value is the name tables and claims show.
PAPERS = {
    "sparq": "SparQ",
    "distzo2": "DistZO2",
    "clapping": "Clapping",
    "protocol": "Protocol Models",
    "double-quant": "double quantisation",
}


def param(default, doc: str):
    """A parameter field with its one-line meaning (what ``describe`` shows)."""
    return field(default=default, metadata={"doc": doc})


_IMPORTING = threading.Lock()


def resolve(path: str | Callable) -> Callable:
    """``"package.module:name"`` -> the object, importing the module now; a callable as given.

    One import at a time: the ranks of the threads backend resolve their rank function at once,
    and a second thread must not see the module (or transformers under it) half imported."""
    if callable(path):
        return path
    module, _, name = path.partition(":")
    with _IMPORTING:
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    family: str
    summary: str
    # the rank function, run(ctx: RankContext) -> ctx.finish(...): "module:function", imported when
    # a rank runs (a callable is taken as it is, e.g. by a check)
    entry: str | Callable
    params: type = NoParams
    min_world: int = 1
    max_world: int | None = None
    paper: str | None = None  # a key of PAPERS; None: a reference of this harness
    cites: tuple[str, ...] = ()  # the paper's sections and equations the code follows
    # extra fit rule, (cfg) -> message or None: "module:function", imported when a config is checked
    check: str | Callable | None = None
    # Models the algorithm trains, when not the transformer presets of
    # harness.models (e.g. a convex problem); the first is the default.
    models: tuple[str, ...] | None = None
    default_data: str | dict[str, str] | None = None  # a name, or model -> name

    def __post_init__(self):
        if self.paper is not None and self.paper not in PAPERS:
            raise ValueError(f"{self.name}: paper {self.paper!r} is not one of {', '.join(PAPERS)}")
        if not dataclasses.is_dataclass(self.params):
            raise TypeError(f"{self.name}: params must be a dataclass")

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0] if isinstance(self.entry, str) else self.entry.__module__

    def run(self, ctx):
        return resolve(self.entry)(ctx)

    def world_rule(self) -> str:
        lo, hi = self.min_world, self.max_world
        return f"{lo}" if hi == lo else (f">= {lo}" if hi is None else f"{lo}..{hi}")

    def param_rows(self) -> list[tuple[str, str, object, str]]:
        """``(name, type, default, meaning)`` of each parameter, from the dataclass alone."""
        hints = typing.get_type_hints(self.params)
        return [(f.name, _type_name(hints[f.name]), f.default, f.metadata.get("doc", ""))
                for f in dataclasses.fields(self.params)]

    def validate(self, cfg: RunConfig) -> None:
        w = cfg.world_size
        if w < self.min_world or (self.max_world is not None and w > self.max_world):
            raise ConfigError(f"{self.name} needs world size {self.world_rule()}, got {w}")
        if self.check is not None:
            msg = resolve(self.check)(cfg)
            if msg:
                raise ConfigError(f"{self.name}: {msg}")


def _type_name(tp) -> str:
    args = typing.get_args(tp)
    if tp is type(None):
        return "None"
    if args and typing.get_origin(tp) is not tuple:  # a union
        return " | ".join(_type_name(a) for a in args)
    if args:
        return f"tuple[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


ALGORITHMS: dict[str, AlgorithmSpec] = {}

# Every module that declares algorithms, one per family; torch-free.
FAMILY_MODULES = (
    "algorithms.pipeline.params",      # fo-sgd, pipeline-sgd, direct-compress, aq-sgd, clapping-fc, clapping-fu
    "algorithms.protocol.params",      # protocol, protocol-central
    "algorithms.zo.params",            # mezo, sparq, zo2, distzo2-pertp, distzo2-ddp, distzo2-2d
    "algorithms.dataparallel.params",  # asylpg, sparse-asylpg, acc-asylpg, asyfpg, ...
)


def declare(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add one algorithm (a family's params module, or a check's own toy)."""
    if spec.name in ALGORITHMS:
        raise RuntimeError(f"algorithm {spec.name!r} declared twice")
    ALGORITHMS[spec.name] = spec
    return spec


def load_all() -> dict[str, AlgorithmSpec]:
    """Import every module of ``FAMILY_MODULES`` (each declares its algorithms once)."""
    for name in FAMILY_MODULES:
        importlib.import_module(name)
    return ALGORITHMS


def get_algorithm(name: str) -> AlgorithmSpec:
    load_all()
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}{did_you_mean(name, ALGORITHMS)}; "
                          f"choose from {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


def make_config(algorithm: str, **overrides) -> RunConfig:
    """A validated RunConfig with the algorithm's default params (and overrides)."""
    spec = get_algorithm(algorithm)
    if spec.models and overrides.get("model") is None:
        overrides["model"] = spec.models[0]
    if spec.default_data and overrides.get("data") is None:
        d = spec.default_data
        overrides["data"] = d.get(overrides.get("model"), next(iter(d.values()))) if isinstance(d, dict) else d
    params = overrides.pop("params", None)
    if isinstance(params, dict):
        try:
            params = spec.params(**params)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{algorithm}: {e}") from None
    if params is not None:
        check_finite_params(params)
    cfg = RunConfig(algorithm=algorithm, params=params if params is not None else spec.params(), **overrides)
    validate(spec, cfg)
    return cfg


def validate(spec: AlgorithmSpec, cfg: RunConfig) -> None:
    """Every rule a run config must meet, from the declarations (the one place they are
    checked): the model and data exist, the world size fits, the algorithm's own fit rule.
    What the machine must provide (installed packages, CUDA) is the launcher's check."""
    from .datasets import DECLARED as DATA
    from .models.presets import PRESETS

    models = spec.models if spec.models is not None else tuple(PRESETS)
    if cfg.model not in models:
        raise ConfigError(f"unknown model {cfg.model!r} for {spec.name}{did_you_mean(cfg.model, models)}; "
                          f"choose from {', '.join(models)}")
    if cfg.data not in DATA:
        raise ConfigError(f"unknown data {cfg.data!r}{did_you_mean(cfg.data, DATA)}; "
                          f"choose from {', '.join(DATA)}")
    preset, modality = PRESETS.get(cfg.model), DATA[cfg.data].modality
    if preset is not None:  # a transformer preset, not a problem of a family (logreg-*, mlp-*)
        if modality == "table":
            raise ConfigError(f"{cfg.algorithm}: data {cfg.data!r} is a feature table, not token data for "
                              f"the model {cfg.model!r}; choose token data (commbench list data), or a "
                              "problem that reads tables (asylpg --model logreg-digits, ...)")
        if modality == "classify" and preset.task != "classify":
            raise ConfigError(f"{cfg.data} is a classification task; model {cfg.model!r} is a "
                              f"{preset.task!r} model (use a classifier preset, e.g. minilm-l6)")
        if modality != "classify" and preset.task == "classify":
            raise ConfigError(f"model {cfg.model!r} is a classifier; {cfg.data} has no class labels "
                              "(use a labelled task, e.g. tweets-sentiment)")
        if cfg.head != "fresh" and preset.task != "classify":
            raise ConfigError(f"head={cfg.head} applies to classifier presets; {cfg.model!r} is a "
                              f"{preset.task!r} model")
        if cfg.head != "fresh" and preset.prompt is not None:
            raise ConfigError(f"head={cfg.head}: {cfg.model!r} scores label words with its own LM head "
                              "(prompt-based, nothing to fit); leave head=fresh")
    spec.validate(cfg)


def config_from_dict(d) -> RunConfig:
    """The RunConfig that ``RunConfig.to_dict()`` wrote (e.g. as JSON), validated as
    ``make_config`` validates a new one: the launcher hands its ranks their config
    this way, so no rank unpickles anything."""
    algorithm, run, params = split_config_dict(d)
    spec = get_algorithm(algorithm)
    return make_config(algorithm, params=params_from_dict(spec.params, params), **run)
