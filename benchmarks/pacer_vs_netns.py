"""Benchmark (not a test): step time at the same shaped rate through the Comm's
user-space pacer and through the kernel (network namespaces + tc tbf).

    python3 -m benchmarks.pacer_vs_netns [--steps 10] [--rates 10mbit,80mbit]   # root

Runs the uncompressed 2-stage pipeline (the bandwidth sweep's baseline, the
most bytes per step) on gloo, once per path and rate, alternating the paths
so that load drifts hit both, and prints the median step times and their
ratio.  Tolerance: the pacer's step time within ``TOLERANCE`` of the
kernel's on an uncontended machine (the pacer charges TCP/IP headers by a
per-segment model and no ACKs; the kernel's tbf bucket and TCP's own pacing
differ in detail).  Exit status 1 when a ratio is outside it.  Timing on a
loaded machine is not evidence either way: note the load with the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

TOLERANCE = 0.25  # |pacer / netns - 1|


def main(argv: list[str] | None = None) -> int:
    from harness.launcher import run
    from harness.netns import unavailable_reason
    from harness.registry import make_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rates", default="10mbit,80mbit")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    why = unavailable_reason()
    if why:
        print(f"skipped: {why}")
        return 0
    print(f"load average before: {os.getloadavg()}")
    bad = 0
    for rate in args.rates.split(","):
        times: dict[str, list[float]] = {"pacer": [], "netns": []}
        for _ in range(args.repeats):
            for net in ("pacer", "netns"):
                cfg = make_config("pipeline-sgd", world_size=2, backend="gloo", net=net, bandwidth=rate,
                                  model="tiny-llama", data="wiki-en", steps=args.steps, batch_size=8,
                                  seq_len=256, micro_batches=2)
                rec = run(cfg)
                times[net].append(rec.metrics["step_time_s"].value)
                payload = rec.metrics["payload_bytes_per_step"].value
        p, k = statistics.median(times["pacer"]), statistics.median(times["netns"])
        ok = abs(p / k - 1) <= TOLERANCE
        bad += not ok
        print(f"{rate}: payload {payload:.0f} B/step; step time pacer {p * 1e3:.1f} ms, netns {k * 1e3:.1f} ms, "
              f"pacer / netns = {p / k:.3f} ({'within' if ok else 'OUTSIDE'} ±{TOLERANCE:.0%}); "
              f"runs: pacer {[round(t * 1e3, 1) for t in times['pacer']]} ms, "
              f"netns {[round(t * 1e3, 1) for t in times['netns']]} ms")
    print(f"load average after: {os.getloadavg()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
