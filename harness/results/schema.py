"""Result records: schema ``commbench.result/1`` and its validation.

One JSON file per run::

    {"schema": "commbench.result/1", "algorithm": ..., "config": {...},
     "world_size": 2, "backend": "gloo", "model": "tiny-opt", "data": ..., "steps": 20,
     "seed": 0, "metrics": {name: {"value": ..., "unit": ..., "higher_is_better": ...}},
     "per_rank": [{"rank": 0, "metrics": {...}}], "env": {...}}

plus the optional keys ``data_kind`` ("real" | "synthetic"), ``history``
(name -> per-step list) and ``created`` (ISO 8601 time).  ``env`` is free-form JSON, but
``env.load_before`` / ``env.load_after`` (the 1, 5, 15 min load averages at the
run's start and end, written by the launcher since records carry the load) must be three
numbers >= 0 when present; older records without them load as they are.

A record is validated whole: an invalid field raises :class:`ResultError`
naming its source and giving a one-line reason.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "commbench.result/1"

REQUIRED_METRICS = (
    "payload_bytes_per_step",
    "messages_per_step",
    "peak_memory_bytes",
    "step_time_s",
    "final_loss",
    "params_sha256",
)
THROUGHPUT_METRICS = ("throughput_tokens_per_s", "throughput_samples_per_s")
DATA_KINDS = ("real", "synthetic")

_TOP_KEYS_REQUIRED = (
    "schema", "algorithm", "config", "world_size", "backend", "model", "data",
    "steps", "seed", "metrics", "per_rank", "env",
)
_TOP_KEYS_OPTIONAL = ("data_kind", "history", "created")
_METRIC_KEYS = ("value", "unit", "higher_is_better", "stderr")


class ResultError(ValueError):
    """A result record or file is invalid; the message is one line, prefixed by its source."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tname(x: Any) -> str:
    return "null" if x is None else type(x).__name__


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """One measured value with its unit (and optionally its direction and standard error)."""

    value: float | int | str
    unit: str
    higher_is_better: bool | None = None
    stderr: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float, str)):
            raise ValueError(f"value must be a number or a string, not {_tname(self.value)}")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise ValueError(f"value {self.value!r} is not finite")
        if not isinstance(self.unit, str):
            raise ValueError(f"unit must be a string, not {_tname(self.unit)}")
        if not self.unit.strip():
            raise ValueError("has no unit")
        if self.higher_is_better is not None and not isinstance(self.higher_is_better, bool):
            raise ValueError(
                f"higher_is_better must be true, false or null, not {_tname(self.higher_is_better)}")
        if self.stderr is not None:
            if not _is_number(self.stderr):
                raise ValueError(f"stderr must be a number or null, not {_tname(self.stderr)}")
            if not math.isfinite(self.stderr) or self.stderr < 0:
                raise ValueError(f"stderr {self.stderr!r} must be finite and >= 0")
            if isinstance(self.value, str):
                raise ValueError("a string value cannot have a stderr")

    @property
    def is_numeric(self) -> bool:
        return _is_number(self.value)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value, "unit": self.unit,
                             "higher_is_better": self.higher_is_better}
        if self.stderr is not None:
            d["stderr"] = self.stderr
        return d

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "metric") -> Metric:
        """Build from its JSON form; raises ValueError (message starts with ``where``)."""
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be an object, not {_tname(d)}")
        unknown = sorted(set(d) - set(_METRIC_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}")
        if "value" not in d:
            raise ValueError(f"{where} has no value")
        if "unit" not in d:
            raise ValueError(f"{where} has no unit")
        try:
            return cls(value=d["value"], unit=d["unit"],
                       higher_is_better=d.get("higher_is_better"), stderr=d.get("stderr"))
        except ValueError as exc:
            raise ValueError(f"{where} {exc}") from None


def _metrics_from_dict(raw: Any, where: str) -> dict[str, Metric]:
    """``where`` names the container: "" for the top-level metrics, "per_rank[i]" otherwise."""
    label = f"{where} " if where else ""
    if not isinstance(raw, dict):
        raise ValueError(f"{label}'metrics' must be an object, not {_tname(raw)}")
    out: dict[str, Metric] = {}
    for name, m in raw.items():
        if not name:
            raise ValueError(f"{label}'metrics' has a metric with an empty name")
        out[name] = Metric.from_dict(m, where=f"{label}metric {name!r}")
    return out


def _check_json_value(x: Any, where: str, depth: int = 0) -> None:
    """Plain JSON only: str keys, finite numbers, no tuples or other objects."""
    if depth > 64:
        raise ValueError(f"{where} is nested too deeply")
    if x is None or isinstance(x, (str, bool, int)):
        return
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"{where} contains a non-finite number {x!r}")
        return
    if isinstance(x, list):
        for i, v in enumerate(x):
            _check_json_value(v, f"{where}[{i}]", depth + 1)
        return
    if isinstance(x, dict):
        for k, v in x.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-string key {k!r}")
            _check_json_value(v, f"{where}.{k}", depth + 1)
        return
    raise ValueError(f"{where} contains a {_tname(x)}, which is not plain JSON")


