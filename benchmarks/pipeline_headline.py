"""Headline numbers of the compressed pipelines (issue 5).

1. Per algorithm (pipeline-sgd, direct-compress, aq-sgd, clapping-fc, clapping-fu)
   on a tiny model and a larger preset (small-opt): payload bytes per step,
   peak memory per stage (gloo: one process per stage), seconds per step.
2. Time per step at 80 Mbit/s and over unshaped links (both in network
   namespaces), uncompressed vs Clapping-FC, and the speed-up ratio at each,
   measured in one run (runs interleaved so machine noise hits both alike).

Usage: ``python -m benchmarks.pipeline_headline [--models tiny-opt,small-opt] [--steps 6]
[--no-netns] [--rounds 2]``.  The netns part needs root (tc, ip netns).
"""

from __future__ import annotations

import argparse
import statistics

from harness.launcher import run
from harness.registry import make_config

CODEC = {"fwd": "topk:ratio=0.1", "bwd": "topk:ratio=0.1"}
ALGOS = [("pipeline-sgd", {}), ("direct-compress", CODEC), ("aq-sgd", {**CODEC, "dataset_size": 64}),
         ("clapping-fc", {**CODEC, "p": 0.5}), ("clapping-fu", {**CODEC, "p": 0.5})]


def _cfg(algo, params, model, steps, **kw):
    return make_config(algo, world_size=2, model=model, data="wiki-en", steps=steps, batch_size=8,
                       seq_len=64 if model.startswith("tiny") else 128, micro_batches=2, params=params, **kw)


def headline(models: list[str], steps: int) -> None:
    print(f"{'model':10} {'algorithm':16} {'bytes/step':>12} {'peak MiB stage0':>16} {'stage1':>8} {'s/step':>9}")
    for model in models:
        for algo, params in ALGOS:
            rec = run(_cfg(algo, params, model, steps, backend="gloo"))
            mem = [r["metrics"]["peak_memory_bytes"].value / 2**20 for r in rec.per_rank]
            print(f"{model:10} {algo:16} {rec.metrics['payload_bytes_per_step'].value:12.0f} "
                  f"{mem[0]:16.1f} {mem[1]:8.1f} {rec.metrics['step_time_s'].value:9.4f}")


def bandwidth(model: str, steps: int, rounds: int) -> None:
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for bw in ("80mbit", None):
            for algo, params in (("pipeline-sgd", {}), ("clapping-fc", {**CODEC, "p": 0.5})):
                cfg = _cfg(algo, params, model, steps, backend="gloo", net="netns", bandwidth=bw)
                times.setdefault((algo, bw or "unshaped"), []).append(run(cfg).metrics["step_time_s"].value)
    med = {k: statistics.median(v) for k, v in times.items()}
    for bw in ("80mbit", "unshaped"):
        raw, clap = med[("pipeline-sgd", bw)], med[("clapping-fc", bw)]
        print(f"{model} {bw:9}: uncompressed {raw:.4f} s/step, clapping-fc (Top-10 %, p = 0.5) "
              f"{clap:.4f} s/step, speed-up {raw / clap:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="tiny-opt,small-opt")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-netns", action="store_true")
    a = ap.parse_args()
    headline(a.models.split(","), a.steps)
    if not a.no_netns:
        bandwidth(a.models.split(",")[-1], a.steps, a.rounds)


if __name__ == "__main__":
    main()
