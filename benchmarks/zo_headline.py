"""SparQ's headline, measured side by side: memory per node and bytes per step vs the FO pipeline.

``python -m benchmarks.zo_headline [--model opt-125m] [--steps 2] [--perturbations 1]``

Runs ``pipeline-sgd`` (FO, split after the same FFN activation) and ``sparq``
(4-bit, forward difference, in-place perturbations) with M = 2 gloo ranks, so
each node's peak memory is its own process's, and prints the ratios the paper
claims (memory: more than 3x lower; communication: more than 50% lower).
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> dict:
    from algorithms.zo.experiment import methods_runs
    from harness.launcher import run

    ap = argparse.ArgumentParser(prog="python -m benchmarks.zo_headline")
    ap.add_argument("--model", default="opt-125m")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--perturbations", type=int, default=1)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    cut, runs = methods_runs(a.model, steps=a.steps, batch_size=a.batch_size, seq_len=a.seq_len,
                             perturbations=a.perturbations, bits=a.bits, lr=a.lr)
    recs = {}
    for name, cfg in runs:
        if name == "mezo":
            continue  # the headline compares the two model-parallel methods
        t0 = time.perf_counter()
        recs[name] = run(cfg)
        print(f"{name}: {time.perf_counter() - t0:.1f} s")

    def metric(name, key):
        return recs[name].metrics[key].value

    def per_node(name):
        return [r["metrics"]["peak_memory_bytes"].value for r in recs[name].per_rank]

    out = {
        "model": a.model, "split_block": cut, "bits": a.bits, "perturbations": a.perturbations,
        "steps": a.steps, "batch": f"{a.batch_size}x{a.seq_len}",
        "fo_peak_per_node_bytes": per_node("pipeline-sgd"), "sparq_peak_per_node_bytes": per_node("sparq"),
        "memory_ratio_fo_over_sparq": metric("pipeline-sgd", "peak_memory_bytes") / metric("sparq", "peak_memory_bytes"),
        "growth_ratio_fo_over_sparq": metric("pipeline-sgd", "peak_memory_growth_bytes")
        / max(1, metric("sparq", "peak_memory_growth_bytes")),
        "fo_bytes_per_step": metric("pipeline-sgd", "payload_bytes_per_step"),
        "sparq_bytes_per_step": metric("sparq", "payload_bytes_per_step"),
        "sparq_act_nnz_ratio": metric("sparq", "act_nnz_ratio"),
    }
    out["comm_reduction"] = 1 - out["sparq_bytes_per_step"] / out["fo_bytes_per_step"]
    print(f"{a.model}, M=2 gloo, split after block {cut}'s FFN activation, {a.bits}-bit, P={a.perturbations}")
    print(f"  peak RSS per node  FO {[f'{b / 2**20:.0f} MiB' for b in out['fo_peak_per_node_bytes']]}  "
          f"SparQ {[f'{b / 2**20:.0f} MiB' for b in out['sparq_peak_per_node_bytes']]}")
    print(f"  memory  FO / SparQ (max node)        = {out['memory_ratio_fo_over_sparq']:.2f}x   (paper: > 3x)")
    print(f"  memory growth in window FO / SparQ = {out['growth_ratio_fo_over_sparq']:.2f}x")
    print(f"  bytes/step  FO {out['fo_bytes_per_step']:.0f}  SparQ {out['sparq_bytes_per_step']:.0f}  "
          f"-> {100 * out['comm_reduction']:.1f}% lower   (paper: > 50%)")
    print(f"  SparQ activation non-zero ratio = {out['sparq_act_nnz_ratio']:.3f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
