"""What a rank program sees: its Comm, its config, and the measured step loop.

An algorithm is ``run(ctx)``: it builds what it needs, iterates
``for step in ctx.steps():`` (which opens the measured window: a barrier,
peak-memory reset, meter and interface snapshots, and per-step timing), logs
per-step values with ``ctx.log`` and ends with ``ctx.finish(params=...)``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from . import rank_meters
from .comm import Comm, MeterSnapshot
from .config import RunConfig, parse_fault

PROGRESS_INTERVAL_S = 0.5  # the shortest time between two progress reports of a run
_clock = time.monotonic  # the progress rate's clock (a check replaces it)


class InjectedFault(RuntimeError):
    """Raised by --set inject_fault=RANK@STEP (failure-handling checks)."""


class Diverged(RuntimeError):
    """A logged loss is NaN or infinite: the run stops there instead of training on garbage."""


@dataclass
class RankOutput:
    """Everything a rank reports; picklable so it can cross process boundaries."""

    rank: int
    params: list[tuple[int, torch.Tensor]]  # (global index, float32 CPU tensor)
    history: dict[str, list[float]]
    step_times: list[float]
    peak_memory_bytes: int
    peak_memory_growth_bytes: int  # peak minus what was in use when the window opened
    peak_memory_reset: bool
    # Peak bytes of live tensor storages in the window (None: not measured); see rank_meters.
    peak_tensor_bytes: int | None
    peak_tensor_growth_bytes: int | None  # peak minus the tensor bytes live when the window opened
    sent_bytes: int  # payload, as the Comm's byte meter counts it (glossary: harness.comm)
    sent_messages: int
    received_bytes: int
    framing_bytes: int
    bytes_by_tag: dict[str, tuple[int, int]]
    tokens_per_step: int
    wire_tx_bytes: int | None = None  # kernel interface counters, net="netns" runs only
    wire_rx_bytes: int | None = None
    extra: dict[str, tuple[float, str]] = field(default_factory=dict)


class RankContext:
    def __init__(self, cfg: RunConfig, comm: Comm, *,
                 progress: Callable[[int, dict], None] | None = None):
        self.cfg = cfg
        self.params = cfg.params
        self.comm = comm
        self.rank = comm.rank
        self.world_size = comm.world_size
        self.device = getattr(comm, "device", torch.device("cpu"))
        self.history: dict[str, list[float]] = {}
        self.extra: dict[str, tuple[float, str]] = {}  # name -> (value, unit)
        self.tokens_per_step = 0
        self._progress = progress
        self._last_report = _clock()
        self._timer = rank_meters.StepTimer(self.device)
        self._snap0: MeterSnapshot | None = None
        self._window: MeterSnapshot | None = None
        self._excluded: list[MeterSnapshot] = []  # unmetered work inside the window
        self._wire0: tuple[int, int] | None = None
        self._wire: tuple[int, int] | None = None
        self._reset_ok = False
        self._netif = rank_meters.netif_from_env()
        self._fault = parse_fault(cfg.inject_fault, cfg.world_size) if cfg.inject_fault else None
        self._tensor_meter = (rank_meters.TensorMemoryMeter(self.device.type)
                              if cfg.memory == "tensor" and self.device.type == "cpu" else None)
        self._tensor0 = 0
        self._tensor_peak: int | None = None

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Where the rank program runs: loads the data first (so neither its
        decoding nor its tensors land in the measured window) and counts the
        program's tensor storages from its first allocation on."""
        from .data import get_dataset

        get_dataset(self.cfg.data).warm()
        with self._tensor_meter if self._tensor_meter is not None else contextlib.nullcontext():
            yield

    @property
    def dtype(self) -> torch.dtype:
        return self.cfg.torch_dtype

    def log(self, **values: float) -> None:
        """Per-step scalars (e.g. loss=...), kept in the result's history."""
        for k, v in values.items():
            v = float(v)
            if (k == "loss" or k.endswith("_loss")) and not math.isfinite(v):
                # Raised in the rank: the launcher's failure path ends every rank
                # and names this one; the record would be refused anyway (JSON has no NaN).
                raise Diverged(f"{k} is {v} at step {len(self.history.get(k, []))}: the run diverged "
                               f"(try a smaller lr, or mu for ZO methods)")
            self.history.setdefault(k, []).append(v)

    def steps(self) -> Iterator[int]:
        """The measured training loop: yields 0..steps-1, timing each step."""
        self._open_window()
        for step in range(self.cfg.steps):
            self._timer.start()
            self._maybe_fail(step)
            yield step
            self._timer.stop()
            if self._progress is not None and self._report_due(step):
                self._progress(step + 1, {k: v[-1] for k, v in self.history.items() if v})
        self._close_window()

    def _report_due(self, step: int) -> bool:
        """Progress at a bounded rate (a launched run's last rank writes a file per report):
        the first and the last step, and otherwise at most one report per PROGRESS_INTERVAL_S."""
        now = _clock()
        if step in (0, self.cfg.steps - 1) or now - self._last_report >= PROGRESS_INTERVAL_S:
            self._last_report = now
            return True
        return False

    @contextlib.contextmanager
    def unmetered(self) -> Iterator[None]:
        """Work inside the measured loop that is not training (a validation pass between steps):
        its payload bytes and messages leave the window and its time leaves the step.  Every rank
        taking part must enter it at the same point.  Kernel wire bytes (``--net netns``) still
        count it."""
        before, t0 = self.comm.meter.snapshot(), rank_meters.now(self.device)
        try:
            yield
        finally:
            self._excluded.append(self.comm.meter.snapshot() - before)
            self._timer.discount(rank_meters.now(self.device) - t0)

    def _maybe_fail(self, step: int) -> None:
        if self._fault and self._fault[:2] == (self.rank, step):
            if self._fault[2] == "exit" and self.cfg.backend != "threads":
                os._exit(3)  # a crash: no report, no cleanup
            raise InjectedFault(f"injected fault at step {step}")

    def _open_window(self) -> None:
        self.comm.barrier()
        if self._netif:
            self._wire0 = rank_meters.interface_bytes(self._netif)
        self._snap0 = self.comm.meter.snapshot()
        self._reset_ok = rank_meters.reset_peak_memory(self.device)
        self._mem0 = rank_meters.current_memory_bytes(self.device)
        if self._tensor_meter is not None:
            self._tensor0 = self._tensor_meter.reset_peak()
        elif self.device.type == "cuda":
            self._tensor0 = int(torch.cuda.memory_allocated(self.device))

    def _close_window(self) -> None:
        self._window = self.comm.meter.snapshot() - self._snap0
        for skipped in self._excluded:
            self._window = self._window - skipped
        if self._tensor_meter is not None:
            self._tensor_peak = self._tensor_meter.peak
        elif self.device.type == "cuda":
            self._tensor_peak = int(torch.cuda.max_memory_allocated(self.device))
        # Every rank's sends have been received once all ranks pass this
        # barrier, so shaped queues have drained into the interface counters.
        self.comm.barrier()
        if self._netif:
            tx, rx = rank_meters.interface_bytes(self._netif)
            self._wire = (tx - self._wire0[0], rx - self._wire0[1])

    def finish(self, params: Iterable[tuple[int, torch.Tensor]]) -> RankOutput:
        if self._window is None:
            raise RuntimeError("ctx.finish() before the ctx.steps() loop completed")
        sent_b, sent_m = self._window.total("sent")
        peak = rank_meters.peak_memory_bytes(self.device)
        recv_b, _ = self._window.total("received")
        return RankOutput(
            rank=self.rank,
            params=[(int(i), p.detach().to("cpu", torch.float32).clone()) for i, p in params],
            history=self.history,
            step_times=list(self._timer.times),
            peak_memory_bytes=peak,
            peak_memory_growth_bytes=max(0, peak - self._mem0),
            peak_memory_reset=self._reset_ok,
            peak_tensor_bytes=self._tensor_peak,
            peak_tensor_growth_bytes=(None if self._tensor_peak is None
                                      else self._tensor_peak - self._tensor0),
            sent_bytes=sent_b,
            sent_messages=sent_m,
            received_bytes=recv_b,
            framing_bytes=self._window.framing_bytes,
            bytes_by_tag=self._window.by_tag("sent"),
            tokens_per_step=self.tokens_per_step,
            wire_tx_bytes=self._wire[0] if self._wire else None,
            wire_rx_bytes=self._wire[1] if self._wire else None,
            extra=dict(self.extra),
        )


def set_rank_threads(n: int) -> None:
    """Intra-op threads per rank (1 by default: ranks share the machine's cores)."""
    torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
