"""Fingerprints of the pipelines over every transport: what a transport change must leave alone.

Runs ``pipeline-sgd``, ``aq-sgd``, ``clapping-fc``, ``protocol`` and ``sparq`` on a
small configuration over the in-process threads backend, gloo, and gloo with
the pacer shaping the link, and prints ``params_sha256``, payload bytes per
step and messages per step of each.  Run it at two commits and compare the
outputs line by line (``diff``): they must be identical.

    python3 -m benchmarks.transport_hashes [--steps 2]

Outputs kept for a comparison: ``benchmarks/results/transport_hashes-<commit>.txt``.
"""

from __future__ import annotations

import argparse

from harness.launcher import run
from harness.registry import make_config

ALGORITHMS = ("pipeline-sgd", "aq-sgd", "clapping-fc", "protocol", "sparq")
TRANSPORTS = {"threads": dict(backend="threads"), "gloo": dict(backend="gloo"),
              "gloo+pacer": dict(backend="gloo", bandwidth="200mbit")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    for algo in ALGORITHMS:
        for name, kw in TRANSPORTS.items():
            cfg = make_config(algo, world_size=2, steps=a.steps, batch_size=4, seq_len=16, micro_batches=2, **kw)
            m = run(cfg).metrics
            print(f"{algo:13s} {name:11s} {m['params_sha256'].value} "
                  f"bytes/step {m['payload_bytes_per_step'].value:.1f} msgs/step {m['messages_per_step'].value:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
