"""The uncompressed 2-stage pipeline on a shaped link (the Comm's pacer) against what the link allows.

For each rate, a repeat runs ``pipeline-sgd`` on gloo unshaped (its step time is
the compute, transport included) and shaped, alternately.  The table gives the
shaped step time over ``max(compute, busier direction's wire bytes / rate)``:
1.0 would be a link that is busy the whole step or a compute that never waits.
Activations go forward and gradients back on the two directions of the link,
but with GPipe the last stage starts its first backward only once the last
forward micro-batch arrived, so the two directions are busy one after the
other: ``max(compute, forward + backward direction)`` is the bound the ratio is
also given against.  The load average is printed: the machine may be shared.

    python3 -m benchmarks.paced_pipeline [--rates 2mbit,10mbit,80mbit] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics

from harness.comm.byte_meter import FRAME_HEADER_BYTES
from harness.comm.pacer import wire_bytes
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
        r_max, r_bound, rows = [], [], []
        for _ in range(a.repeats):
            plain = run(make_config("pipeline-sgd", **kw))
            shaped = run(make_config("pipeline-sgd", bandwidth=rate, **kw))
            compute = plain.metrics["step_time_s"].value
            step = shaped.metrics["step_time_s"].value
            payload = shaped.metrics["payload_bytes_per_step"].value
            msgs = 2 * a.micro_batches  # messages per step, one per micro-batch each way
            per_msg = payload / msgs
            direction = (a.micro_batches * wire_bytes(int(per_msg), FRAME_HEADER_BYTES)) * 8 / bps
            best = max(compute, direction)
            bound = max(compute, 2 * direction)  # GPipe: the backward direction follows the forward
            r_max.append(step / best)
            r_bound.append(step / bound)
            rows.append((compute, direction, step))
        c, d, s = (statistics.median(v) for v in zip(*rows, strict=True))
        print(f"{rate}: compute {1e3 * c:.1f} ms, busier direction {1e3 * d:.1f} ms, shaped step {1e3 * s:.1f} ms; "
              f"step / max(compute, direction) = {statistics.median(r_max):.3f} [{min(r_max):.3f}, {max(r_max):.3f}]; "
              f"step / GPipe bound = {statistics.median(r_bound):.3f} [{min(r_bound):.3f}, {max(r_bound):.3f}]")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
