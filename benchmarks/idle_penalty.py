"""How much slower this machine computes right after an idle spell: a precondition of every
shaped-link timing.

A step on a slow link computes in bursts between waits for the link.  On some VMs a burst that
follows an idle spell runs many times slower than the same burst back to back (one 2-core KVM VM
took 4.7 ms hot and 20 ms after 50 ms of sleep for a tiny-opt stage's forward and backward, CPU
time included, as the guest reports no steal).  A shaped step there exceeds its bound by the
machine's penalty, not the link's or the Comm's, so the shaped benchmarks measure this penalty
at their gap, and a ratio beyond its goal counts against the Comm only where the penalty is
small (``paced_interleaved``).

``penalty(work, gap_s)`` is the median time of ``work()`` right after sleeping ``gap_s``, over
its median back to back (both in one interleaved loop, so drift hits both alike); ``probe``
times one such pair, for a benchmark that probes between its rounds.

    python3 -m benchmarks.idle_penalty [--gaps-ms 0.5,5,50,200] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

#: At most this much slower after the gap, a shaped step's excess over its bound is its own
#: (the goals allow 10 %; half of that is left to the machine).
MAX_PENALTY = 1.05
#: Below this a shaped step beat what its link allows: it was not shaped the whole step.
FAULT_BELOW = 0.95


def probe(work: Callable[[], object], gap_s: float) -> tuple[float, float]:
    """One pair of wall times of ``work()``: right after another ``work()``, then right after
    ``gap_s`` of sleep.  A benchmark that probes between its own rounds measures the penalty in
    the same minutes as what it qualifies (``paced_interleaved``)."""
    if gap_s < 0:
        raise ValueError("gap_s must be >= 0")
    work()  # what makes the next call hot
    t = time.perf_counter()
    work()
    hot = time.perf_counter() - t
    time.sleep(gap_s)
    t = time.perf_counter()
    work()
    return hot, time.perf_counter() - t


def penalty_of(pairs: list[tuple[float, float]]) -> float:
    """The median time after the gap over the median back to back, of ``probe``'s pairs."""
    if not pairs:
        raise ValueError("no probes to take a penalty from")
    return statistics.median(c for _, c in pairs) / statistics.median(h for h, _ in pairs)


def penalty(work: Callable[[], object], gap_s: float, repeats: int = 15) -> float:
    """``penalty_of`` ``repeats`` probes in a row."""
    if gap_s < 0 or repeats < 1:
        raise ValueError("gap_s must be >= 0 and repeats >= 1")
    return penalty_of([probe(work, gap_s) for _ in range(repeats)])


def stage_work(model: str = "tiny-opt", rows: int = 2, seq_len: int = 64) -> Callable[[], None]:
    """One micro-batch's forward and backward through the first of two stages of ``model``, on
    one thread (it sets this process's torch threads to 1: a rank that calls it sets its own back):
    the burst a pipeline stage computes between two waits for its link."""
    import torch

    from harness.models import build_stage

    torch.set_num_threads(1)
    stage = build_stage(model, seed=0, num_stages=2, stage_index=0)
    ids = torch.zeros(rows, seq_len, dtype=torch.long)

    def work() -> None:
        stage.zero_grad(set_to_none=True)
        sum(t.float().sum() for t in stage(ids, input_ids=ids)).backward()
    return work


def verdict(ratio: float, goal: float, idle: float) -> str:
    """How to read a shaped step's ratio to its bound, given the machine's ``idle`` penalty at
    the step's gap.  The penalty only slows the shaped step (its waits are the longest), so a
    ratio within the goal is met whatever it is; one beyond the goal says something about the
    Comm only where the penalty is small."""
    if ratio < FAULT_BELOW:
        return "a measurement fault: the step took less than the link allows (not shaped throughout)"
    if ratio <= goal:
        return "met"
    if idle > MAX_PENALTY:
        return (f"not measurable here: compute after the link's wait runs {idle:.2f}x slower "
                f"than back to back on this machine (precondition: <= {MAX_PENALTY})")
    return "not met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaps-ms", default="0.5,5,50,200")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--model", default="tiny-opt")
    a = ap.parse_args()
    try:
        gaps = [float(g) / 1e3 for g in a.gaps_ms.split(",")]
    except ValueError:
        ap.error(f"--gaps-ms takes milliseconds separated by commas, got {a.gaps_ms!r}")
    if a.repeats < 1 or any(g < 0 for g in gaps):
        ap.error("--repeats must be >= 1 and every gap >= 0")
    work = stage_work(a.model)
    print(f"{a.model}, one micro-batch (2x64) forward and backward of its first stage, one thread; "
          f"median over {a.repeats} interleaved repeats")
    print("| idle gap | after the gap / back to back |")
    print("|---|---|")
    for g in gaps:
        print(f"| {g * 1e3:g} ms | {penalty(work, g, a.repeats):.2f} |")


if __name__ == "__main__":
    main()
