"""Algorithm registry: the harness looks algorithms up by name.

The harness knows an algorithm only through its ``AlgorithmSpec``: a name, a
parameter dataclass, a world-size rule and an SPMD rank function.  The modules
that define them are named in one explicit list, ``FAMILY_MODULES``, and
imported the first time a name is looked up (they register themselves with
:func:`register`); the harness core never imports ``algorithms`` statically
(see ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .config import (
    ConfigError,
    NoParams,
    RunConfig,
    check_finite_params,
    did_you_mean,
    params_from_dict,
    split_config_dict,
)


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    family: str
    summary: str
    run: Callable  # run(ctx: RankContext) -> None (reports through ctx)
    params: type = NoParams
    min_world: int = 1
    max_world: int | None = None
    paper: str | None = None
    check: Callable[[RunConfig], str | None] | None = None  # extra fit rules
    # Models the algorithm trains, when not the transformer presets of
    # harness.models (e.g. a convex problem); the first is the default.
    models: tuple[str, ...] | None = None
    default_data: str | dict[str, str] | None = None  # a name, or model -> name

    def validate(self, cfg: RunConfig) -> None:
        w = cfg.world_size
        if w < self.min_world or (self.max_world is not None and w > self.max_world):
            rng = f"{self.min_world}" if self.max_world == self.min_world else (
                f">= {self.min_world}" if self.max_world is None else f"{self.min_world}..{self.max_world}")
            raise ConfigError(f"{self.name} needs world size {rng}, got {w}")
        if self.check is not None:
            msg = self.check(cfg)
            if msg:
                raise ConfigError(f"{self.name}: {msg}")


ALGORITHMS: dict[str, AlgorithmSpec] = {}

# Every module that registers algorithms (or data sets), by family.
FAMILY_MODULES = (
    "algorithms.pipeline.sgd",           # fo-sgd, pipeline-sgd
    "algorithms.pipeline.compressed",    # direct-compress, aq-sgd, clapping-fc, clapping-fu
    "algorithms.protocol.pipeline",      # protocol, protocol-central
    "algorithms.zo.mezo",                # mezo
    "algorithms.zo.sparq",               # sparq
    "algorithms.zo.distzo2",             # zo2, distzo2-pertp, distzo2-ddp, distzo2-2d
    "algorithms.dataparallel.asylpg",    # asylpg, sparse-asylpg, acc-asylpg, asyfpg, ... (+ convex data)
)


def register(name: str, **kw) -> Callable:
    def deco(fn):
        if name in ALGORITHMS:
            raise RuntimeError(f"algorithm {name!r} registered twice")
        ALGORITHMS[name] = AlgorithmSpec(name=name, run=fn, **kw)
        return fn

    return deco


def load_all() -> dict[str, AlgorithmSpec]:
    """Import every module of ``FAMILY_MODULES`` (each registers its algorithms once)."""
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
    spec.validate(cfg)
    return cfg


def config_from_dict(d) -> RunConfig:
    """The RunConfig that ``RunConfig.to_dict()`` wrote (e.g. as JSON), validated as
    ``make_config`` validates a new one: the launcher hands its ranks their config
    this way, so no rank unpickles anything."""
    algorithm, run, params = split_config_dict(d)
    spec = get_algorithm(algorithm)
    return make_config(algorithm, params=params_from_dict(spec.params, params), **run)