# --------------------------------------------------------------------------- records


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class ResultRecord:
    """One run's result; mirrors the JSON file one to one (``schema`` is implied)."""

    algorithm: str
    config: dict[str, Any]
    world_size: int
    backend: str
    model: str
    data: str
    steps: int
    seed: int
    metrics: dict[str, Metric]
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    data_kind: str | None = None
    history: dict[str, list] = field(default_factory=dict)
    created: str | None = field(default_factory=_now_iso)

    # -- validation -------------------------------------------------------------------
    def validate(self, source: str | os.PathLike | None = None) -> ResultRecord:
        """Check every field; raise :class:`ResultError` prefixed by ``source``. Returns self."""
        try:
            self._validate()
        except ValueError as exc:
            raise ResultError(f"{_src(source)}: {exc}") from None
        return self

    def _validate(self) -> None:
        for name in ("algorithm", "backend", "model", "data"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name!r} must be a non-empty string, not {v!r}")
        for name in ("world_size", "steps", "seed"):
            v = getattr(self, name)
            if not _is_int(v):
                raise ValueError(f"{name!r} must be an integer, not {_tname(v)}")
        if self.world_size < 1:
            raise ValueError(f"'world_size' must be >= 1, not {self.world_size}")
        if self.steps < 0:
            raise ValueError(f"'steps' must be >= 0, not {self.steps}")
        for name in ("config", "env"):
            v = getattr(self, name)
            if not isinstance(v, dict):
                raise ValueError(f"{name!r} must be an object, not {_tname(v)}")
            _check_json_value(v, name)
        for key in ("load_before", "load_after"):  # optional: older records lack them
            load = self.env.get(key)
            if load is not None and not (isinstance(load, list) and len(load) == 3
                                         and all(_is_number(x) and x >= 0 for x in load)):
                raise ValueError(f"env {key!r} must be the 1, 5 and 15 min load averages "
                                 f"(3 numbers >= 0) or null, not {load!r}")
        self._validate_metrics(self.metrics, "")
        missing = [m for m in REQUIRED_METRICS if m not in self.metrics]
        if not any(t in self.metrics for t in THROUGHPUT_METRICS):
            missing.append(" or ".join(THROUGHPUT_METRICS))
        if missing:
            raise ValueError(f"missing required metric(s): {', '.join(missing)}")
        for name in REQUIRED_METRICS + THROUGHPUT_METRICS:
            if name in self.metrics and name != "params_sha256":
                if not self.metrics[name].is_numeric:
                    raise ValueError(f"metric {name!r} must be numeric, not "
                                     f"{_tname(self.metrics[name].value)}")
        sha = self.metrics["params_sha256"].value
        if not (isinstance(sha, str) and len(sha) == 64
                and all(c in "0123456789abcdef" for c in sha)):
            raise ValueError(f"metric 'params_sha256' must be 64 lowercase hex digits, not {sha!r}")
        if not isinstance(self.per_rank, list):
            raise ValueError(f"'per_rank' must be a list, not {_tname(self.per_rank)}")
        seen: set[int] = set()
        for i, entry in enumerate(self.per_rank):
            where = f"per_rank[{i}]"
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be an object, not {_tname(entry)}")
            if set(entry) != {"rank", "metrics"}:
                raise ValueError(f"{where} must have exactly the keys 'rank' and 'metrics', "
                                 f"has {sorted(entry)}")
            rank = entry["rank"]
            if not _is_int(rank) or not 0 <= rank < self.world_size:
                raise ValueError(f"{where} rank {rank!r} is not in 0..{self.world_size - 1}")
            if rank in seen:
                raise ValueError(f"{where} repeats rank {rank}")
            seen.add(rank)
            self._validate_metrics(entry["metrics"], where)
        if self.data_kind is not None and self.data_kind not in DATA_KINDS:
            raise ValueError(f"'data_kind' must be one of {DATA_KINDS} or null, not {self.data_kind!r}")
        if not isinstance(self.history, dict):
            raise ValueError(f"'history' must be an object, not {_tname(self.history)}")
        for name, series in self.history.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"'history' has an invalid series name {name!r}")
            if not isinstance(series, list):
                raise ValueError(f"history {name!r} must be a list, not {_tname(series)}")
            for j, v in enumerate(series):
                if not (v is None or isinstance(v, str) or _is_number(v)):
                    raise ValueError(f"history {name!r}[{j}] must be a number, string or null, "
                                     f"not {_tname(v)}")
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"history {name!r}[{j}] is not finite ({v!r})")
        if self.created is not None:
            if not isinstance(self.created, str):
                raise ValueError(f"'created' must be an ISO 8601 string, not {_tname(self.created)}")
            try:
                _dt.datetime.fromisoformat(self.created)
            except ValueError:
                raise ValueError(f"'created' {self.created!r} is not an ISO 8601 time") from None

    @staticmethod
    def _validate_metrics(metrics: Any, where: str) -> None:
        label = f"{where} " if where else ""
        if not isinstance(metrics, dict):
            raise ValueError(f"{label}'metrics' must be an object, not {_tname(metrics)}")
        for name, m in metrics.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"{label}'metrics' has an invalid metric name {name!r}")
            if not isinstance(m, Metric):
                raise ValueError(f"{label}metric {name!r} must be a Metric, not {_tname(m)}")

    # -- conversion -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form (validated first; raises ResultError if the record is invalid)."""
        self.validate("<record>")
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "algorithm": self.algorithm,
            "config": self.config,
            "world_size": self.world_size,
            "backend": self.backend,
            "model": self.model,
            "data": self.data,
            "steps": self.steps,
            "seed": self.seed,
            "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
            "per_rank": [{"rank": e["rank"],
                          "metrics": {k: m.to_dict() for k, m in e["metrics"].items()}}
                         for e in self.per_rank],
            "env": self.env,
        }
        if self.data_kind is not None:
            d["data_kind"] = self.data_kind
        if self.history:
            d["history"] = self.history
        if self.created is not None:
            d["created"] = self.created
        return d

    @classmethod
    def from_dict(cls, d: Any, source: str | os.PathLike | None = None) -> ResultRecord:
        """Parse and fully validate the JSON form; raise :class:`ResultError` naming ``source``."""
        src = _src(source)
        if not isinstance(d, dict):
            raise ResultError(f"{src}: not a commbench result (top level is {_tname(d)}, "
                              f"not an object)")
        schema = d.get("schema")
        if schema != SCHEMA:
            if isinstance(schema, str) and schema.startswith("commbench.result/"):
                raise ResultError(f"{src}: unsupported result schema {schema!r} "
                                  f"(this commbench reads {SCHEMA!r})")
            raise ResultError(f"{src}: not a commbench result (schema {schema!r})")
        try:
            missing = [k for k in _TOP_KEYS_REQUIRED if k not in d]
            if missing:
                raise ValueError(f"missing key(s): {', '.join(missing)}")
            unknown = sorted(set(d) - set(_TOP_KEYS_REQUIRED) - set(_TOP_KEYS_OPTIONAL))
            if unknown:
                raise ValueError(f"unknown key(s): {', '.join(map(repr, unknown))}")
            metrics = _metrics_from_dict(d["metrics"], "")
            per_rank_raw = d["per_rank"]
            if not isinstance(per_rank_raw, list):
                raise ValueError(f"'per_rank' must be a list, not {_tname(per_rank_raw)}")
            per_rank = []
            for i, entry in enumerate(per_rank_raw):
                if not isinstance(entry, dict) or "metrics" not in entry:
                    raise ValueError(f"per_rank[{i}] must be an object with 'rank' and 'metrics'")
                per_rank.append({**entry, "metrics": _metrics_from_dict(
                    entry["metrics"], f"per_rank[{i}]")})
            history = d.get("history", {})
            if isinstance(history, dict):
                history = {k: (list(v) if isinstance(v, list) else v) for k, v in history.items()}
            rec = cls(
                algorithm=d["algorithm"], config=d["config"], world_size=d["world_size"],
                backend=d["backend"], model=d["model"], data=d["data"], steps=d["steps"],
                seed=d["seed"], metrics=metrics, per_rank=per_rank, env=d["env"],
                data_kind=d.get("data_kind"), history=history, created=d.get("created"),
            )
            rec._validate()
        except ValueError as exc:
            raise ResultError(f"{src}: {exc}") from None
        return rec


def _src(source: str | os.PathLike | None) -> str:
    return "<result>" if source is None else os.fspath(source)
