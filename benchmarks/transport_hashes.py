"""Fingerprints of the pipelines over every transport: what a transport change must leave alone.

Runs ``pipeline-sgd``, ``aq-sgd``, ``clapping-fc``, ``protocol`` and ``sparq`` on a
small configuration over the in-process threads backend, gloo, and gloo with
the pacer shaping the link, and prints ``params_sha256``, payload bytes per
step and messages per step of each.  Run it at two commits and compare the
outputs line by line (``diff``): they must be identical.

    python3 -m benchmarks.transport_hashes [--steps 2] [--schedule 1f1b]

``--schedule 1f1b`` runs the engine's pipelines in that schedule (``sparq``'s zeroth-order
pipeline has no backward pass, hence no schedule, and is left out).

Outputs kept for a comparison: ``benchmarks/results/transport_hashes-<commit>.txt``.
"""

from __future__ import annotations

import argparse

from algorithms.pipeline.params import SCHEDULES
from harness.launcher import run
from harness.registry import make_config

ALGORITHMS = ("pipeline-sgd", "aq-sgd", "clapping-fc", "protocol", "sparq")
WITHOUT_SCHEDULE = ("sparq",)  # a zeroth-order pipeline: forward passes only
TRANSPORTS = {"threads": dict(backend="threads"), "gloo": dict(backend="gloo"),
              "gloo+pacer": dict(backend="gloo", bandwidth="200mbit")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--schedule", choices=SCHEDULES, default="gpipe", help="the engine pipelines' schedule")
    a = ap.parse_args()
    algorithms = ALGORITHMS if a.schedule == "gpipe" else [x for x in ALGORITHMS if x not in WITHOUT_SCHEDULE]
    for algo in algorithms:
        params = {} if algo in WITHOUT_SCHEDULE else {"schedule": a.schedule}
        for name, kw in TRANSPORTS.items():
            cfg = make_config(algo, world_size=2, steps=a.steps, batch_size=4, seq_len=16, micro_batches=2,
                              params=params, **kw)
            m = run(cfg).metrics
            print(f"{algo:13s} {name:11s} {m['params_sha256'].value} "
                  f"bytes/step {m['payload_bytes_per_step'].value:.1f} msgs/step {m['messages_per_step'].value:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
