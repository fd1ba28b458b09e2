"""Double-quantisation headline numbers (asv arrives later): ``python -m benchmarks.dq_headline``.

For every algorithm on the digits MLP (simulator, seeded delay schedule, so
the bits are deterministic): paper bits until P(x) < threshold, the ratio to
AsyFPG, and seconds per epoch; then the master's peak memory (peak RSS growth
of rank 0) in one real gloo run of AsyLPG.  Times and memory are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json

import torch

from algorithms.dataparallel import dq_experiment as dqx
from algorithms.dataparallel.problems import make_problem


def headline(epochs: int, threshold: float) -> dict:
    cfg = dqx.settings("tiny") | {"max_epochs": epochs, "threshold": threshold}
    prob = make_problem(cfg["problem"], l1=cfg["l1"], l2=cfg["l2"], dtype=torch.float32)
    out, base = {}, None
    for name in dqx.ORDER:
        master, thr, secs = dqx.run_one(prob, cfg, name)
        hit = dqx._crossing(master, thr)
        bits = hit[1] if hit else None
        base = bits if name == "asyfpg" else base
        out[name] = {"bits_to_threshold": bits, "ratio_to_asyfpg": base / bits if bits and base else None,
                     "seconds_per_epoch": secs}
    return out


def master_memory() -> dict:
    from harness.launcher import run
    from harness.registry import make_config

    params = dict(lr=0.2, m=90, b=4, bx=8, tau=4)
    rec = run(make_config("asylpg", world_size=5, backend="gloo", steps=2, seed=0, model="mlp-digits",
                          params=params))
    master = next(r for r in rec.per_rank if r["rank"] == 0)["metrics"]
    return {k: master[k].value for k in ("peak_memory_bytes",) if k in master} | {
        "step_time_s": rec.metrics["step_time_s"].value,
        "payload_bytes_per_epoch": rec.metrics["payload_bytes_per_step"].value}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threshold", type=float, default=0.2)
    ap.add_argument("--no-gloo", action="store_true")
    a = ap.parse_args()
    res = {"bits": headline(a.epochs, a.threshold)}
    if not a.no_gloo:
        res["gloo_master"] = master_memory()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
