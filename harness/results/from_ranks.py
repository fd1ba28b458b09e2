"""Turn the ranks' outputs into one ``commbench.result/1`` record.

Aggregation rules (stated once, used by every algorithm):
* payload bytes / messages per step: all ranks' *sent* totals in the measured
  window, divided by the number of steps (framing apart, as framing bytes);
* wire bytes per step (``net="netns"`` runs only): the ranks' interface tx
  counters, summed, and their ratio to payload plus framing;
* peak memory: the maximum over ranks — of the live tensor storage bytes
  (``peak_tensor_bytes``, the primary memory metric, deterministic) and of the
  process's resident set (``peak_memory_bytes``, runtime included), each with
  its growth over what was live when the window opened;
* step time: the median step of the slowest rank;
* throughput: tokens (or samples) consumed per step over that step time;
* final loss: mean over the ranks that logged a loss, of their last value;
* history: the ranks' per-step series (a name logged by several ranks gets
  ``[rankN]`` after the first), plus ``step_time_s``, the slowest rank's step times;
* params_sha256: over the union of the ranks' parameters by global index
  (a parameter held by several ranks, e.g. replicas, must agree bit for bit).
"""

from __future__ import annotations

import math
import statistics

import torch

from ..config import RunConfig
from ..context import RankOutput
from .environment import env_info
from .fingerprint import params_sha256
from .schema import Metric, ResultRecord


def _merge_params(outputs: list[RankOutput]) -> list[tuple[int, torch.Tensor]]:
    merged: dict[int, torch.Tensor] = {}
    for out in outputs:
        for idx, t in out.params:
            if idx in merged:
                if not torch.equal(merged[idx], t):
                    raise RuntimeError(f"parameter {idx} differs between ranks holding it")
            else:
                merged[idx] = t
    return sorted(merged.items())


def _tensor_metrics(outputs: list[RankOutput], m) -> dict:
    """peak_tensor_bytes and its growth, max over ranks; nothing where it was not measured."""
    peaks = [o.peak_tensor_bytes for o in outputs]
    if any(p is None for p in peaks):
        return {}
    return {"peak_tensor_bytes": m(max(peaks), "bytes", False),
            "peak_tensor_growth_bytes": m(max(o.peak_tensor_growth_bytes for o in outputs), "bytes",
                                          False)}


