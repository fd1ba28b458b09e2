"""Rank-local meters: synchronised wall time, peak memory, kernel interface byte counters.

Two memories are measured:

* **peak tensor bytes** (the primary one): the high-water mark of the bytes of
  live tensor storages the rank allocated.  On CUDA it is
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on CPU
  :class:`TensorMemoryMeter` counts every storage an aten op of the rank's
  thread returns, and subtracts it when the storage is freed.  It does not
  depend on the Python runtime, the allocator or the machine's load, so the
  same config gives the same number, bit for bit.
* **peak RSS**: the process's resident-set high-water mark (``VmHWM``), reset
  at the start of the measured window by writing 5 to /proc/self/clear_refs
  (Linux; elsewhere the lifetime peak is reported and marked as such).  It is
  read from /proc/self/status, not ``getrusage``: ``ru_maxrss`` survives
  fork+exec and is not reset by clear_refs, so a rank started by a large
  launcher would report the launcher's peak.  It counts every library the rank
  loads: the codecs' compiled kernels (numba and LLVM, about 100 MiB) load at a
  rank's first encode of a tensor of 64K elements or more, which a small run
  never reaches and a large one reaches in its first step.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def synchronize(device: torch.device | str | None = None) -> None:
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


def now(device=None) -> float:
    """Wall clock after the device finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def _status_kib(field_name: str) -> int | None:
    """A ``kB`` field of /proc/self/status (Linux), in KiB; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _rss_peak_bytes() -> int:
    hwm = _status_kib("VmHWM")  # reset by clear_refs, unlike ru_maxrss
    if hwm is not None:
        return hwm * 1024
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


class TensorMemoryMeter(TorchDispatchMode):
    """Live and peak bytes of the tensor storages allocated by aten ops of the
    threads that enter it (the CPU analogue of ``torch.cuda.max_memory_allocated``).

    Every tensor an op returns is looked at once: its untyped storage is
    counted the first time it is seen (views and in-place results share a
    counted storage and add nothing; a storage resized in place is recounted),
    and a ``weakref.finalize`` on the storage subtracts it when the storage is
    freed — torch keeps one Python object per live storage, so the finalizer
    runs when the memory goes, not when a view does.  Storages made before the
    meter is entered, or without an aten op (``torch.frombuffer``), are not
    counted.  A dispatch mode is per thread, so on the threads backend each
    rank counts what its own thread allocated.
    """

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.current = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # id(storage) -> counted bytes
        self._lock = threading.Lock()  # a storage may be freed on another thread

    def reset_peak(self) -> int:
        """Start a new high-water mark at the bytes live now; returns them."""
        with self._lock:
            self.peak = self.current
            return self.current

    def _freed(self, key: int) -> None:
        with self._lock:
            self.current -= self._sizes.pop(key)

    def _see(self, t: torch.Tensor) -> None:
        if t.device.type != self.device_type or t.is_sparse or t.layout != torch.strided:
            return
        storage = t.untyped_storage()
        key, nbytes = id(storage), storage.nbytes()
        with self._lock:
            old = self._sizes.get(key)
            if old is None:
                self._sizes[key] = nbytes
                self.current += nbytes
                weakref.finalize(storage, self._freed, key)
            elif old != nbytes:
                self._sizes[key] = nbytes
                self.current += nbytes - old
            if self.current > self.peak:
                self.peak = self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._see(leaf)
        return out


def interface_bytes(ifname: str) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of a network interface of this process's namespace (wire bytes).

    Read from ``/proc/self/net/dev``, which follows the namespace the process is in; ``/sys``
    shows the namespace its sysfs was mounted in, another one for a process that entered a
    namespace itself (``harness.netns.enter``)."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, colon, counters = line.partition(":")
            if colon and name.strip() == ifname:
                fields = counters.split()  # 8 receive counters, then 8 transmit ones
                return int(fields[8]), int(fields[0])
    raise OSError(f"no network interface {ifname!r} in this process's namespace")


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

    def discount(self, seconds: float) -> None:
        """Leave ``seconds`` of the running step out of its time (work that is not training)."""
        if self._t0 is not None:
            self._t0 += seconds

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def total(self) -> float:
        return sum(self.times)


def netif_from_env() -> str | None:
    """The interface the launcher put this rank on (network-namespace runs)."""
    return os.environ.get("COMMBENCH_NETIF") or None
