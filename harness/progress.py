"""Progress for one run and across many: ``run(cfg, quiet)`` is ``launcher.run``
with a bar drawn from the launcher's per-step progress callback, and
:class:`Overall` adds the bar and ETA of a whole ``reproduce``.

On a terminal: a transient bar per run, with the overall bar under it.
Otherwise (a pipe, a CI log): one plain line per finished run with its time,
the elapsed time and the ETA of the whole job, so the output is never silent
for longer than one run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from .launcher import run as launch


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@dataclass
class Overall:
    """Several named parts of known expected length (seconds, an estimate), run in order.

    The fraction done counts finished parts at their expected length plus the
    current part's share, capped; the ETA scales what is left by the pace so far.
    """

    expected_s: dict[str, float]
    started: float = field(default_factory=time.perf_counter)
    done: list[str] = field(default_factory=list)
    current: str | None = None
    current_started: float = 0.0
    runs: int = 0

    def begin(self, name: str) -> None:
        self.current, self.current_started = name, time.perf_counter()

    def end(self, name: str) -> None:
        self.done.append(name)
        self.current = None

    def fraction(self) -> float:
        total = sum(self.expected_s.values()) or 1.0
        done = sum(self.expected_s[n] for n in self.done)
        if self.current is not None:
            exp = self.expected_s[self.current]
            done += min(0.95 * exp, time.perf_counter() - self.current_started)
        return min(1.0, done / total)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def eta_s(self) -> float | None:
        f = self.fraction()
        return None if f <= 0.02 else self.elapsed() * (1 - f) / f

    def status(self) -> str:
        eta = self.eta_s()
        return (f"{len(self.done)}/{len(self.expected_s)} experiments, {100 * self.fraction():.0f}%, "
                f"elapsed {_clock(self.elapsed())}, ETA {'?' if eta is None else _clock(eta)}")


_OVERALL: Overall | None = None


def set_overall(overall: Overall | None) -> None:
    """Make ``overall`` the job every following ``run`` reports to (None: none)."""
    global _OVERALL
    _OVERALL = overall


def _label(cfg) -> str:
    link = f" {cfg.net} {cfg.bandwidth}" if cfg.bandwidth else ""
    return f"{cfg.algorithm} w{cfg.world_size} {cfg.backend}{link}"


def run(cfg, quiet: bool = False):
    """Run ``cfg`` and return its record; unless ``quiet``, show steps done and the latest values."""
    overall = _OVERALL
    t0 = time.perf_counter()
    if quiet or not sys.stdout.isatty():
        rec = launch(cfg)
    else:
        rec = _run_with_bar(cfg, overall)
    if overall is not None:
        overall.runs += 1
        if quiet or not sys.stdout.isatty():
            print(f"  run {overall.runs}: {_label(cfg)}, {cfg.steps} steps, {time.perf_counter() - t0:.1f} s"
                  f" | {overall.current}: {overall.status()}", flush=True)
    return rec


def _run_with_bar(cfg, overall: Overall | None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), transient=True) as prog:
        task = prog.add_task(_label(cfg), total=cfg.steps, info="")
        job = None
        if overall is not None:
            job = prog.add_task("all", total=1000, completed=int(1000 * overall.fraction()),
                                info=overall.status())

        def progress(step, values):
            info = " ".join(f"{k}={v:.4g}" for k, v in values.items())
            prog.update(task, completed=step, info=info)
            if job is not None:
                prog.update(job, completed=int(1000 * overall.fraction()), info=overall.status())

        return launch(cfg, progress=progress)
