"""The uncompressed 2-stage pipeline on a shaped link (the Comm's pacer) against what the link allows.

For each rate, a repeat runs ``pipeline-sgd`` on gloo three times, alternately: unshaped (its
step time is the compute, transport included), unshaped with one micro-batch of the same size
(one micro-batch through both stages and back: the fill and drain no schedule hides), and
shaped.  The table gives the shaped step time over two bounds:

* ``max(compute, busier direction's wire bytes / rate)``: 1.0 would be a link busy the
  whole step or a compute that never waits (no schedule reaches it on a slow link);
* the GPipe bound ``max(compute, fill + forward + backward direction)``.  Activations go
  forward and gradients back on the two directions of the link, but with GPipe the last
  stage starts its first backward only once its last forward is done, so the directions are
  busy one after the other; and the first activation leaves only after stage 0's first
  forward, the last gradient's backward on stage 0 runs after it arrives, and the last
  stage's forward and backward of the last micro-batch lie between the two directions: one
  micro-batch's compute on both stages (``fill``, measured) cannot overlap the transfer.
  Before this file measured ``fill`` the bound was ``max(compute, forward + backward)``; both
  ratios are printed.

The pacer's bucket holds ``burst`` bytes (``pacer.tbf_burst_bytes``, what ``--net netns`` gives
tbf): after an idle spell that many leave at once, so each direction's first bytes take no
time.  Both bounds count each direction as ``(its wire bytes - burst) / rate``.

The load average is printed: the machine may be shared.

    python3 -m benchmarks.paced_pipeline [--rates 2mbit,10mbit,80mbit] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks.spread import extremes
from harness.comm.byte_meter import FRAME_HEADER_BYTES
from harness.comm.pacer import tbf_burst_bytes, wire_bytes
from harness.config import parse_rate
from harness.launcher import run
from harness.registry import make_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="2mbit,10mbit,80mbit")
    ap.add_argument("--model", default="tiny-opt")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    kw = dict(model=a.model, world_size=2, backend="gloo", steps=a.steps, batch_size=8, seq_len=64,
              micro_batches=a.micro_batches)
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}")
    for rate in a.rates.split(","):
        bps = parse_rate(rate)
        r_max, r_nofill, r_bound, rows = [], [], [], []
        for _ in range(a.repeats):
            plain = run(make_config("pipeline-sgd", **kw))
            one = run(make_config("pipeline-sgd", **{**kw, "batch_size": kw["batch_size"] // a.micro_batches,
                                                     "micro_batches": 1}))
            shaped = run(make_config("pipeline-sgd", bandwidth=rate, **kw))
            compute = plain.metrics["step_time_s"].value
            fill = one.metrics["step_time_s"].value
            step = shaped.metrics["step_time_s"].value
            payload = shaped.metrics["payload_bytes_per_step"].value
            msgs = 2 * a.micro_batches  # messages per step, one per micro-batch each way
            per_msg = payload / msgs
            wire = a.micro_batches * wire_bytes(int(per_msg), FRAME_HEADER_BYTES)
            direction = max(0, wire - tbf_burst_bytes(bps)) * 8 / bps
            r_max.append(step / max(compute, direction))
            r_nofill.append(step / max(compute, 2 * direction))
            r_bound.append(step / max(compute, fill + 2 * direction))
            rows.append((compute, fill, direction, step))
        c, f, d, s = (statistics.median(v) for v in zip(*rows, strict=True))

        print(f"{rate}: compute {1e3 * c:.1f} ms, fill (one micro-batch) {1e3 * f:.1f} ms, busier direction "
              f"{1e3 * d:.1f} ms, shaped step {1e3 * s:.1f} ms; step / max(compute, direction) = {extremes(r_max)}; "
              f"step / GPipe bound = {extremes(r_bound)} (without the fill: {extremes(r_nofill)})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
