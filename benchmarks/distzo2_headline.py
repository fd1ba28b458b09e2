"""DistZO2 headline: per mode s/step, tokens/s, peak memory per rank, bytes per step (gloo ranks).

    python -m benchmarks.distzo2_headline [--model small-opt] [--steps 6] [--batch 8] [--seq 128]
                                          [--sliced] [--no-2d]

ZO2, PertP and DDP (and 2D unless --no-2d) run one after another in this one
invocation, so the speed-ups of PertP and DDP over ZO2 with 2 gloo ranks come
from the same run; the ideal is 2x (the CPU has 2 cores).  Times are tracked,
never asserted.  GPU: not exercised here (no CUDA on this machine).
"""

from __future__ import annotations

import argparse

from algorithms.zo.distzo2_experiment import MODES, run_table
from harness.tables import render


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small-opt")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--sliced", action="store_true")
    ap.add_argument("--no-2d", action="store_true")
    a = ap.parse_args(argv)
    modes = MODES[:3] if a.no_2d else MODES
    t = run_table(a.model, steps=a.steps, batch_size=a.batch, seq_len=a.seq, quiet=True, run_dir=None,
                  sliced=a.sliced, modes=modes)
    print(render(t, "md"))
    for row in t.rows:
        if row[0] in ("PertP", "DDP"):
            print(f"{row[0]}: speed-up over ZO2 {row[4]:.2f}x with {row[1]} gloo ranks "
                  f"= {row[6]:.0%} of the ideal {row[5]:.0f}x")


if __name__ == "__main__":
    main()