def build_record(cfg: RunConfig, outputs: list[RankOutput], device: str | None = None) -> ResultRecord:
    from ..data import get_dataset

    steps = cfg.steps
    sent = sum(o.sent_bytes for o in outputs)
    msgs = sum(o.sent_messages for o in outputs)
    slowest = max(outputs, key=lambda o: statistics.median(o.step_times))
    step_time = statistics.median(slowest.step_times)
    n = len(slowest.step_times)
    # standard error of a median ~ 1.2533 sigma / sqrt(n) (normal approximation)
    step_se = 1.2533 * statistics.stdev(slowest.step_times) / math.sqrt(n) if n > 1 else None
    tokens = max(o.tokens_per_step for o in outputs)
    losses = [o.history["loss"][-1] for o in outputs if o.history.get("loss")]
    if not losses:
        raise RuntimeError(f"{cfg.algorithm}: no rank logged a loss (ctx.log(loss=...))")
    final_loss = sum(losses) / len(losses)

    def m(value, unit, hib=None):
        return Metric(value=value, unit=unit, higher_is_better=hib)

    metrics = {
        "payload_bytes_per_step": m(sent / steps, "bytes", False),
        "messages_per_step": m(msgs / steps, "messages", False),
        "framing_bytes_per_step": m(sum(o.framing_bytes for o in outputs) / steps, "bytes", False),
        "peak_memory_bytes": m(max(o.peak_memory_bytes for o in outputs), "bytes", False),
        "peak_memory_growth_bytes": m(max(o.peak_memory_growth_bytes for o in outputs), "bytes", False),
        **_tensor_metrics(outputs, m),
        "step_time_s": Metric(value=step_time, unit="s", higher_is_better=False, stderr=step_se),
        "throughput_tokens_per_s": m(tokens / step_time if step_time > 0 else 0.0, "tokens/s", True),
        "tokens_per_step": m(tokens, "tokens"),
        "final_loss": m(final_loss, "nats/token", False),
        "params_sha256": m(params_sha256(_merge_params(outputs)), "sha256"),
    }
    wire = [o.wire_tx_bytes for o in outputs]
    if all(w is not None for w in wire):
        metrics["wire_bytes_per_step"] = m(sum(wire) / steps, "bytes", False)
        metrics["wire_to_payload_ratio"] = m(sum(wire) / max(1, sent + sum(o.framing_bytes for o in outputs)), "ratio")
    extra_keys = sorted({k for o in outputs for k in o.extra})
    for k in extra_keys:  # algorithm-specific metrics: (value, unit), max over ranks
        vals = [o.extra[k] for o in outputs if k in o.extra]
        metrics[k] = m(max(v for v, _ in vals), vals[0][1])

    per_rank = []
    for o in sorted(outputs, key=lambda o: o.rank):
        rm = {
            "payload_bytes_per_step": m(o.sent_bytes / steps, "bytes", False),
            "messages_per_step": m(o.sent_messages / steps, "messages", False),
            "received_bytes_per_step": m(o.received_bytes / steps, "bytes", False),
            "peak_memory_bytes": m(o.peak_memory_bytes, "bytes", False),
            "peak_memory_growth_bytes": m(o.peak_memory_growth_bytes, "bytes", False),
            **_tensor_metrics([o], m),
            "step_time_s": m(statistics.median(o.step_times), "s", False),
        }
        if o.wire_tx_bytes is not None:
            rm["wire_tx_bytes_per_step"] = m(o.wire_tx_bytes / steps, "bytes", False)
        for tag, (b, n) in o.bytes_by_tag.items():
            rm[f"sent_bytes_per_step[{tag or 'untagged'}]"] = m(b / steps, "bytes", False)
            rm[f"sent_messages_per_step[{tag or 'untagged'}]"] = m(n / steps, "messages", False)
        per_rank.append({"rank": o.rank, "metrics": rm})

    # Measured seconds of each step (slowest rank: the one step_time_s is taken from), for
    # loss-vs-wall-time plots.  Set first so a rank series of the same name would get a
    # "[rankN]" suffix instead of replacing it.
    history = {"step_time_s": [float(t) for t in slowest.step_times]}
    for o in outputs:
        for k, v in o.history.items():
            history.setdefault(k if k not in history else f"{k}[rank{o.rank}]", v)

    # where the ranks computed: nccl ranks on their GPUs; threads ranks where their world was
    # put (the CPU unless a caller placed it on a GPU, ``run_threads(device=...)``)
    device = device or ("cuda" if cfg.backend == "nccl" else "cpu")
    env = env_info(device)
    env["peak_memory_source"] = "cuda max_memory_allocated" if device == "cuda" else (
        "VmHWM after clear_refs reset" if all(o.peak_memory_reset for o in outputs)
        else "VmHWM or ru_maxrss (process lifetime; reset unavailable)")
    if cfg.backend == "threads" and cfg.world_size > 1:
        # One process holds every rank: memory is the whole world's, not one rank's.
        env["peak_memory_source"] += "; threads backend: all ranks share one process"
    if any(o.peak_tensor_bytes is not None for o in outputs):
        env["peak_tensor_source"] = (
            "cuda max_memory_allocated" if device == "cuda" else
            "live tensor storages allocated by the rank's aten ops (harness.rank_meters.TensorMemoryMeter)"
            + ("; threads backend: per rank thread" if cfg.backend == "threads" else ""))
    return ResultRecord(
        algorithm=cfg.algorithm,
        config=cfg.to_dict(),
        world_size=cfg.world_size,
        backend=cfg.backend,
        model=cfg.model,
        data=cfg.data,
        data_kind=get_dataset(cfg.data).kind,
        steps=steps,
        seed=cfg.seed,
        metrics=metrics,
        per_rank=per_rank,
        env=env,
        history=history,
    )


def merge_memory_pass(record: ResultRecord, memory: ResultRecord) -> None:
    """Put the tensor-memory metrics of a memory-only run of the same config
    (``memory="pass"``) into ``record``, whose times are then free of the
    counter's cost.  The two runs must agree on every deterministic metric."""
    for name in ("payload_bytes_per_step", "messages_per_step", "params_sha256"):
        a, b = record.metrics[name].value, memory.metrics[name].value
        if a != b:
            raise RuntimeError(f"{record.algorithm}: the memory pass differs from the timed run "
                               f"in {name} ({a!r} vs {b!r}); the run is not deterministic")
    for name in ("peak_tensor_bytes", "peak_tensor_growth_bytes"):
        record.metrics[name] = memory.metrics[name]
    for mine, theirs in zip(record.per_rank, memory.per_rank, strict=True):
        for name in ("peak_tensor_bytes", "peak_tensor_growth_bytes"):
            mine["metrics"][name] = theirs["metrics"][name]
    record.env["peak_tensor_source"] = memory.env["peak_tensor_source"] + "; separate memory pass"
