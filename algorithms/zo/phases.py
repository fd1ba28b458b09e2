"""Per-step phase clock of a ZO rank: wall and CPU seconds by phase.

The DistZO2 paper's speed-ups (Table 1) rest on one assumption: what PertP and
DDP split over the ranks (the forward evaluations, §4-§5) dominates the step.
Every rank still regenerates z from the shared seed and applies the identical
perturbations, update and block transfers, so that work does not shrink with
the rank count.  The clock says how a step divides between the two, so the
speed-up the machine can reach is computed from the same run (Amdahl's law on
the measured phases, :func:`achievable_speedup`).

Phases (``PHASES``): ``forward`` (embedding, blocks, head and loss),
``zgen`` (drawing z), ``perturb`` (the in-place shift / restore arithmetic
and exact-mode stash copies), ``update`` (the deferred update's
arithmetic), ``offload`` (host <-> device copies and, when sliced, the
peer all-gather of the block) and ``comm`` (the scalar exchange).  CPU time
is ``time.thread_time``: a rank is one thread with one intra-op thread
(:func:`harness.context.set_rank_threads`), so it is that rank's CPU time even
when the threads backend runs every rank in one process.
"""

from __future__ import annotations

import time

PHASES = ("forward", "zgen", "perturb", "update", "offload", "comm")


class _Span:
    __slots__ = ("clock", "phase", "w0", "c0")

    def __init__(self, clock: PhaseClock, phase: str):
        self.clock, self.phase = clock, phase

    def __enter__(self) -> None:
        self.w0, self.c0 = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc) -> None:
        self.clock.add(self.phase, time.perf_counter() - self.w0, time.thread_time() - self.c0)


class PhaseClock:
    """Accumulates (wall, cpu) seconds per phase; :meth:`take` returns them and starts over."""

    def __init__(self):
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)

    def add(self, phase: str, wall: float, cpu: float) -> None:
        self.wall[phase] += wall
        self.cpu[phase] += cpu

    def __call__(self, phase: str) -> _Span:
        return _Span(self, phase)

    def take(self) -> tuple[dict[str, float], dict[str, float]]:
        out = dict(self.wall), dict(self.cpu)
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)
        return out


def achievable_speedup(forward_s: float, replicated_s: float, n: float) -> float:
    """Amdahl's bound ``(F2 + R) / (F2 / n + R)`` with ``F2`` the single rank's forward time per step.

    The forward evaluations split over ``n`` ranks (PertP: one of the two
    evaluations each; DDP: half the batch each); ``R`` (z generation,
    perturbation and update arithmetic, transfers) is replicated on every
    rank.  With ``F2 = 2F`` and ``R = kZ`` (z drawn k times per step, Z one draw
    for the model) and n = 2 this is ``(2F + kZ) / (F + kZ)``.
    """
    if n <= 0 or forward_s < 0 or replicated_s < 0 or forward_s + replicated_s <= 0:
        raise ValueError("need n > 0 and non-negative phase times with a positive sum")
    return (forward_s + replicated_s) / (forward_s / n + replicated_s)
