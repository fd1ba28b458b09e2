"""Typed run configuration, validated on construction.

A run is ``RunConfig`` (what every algorithm shares: model, data, world,
backend, steps, ...) plus the algorithm's own parameter dataclass in
``params``.  ``--set key=value`` on the command line reaches either, by
field name, with the value parsed by the field's declared type.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the message is one line for the user."""


DTYPES = ("float32", "float64")

# Upper bounds on sizes: what a 24 GB laptop could conceivably run with the
# small presets.  A value beyond one fails at validation, before any rank
# starts, instead of minutes later in an allocation; LIMITS_ENV=off lifts them.
LIMITS_ENV = "COMMBENCH_LIMITS"
LIMITS = {
    "world_size": 64,
    "steps": 1_000_000,
    "batch_size": 4096,
    "seq_len": 8192,
    "threads_per_rank": 256,
    "timeout_s": 86_400,  # one day: a longer wait is a hang
    "latency_ms": 60_000,
}
MAX_TOKENS_PER_STEP = 1 << 20  # batch_size * seq_len: ~1M tokens of logits per step

# The largest point-to-point payload a rank sends or accepts (the frame protocol
# of harness/comm/base.py).  The default is the Comm's DEFAULT_MAX_FRAME_BYTES,
# repeated here because this module must load without torch (the CLI's --help);
# checks/test_wire_hostile.py keeps the two equal.  Below 1 KiB not even a codec
# header with a small tensor fits; above 1 TiB a frame is no longer a message.
DEFAULT_MAX_FRAME_BYTES = 1 << 30
MAX_FRAME_BYTES_RANGE = (1 << 10, 1 << 40)


def limits_on() -> bool:
    return os.environ.get(LIMITS_ENV, "on").lower() not in ("off", "0", "no", "false")


def did_you_mean(name: str, choices) -> str:
    """' (did you mean X?)' for the closest of ``choices``, or ''."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_finite_params(params) -> None:
    """Reject non-finite float fields of an algorithm's parameter dataclass (lr=nan, mu=inf)."""
    if not dataclasses.is_dataclass(params):
        return
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{f.name} must be a finite number, got {v}")
# none: no shaping; pacer: --bandwidth shaped in user space by the Comm (any
# user, any backend; harness/comm/pacer.py); netns: one network namespace per
# rank shaped by the kernel's tc tbf, with wire bytes counted (root, gloo).
NETS = ("none", "pacer", "netns")
MEMORY_METERS = ("rss", "tensor", "pass")
HEADS = ("fresh", "probe")
# Held-out rows a run on labelled data evaluates before and after training (harness/heldout.py):
# 512 gives a 2 % standard error on an accuracy near 80 %.
HELDOUT_ROWS = 512
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")


RATE_RANGE_BPS = (1e3, 1e11)  # 1 kbit/s .. 100 Gbit/s


