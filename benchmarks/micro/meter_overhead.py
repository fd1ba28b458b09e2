"""Meter overhead: pipeline-sgd step time with and without byte metering.

Runs metered and unmetered configurations alternately (so machine noise hits
both alike) and reports the ratio of their median step times, measured in one
run.  Usage: ``python -m benchmarks.micro.meter_overhead [--backend gloo] [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import statistics

from harness.launcher import run
from harness.registry import make_config


def measure(backend: str, rounds: int, steps: int, model: str) -> dict:
    times = {True: [], False: []}
    for _ in range(rounds):
        for metered in (True, False):
            cfg = make_config("pipeline-sgd", world_size=2, backend=backend, model=model,
                              data="synthetic-markov", steps=steps, batch_size=8, seq_len=64,
                              micro_batches=4, metered=metered)
            times[metered].append(run(cfg).metrics["step_time_s"].value)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"metered_s": on, "unmetered_s": off, "ratio": on / off, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="threads", choices=("threads", "gloo"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--model", default="tiny-opt")
    a = ap.parse_args()
    r = measure(a.backend, a.rounds, a.steps, a.model)
    print(f"pipeline-sgd {a.model} w2 {a.backend}: metered {r['metered_s'] * 1e3:.3f} ms/step, "
          f"unmetered {r['unmetered_s'] * 1e3:.3f} ms/step, ratio {r['ratio']:.4f} "
          f"(medians of {a.rounds} interleaved runs of {a.steps} steps)")


if __name__ == "__main__":
    main()
