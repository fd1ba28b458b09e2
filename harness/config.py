"""Typed run configuration, validated on construction.

A run is ``RunConfig`` (what every algorithm shares: model, data, world,
backend, steps, ...) plus the algorithm's own parameter dataclass in
``params``.  ``--set key=value`` on the command line reaches either, by
field name, with the value parsed by the field's declared type.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the message is one line for the user."""


DTYPES = ("float32", "float64")
NETS = ("none", "netns")
MEMORY_METERS = ("rss", "tensor", "pass")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")


def parse_rate(rate: str) -> float:
    """tc-style rate ('80mbit', '1gbit') -> bits per second."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise ConfigError(f"bandwidth {rate!r} is not a rate like 80mbit, 1gbit or 500kbit")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    bps = float(m.group(1)) * scale
    if bps <= 0:
        raise ConfigError("bandwidth must be > 0")
    return bps


_FAULT = re.compile(r"^(\d+)@(\d+)(:exit|:raise)?$")


def parse_fault(spec: str, world_size: int) -> tuple[int, int, str]:
    """'1@3' -> (rank 1, step 3, 'raise'); '1@3:exit' -> (1, 3, 'exit')."""
    m = _FAULT.match(spec.strip())
    if not m:
        raise ConfigError(f"inject_fault {spec!r} is not RANK@STEP or RANK@STEP:exit")
    rank, step = int(m.group(1)), int(m.group(2))
    if rank >= world_size:
        raise ConfigError(f"inject_fault names rank {rank} in a world of size {world_size}")
    return rank, step, (m.group(3) or ":raise")[1:]


@dataclass(frozen=True)
class NoParams:
    """For algorithms without parameters of their own."""


@dataclass(frozen=True)
class RunConfig:
    algorithm: str
    model: str = "tiny-opt"
    data: str = "synthetic-markov"
    world_size: int = 1
    backend: str = "threads"
    steps: int = 20
    seed: int = 0
    batch_size: int = 8
    seq_len: int = 32
    micro_batches: int = 2
    dtype: str = "float32"
    timeout_s: float = 120.0
    latency_ms: float = 0.0
    metered: bool = True
    net: str = "none"
    bandwidth: str | None = None
    threads_per_rank: int = 1
    # Memory meters (harness.rank_meters): "rss" only; "tensor" also counts live
    # tensor storages (peak_tensor_bytes) in the same run, whose step times then
    # carry the counter's cost (a Python hook on every aten op on CPU); "pass"
    # times a run without it and takes peak_tensor_bytes from a second, memory-only
    # run of the same config.  CUDA ranks always report max_memory_allocated.
    memory: str = "rss"
    # Fault injection for failure-handling checks: "RANK@STEP" raises in that
    # rank at that step; "RANK@STEP:exit" makes the process die abruptly.
    inject_fault: str | None = None
    params: Any = field(default_factory=NoParams)

    def __post_init__(self):
        from .comm import BACKENDS

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(self.backend in BACKENDS, f"unknown backend {self.backend!r}; choose from {', '.join(BACKENDS)}")
        need(self.world_size >= 1, f"world size must be >= 1, got {self.world_size}")
        need(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.seq_len >= 2, f"seq_len must be >= 2, got {self.seq_len}")
        need(self.micro_batches >= 1, f"micro_batches must be >= 1, got {self.micro_batches}")
        need(self.batch_size % self.micro_batches == 0,
             f"batch_size {self.batch_size} is not divisible by micro_batches {self.micro_batches}")
        need(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        need(self.timeout_s > 0, "timeout_s must be > 0")
        need(self.latency_ms >= 0, "latency_ms must be >= 0")
        need(self.threads_per_rank >= 1, "threads_per_rank must be >= 1")
        need(self.seed >= 0, "seed must be >= 0")
        need(self.memory in MEMORY_METERS,
             f"memory must be one of {', '.join(MEMORY_METERS)}, got {self.memory!r}")
        need(self.net in NETS, f"net must be one of {', '.join(NETS)}, got {self.net!r}")
        if self.net == "netns":
            need(self.backend == "gloo", "--net netns needs --backend gloo (one process per rank)")
        if self.inject_fault is not None:
            parse_fault(self.inject_fault, self.world_size)
        if self.bandwidth is not None:
            need(self.net == "netns", "--bandwidth needs --net netns")
            parse_rate(self.bandwidth)

    @property
    def torch_dtype(self):
        import torch

        return {"float32": torch.float32, "float64": torch.float64}[self.dtype]

    def to_dict(self) -> dict:
        """Plain JSON values (tuples become lists)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        d["params"] = dataclasses.asdict(self.params)
        return _jsonable(d)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _parse_value(text: str, tp, key: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if text.lower() in ("none", "null", ""):
            return None
        return _parse_value(text, args[0], key)
    if tp is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--set {key}={text}: expected true or false")
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: expected {tp.__name__}") from None
    if origin is tuple or tp is tuple:
        inner = (typing.get_args(tp) or (str,))[0]
        return tuple(_parse_value(t, inner, key) for t in text.split(",") if t)
    return text


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair or pair.startswith("="):
            raise ConfigError(f"--set {pair!r}: expected key=value")
        k, v = pair.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def apply_sets(cfg: RunConfig, sets: dict[str, str]) -> RunConfig:
    """Return cfg with --set overrides applied to RunConfig or its params."""
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"algorithm", "params"}
    run_hints = typing.get_type_hints(RunConfig)
    param_hints = typing.get_type_hints(type(cfg.params))
    run_over, param_over = {}, {}
    for k, v in sets.items():
        if k in param_hints:
            param_over[k] = _parse_value(v, param_hints[k], k)
        elif k in run_fields:
            run_over[k] = _parse_value(v, run_hints[k], k)
        else:
            known = sorted(set(param_hints) | run_fields)
            raise ConfigError(f"--set {k}: unknown key for {cfg.algorithm}; known keys: {', '.join(known)}")
    try:
        params = dataclasses.replace(cfg.params, **param_over) if param_over else cfg.params
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set: {e}") from None
    return dataclasses.replace(cfg, params=params, **run_over)
