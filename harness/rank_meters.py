"""Rank-local meters: synchronised wall time, peak memory, kernel interface byte counters.

Peak memory on CPU is the process's resident-set high-water mark, reset at
the start of the measured window by writing 5 to /proc/self/clear_refs (Linux;
elsewhere the lifetime peak is reported and marked as such).  On CUDA it is
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


def now(device=None) -> float:
    """Wall clock after the device finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def _rss_peak_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_memory(device=None) -> bool:
    """Reset the peak-memory counter; returns False where it cannot be reset."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_bytes(device=None) -> int:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    return _rss_peak_bytes()


def current_memory_bytes(device=None) -> int:
    """Memory in use now: resident set size (CPU) or allocated bytes (CUDA)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return int(torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def interface_bytes(ifname: str) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of a network interface of this process's namespace (wire bytes)."""
    base = f"/sys/class/net/{ifname}/statistics"
    with open(f"{base}/tx_bytes") as f:
        tx = int(f.read())
    with open(f"{base}/rx_bytes") as f:
        rx = int(f.read())
    return tx, rx


@dataclass
class StepTimer:
    """Per-step wall times (device-synchronised); reports the median."""

    device: object = None
    times: list[float] = field(default_factory=list)
    _t0: float | None = None

    def start(self) -> None:
        self._t0 = now(self.device)

    def stop(self) -> float:
        if self._t0 is None:
            raise RuntimeError("StepTimer.stop() without start()")
        dt = now(self.device) - self._t0
        self._t0 = None
        self.times.append(dt)
        return dt

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def total(self) -> float:
        return sum(self.times)


def netif_from_env() -> str | None:
    """The interface the launcher put this rank on (network-namespace runs)."""
    return os.environ.get("COMMBENCH_NETIF") or None