def parse_rate(rate: str) -> float:
    """tc-style rate ('80mbit', '1gbit') -> bits per second."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise ConfigError(f"bandwidth {rate!r} is not a rate like 80mbit, 1gbit or 500kbit")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    bps = float(m.group(1)) * scale
    if not RATE_RANGE_BPS[0] <= bps <= RATE_RANGE_BPS[1]:
        raise ConfigError(f"bandwidth {rate!r} is outside the accepted range 1kbit .. 100gbit "
                          "(what the pacer and tc tbf shape reliably)")
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
    # Whole-run limit in seconds; None: a healthy run may take as long as it
    # needs (each wait is still bounded by timeout_s).
    max_run_time_s: float | None = None
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
    # Largest point-to-point message (payload bytes) a rank sends or accepts: a
    # larger one is refused by its sender, a frame announcing one by its receiver.
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # A classifier preset's head: "fresh" drawn from the seed; "probe" fitted first by logistic
    # regression on the frozen pretrained features of the task's training rows (linear probing,
    # then training the whole model from there: MeZO's LP-then-ZO protocol, harness/heldout.py)
    head: str = "fresh"
    # How many fixed validation rows a run on labelled data is evaluated on (harness/heldout.py)
    heldout_rows: int = HELDOUT_ROWS
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
        # batch_size % micro_batches is the rule of the families that split a batch
        # (pipeline, protocol: micro_batch_problem in algorithms/pipeline/local.py)
        need(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        need(math.isfinite(self.timeout_s) and self.timeout_s > 0,
             f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s}")
        need(math.isfinite(self.latency_ms) and self.latency_ms >= 0,
             f"latency_ms must be a finite number >= 0, got {self.latency_ms}")
        need(self.max_run_time_s is None or (isinstance(self.max_run_time_s, (int, float))
                                             and not isinstance(self.max_run_time_s, bool)
                                             and 0 < self.max_run_time_s < float("inf")),
             f"max_run_time_s must be a finite number of seconds > 0, got {self.max_run_time_s!r}")
        lo, hi = MAX_FRAME_BYTES_RANGE
        need(type(self.max_frame_bytes) is int and lo <= self.max_frame_bytes <= hi,
             f"max_frame_bytes must be an integer number of bytes in {lo}..{hi}, got {self.max_frame_bytes!r}")
        need(self.threads_per_rank >= 1, "threads_per_rank must be >= 1")
        need(self.seed >= 0, "seed must be >= 0")
        need(self.memory in MEMORY_METERS,
             f"memory must be one of {', '.join(MEMORY_METERS)}, got {self.memory!r}")
        need(self.net in NETS, f"net must be one of {', '.join(NETS)}, got {self.net!r}")
        need(self.head in HEADS, f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        need(type(self.heldout_rows) is int and self.heldout_rows >= 1,
             f"heldout_rows must be an integer >= 1, got {self.heldout_rows!r}")
        if self.bandwidth is not None and self.net == "none":
            # --bandwidth alone means the path every user has: the user-space pacer
            object.__setattr__(self, "net", "pacer")
        if self.net == "netns":
            need(self.backend == "gloo", "--net netns needs --backend gloo (one process per rank)")
        if self.inject_fault is not None:
            parse_fault(self.inject_fault, self.world_size)
        if self.bandwidth is not None:
            parse_rate(self.bandwidth)
        if limits_on():
            for name, bound in LIMITS.items():
                need(getattr(self, name) <= bound,
                     f"{name} {getattr(self, name)} is above the limit {bound} "
                     f"(set {LIMITS_ENV}=off to lift the size limits)")
            tokens = self.batch_size * self.seq_len
            need(tokens <= MAX_TOKENS_PER_STEP,
                 f"batch_size * seq_len = {tokens} tokens per step is above the limit {MAX_TOKENS_PER_STEP} "
                 f"(set {LIMITS_ENV}=off to lift the size limits)")
        need(self.net != "pacer" or self.bandwidth is not None,
             "--net pacer needs --bandwidth (the rate to pace each link at)")

    @property
    def paced_bps(self) -> float | None:
        """The rate the Comm paces each link at (net="pacer"), else None."""
        return parse_rate(self.bandwidth) if self.net == "pacer" else None

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


def _from_json(value, tp, key: str):
    """A JSON value as the declared type ``tp``; a value of another type is a ConfigError
    (an int is taken for a float, a list for a tuple; nothing else is coerced)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        return _from_json(value, next(a for a in typing.get_args(tp) if a is not type(None)), key)
    if origin is tuple or tp is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"config field {key}: expected a list, got {type(value).__name__}")
        inner = (typing.get_args(tp) or (str,))[0]
        return tuple(_from_json(v, inner, key) for v in value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp in (bool, int, float, str) and (type(value) is not tp):
        raise ConfigError(f"config field {key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def split_config_dict(d) -> tuple[str, dict, dict]:
    """``RunConfig.to_dict()`` read back (e.g. from JSON): (algorithm, run fields, params dict),
    each run field checked against its declared type; unknown or missing keys are ConfigErrors.
    The caller builds the RunConfig from them, so the values pass its validation too."""
    if not isinstance(d, dict):
        raise ConfigError(f"a run config must be a JSON object, got {type(d).__name__}")
    hints = typing.get_type_hints(RunConfig)
    unknown = sorted(set(d) - set(hints))
    if unknown:
        raise ConfigError(f"run config has unknown fields: {', '.join(map(str, unknown))}")
    missing = [k for k in ("algorithm", "params") if k not in d]
    if missing:
        raise ConfigError(f"run config lacks {', '.join(missing)}")
    algorithm = _from_json(d["algorithm"], str, "algorithm")
    if not isinstance(d["params"], dict):
        raise ConfigError(f"config field params: expected an object, got {type(d['params']).__name__}")
    run = {k: _from_json(v, hints[k], k) for k, v in d.items() if k not in ("algorithm", "params")}
    return algorithm, run, dict(d["params"])


def params_from_dict(params_cls: type, d: dict) -> dict:
    """An algorithm's parameter fields from JSON, each checked against its declared type."""
    hints = typing.get_type_hints(params_cls) if dataclasses.is_dataclass(params_cls) else {}
    unknown = sorted(set(d) - set(hints))
    if unknown:
        raise ConfigError(f"run config params have unknown fields: {', '.join(map(str, unknown))}")
    return {k: _from_json(v, hints[k], k) for k, v in d.items()}


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
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: expected int") from None
    if tp is float:
        try:
            v = float(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: expected float") from None
        if not math.isfinite(v):
            raise ConfigError(f"--set {key}={text}: expected a finite number")
        return v
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


def split_sets(params_cls: type, sets: dict[str, str], algorithm: str) -> tuple[dict, dict]:
    """--set overrides parsed by their declared types: (RunConfig fields, params fields).

    Split before any config is built, so the overrides take part in the first
    validation (a world size valid only with the given ``cut`` is accepted).
    """
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"algorithm", "params"}
    run_hints = typing.get_type_hints(RunConfig)
    param_hints = typing.get_type_hints(params_cls) if dataclasses.is_dataclass(params_cls) else {}
    run_over, param_over = {}, {}
    for k, v in sets.items():
        if k in param_hints:
            param_over[k] = _parse_value(v, param_hints[k], k)
        elif k in run_fields:
            run_over[k] = _parse_value(v, run_hints[k], k)
        else:
            known = sorted(set(param_hints) | run_fields)
            raise ConfigError(f"--set {k}: unknown key for {algorithm}{did_you_mean(k, known)}; "
                              f"known keys: {', '.join(known)}")
    return run_over, param_over


def apply_sets(cfg: RunConfig, sets: dict[str, str]) -> RunConfig:
    """Return cfg with --set overrides applied to RunConfig or its params."""
    run_over, param_over = split_sets(type(cfg.params), sets, cfg.algorithm)
    try:
        params = dataclasses.replace(cfg.params, **param_over) if param_over else cfg.params
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set: {e}") from None
    check_finite_params(params)
    return dataclasses.replace(cfg, params=params, **run_over)
