"""Block offloading for ZO2 / DistZO2: host master copy, device slots, a logged schedule.

Every offloaded transformer block lives on the host as one flat buffer (the
"bucket" layout, DistZO2 paper App. B.2), padded to ``n * ceil(M / n)`` so it cuts
into ``n`` equal slices.  While a block is in use its parameters are views
into one of ``budget`` device slots; while it is not, they are empty tensors,
so a forward that touches an offloaded block fails loudly instead of quietly
computing on the host copy.

Transfers:

* plain: upload copies the whole block host -> device (``h2d``), offload copies
  it back (``d2h``);
* sliced (DistZO2 paper §6.1): rank ``r`` keeps only slice ``r`` of each block on the
  host, uploads that slice and all-gathers the others from its peers over the
  Comm (``d2d``, metered by the Comm under tag ``zo2.gather``); offload writes
  back only slice ``r``.  Every rank holds the same block after the gather
  because every rank applies the identical update (shared seeds and scalars).

On CPU the "device" is a pool of CPU buffers and each copy is counted; on CUDA
uploads and offloads run on their own streams, ordered against the compute
stream by events, with pinned host buffers so the copies are asynchronous.
Each U/C/O is appended to :class:`ScheduleLog` so checks can verify order and
residency.  With ``trace=True`` each copy and each block's compute is also timed
(:meth:`BlockOffloader.timeline`): on CUDA by events recorded on the stream that
does the work (after its waits, so an interval is the work itself), on CPU by the
wall clock; the timeline shows whether uploads and offloads overlap compute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

LINKS = ("h2d", "d2h", "d2d")


@dataclass
class ScheduleLog:
    """``(pass_id, op, block, resident_after)`` for every U / C / O, in issue order."""

    events: list[tuple[int, str, int, int]] = field(default_factory=list)
    pass_id: int = 0
    max_resident: int = 0

    def record(self, op: str, block: int, resident: int) -> None:
        self.events.append((self.pass_id, op, block, resident))
        self.max_resident = max(self.max_resident, resident)


def verify_schedule(log: ScheduleLog, num_blocks: int, budget: int) -> list[str]:
    """Problems with the log (empty when every pass is a correct ZO2 schedule).

    Per pass: each block uploaded, computed and offloaded exactly once, with
    U(i) < C(i) < O(i), each stage in block order 0..N-1, and never more than
    ``budget`` blocks resident.
    """
    problems: list[str] = []
    passes: dict[int, list[tuple[str, int, int]]] = {}
    for pid, op, blk, res in log.events:
        passes.setdefault(pid, []).append((op, blk, res))
    for pid, evs in sorted(passes.items()):
        pos: dict[tuple[str, int], int] = {}
        for k, (op, blk, res) in enumerate(evs):
            if (op, blk) in pos:
                problems.append(f"pass {pid}: {op}({blk}) twice")
            pos[(op, blk)] = k
            if res > budget:
                problems.append(f"pass {pid}: {res} blocks resident after {op}({blk}) > budget {budget}")
        for i in range(num_blocks):
            keys = [(o, i) for o in "UCO"]
            if any(key not in pos for key in keys):
                problems.append(f"pass {pid}: block {i} lacks one of U/C/O")
            elif not pos[keys[0]] < pos[keys[1]] < pos[keys[2]]:
                problems.append(f"pass {pid}: block {i} not in U < C < O order")
        for op in "UCO":  # each stage visits the blocks in model order
            order = [blk for o, blk, _ in evs if o == op]
            if order != list(range(num_blocks)):
                problems.append(f"pass {pid}: {op} visits blocks in order {order}")
    return problems


def slice_len(numel: int, n: int) -> int:
    """Elements per rank slice of an ``numel`` block cut into ``n`` (padded)."""
    return math.ceil(numel / n)


class BlockOffloader:
    """Host master of ``N`` blocks, ``budget`` device slots, plain or sliced transfers."""

    def __init__(self, blocks: Sequence[Sequence[torch.nn.Parameter]], *, device: torch.device,
                 budget: int = 3, comm=None, sliced: bool = False, log: ScheduleLog | None = None,
                 trace: bool = False):
        if budget < 1:
            raise ValueError(f"resident-block budget must be >= 1, got {budget}")
        self.blocks = [list(b) for b in blocks]
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.budget = budget
        self.comm = comm
        self.sliced = bool(sliced and comm is not None and comm.world_size > 1)
        self.n = comm.world_size if self.sliced else 1
        self.rank = comm.rank if self.sliced else 0
        self.log = log if log is not None else ScheduleLog()
        self.bytes = dict.fromkeys(LINKS, 0)
        self.seconds = dict.fromkeys(LINKS, 0.0)
        self._shapes = [[tuple(p.shape) for p in b] for b in self.blocks]
        self.numel = [sum(p.numel() for p in b) for b in self.blocks]
        self.dtype = self.blocks[0][0].dtype
        self.esize = torch.empty(0, dtype=self.dtype).element_size()
        self.S = [slice_len(m, self.n) for m in self.numel]
        slot_len = max(s * self.n for s in self.S)
        self.host: list[Tensor] = []  # whole padded block (plain) or this rank's slice (sliced)
        for b, m, s in zip(self.blocks, self.numel, self.S, strict=True):
            flat = torch.zeros(s * self.n, dtype=self.dtype)
            flat[:m].copy_(torch.cat([p.detach().reshape(-1).cpu() for p in b]))
            mine = flat[self.rank * s:(self.rank + 1) * s].clone() if self.sliced else flat
            self.host.append(mine.pin_memory() if self.cuda else mine)
            for p in b:  # offloaded: nothing to compute with until uploaded
                p.data = torch.empty(0, dtype=self.dtype, device=self.device)
        self.slots = [torch.zeros(slot_len, dtype=self.dtype, device=self.device) for _ in range(budget)]
        self.free = list(range(budget))
        self.where: dict[int, int] = {}  # block -> slot
        self.max_slots_used = 0
        # (pass, op, block, start, end): CUDA events or perf_counter seconds; see timeline()
        self.trace: list[tuple] | None = [] if trace else None
        self._compute_start = None
        if self.cuda:  # separate upload / offload streams; slot reuse waits for its offload
            self.up_stream, self.off_stream = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
            self.up_done: dict[int, torch.cuda.Event] = {}
            self.slot_free_ev: dict[int, torch.cuda.Event] = {}

    # -- helpers ----------------------------------------------------------------------
    def resident(self) -> list[int]:
        return sorted(self.where)

    def slot_bytes(self) -> int:
        return self.slots[0].numel() * self.esize

    def _mark(self, stream=None):
        """A point in time on ``stream`` (CUDA event) or the wall clock (CPU); None untraced."""
        if self.trace is None:
            return None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream if stream is not None else torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def _traced(self, op: str, block: int, start, end) -> None:
        if self.trace is not None:
            self.trace.append((self.log.pass_id, op, block, start, end))

    def timeline(self) -> list[dict]:
        """The traced intervals, ``{pass, op, block, start_ms, end_ms}`` from the first start,
        op ``U`` (upload), ``C`` (compute) or ``O`` (offload).  Synchronises the device."""
        if not self.trace:
            return []
        self.synchronize()
        if self.cuda:  # times from the first start event; the earliest start on any stream is 0
            t0 = self.trace[0][3]
            raw = [(float(t0.elapsed_time(a)), float(t0.elapsed_time(b))) for *_, a, b in self.trace]
        else:
            raw = [(a * 1e3, b * 1e3) for *_, a, b in self.trace]
        first = min(a for a, _ in raw)
        return [{"pass": pid, "op": op, "block": blk, "start_ms": a - first, "end_ms": b - first}
                for (pid, op, blk, _, _), (a, b) in zip(self.trace, raw, strict=True)]

    def _count(self, link: str, nbytes: int, t0: float) -> None:
        self.bytes[link] += nbytes
        self.seconds[link] += time.perf_counter() - t0

    # -- the three stages --------------------------------------------------------------
    def upload(self, i: int) -> None:
        if i in self.where:
            raise RuntimeError(f"block {i} uploaded twice")
        if not self.free:
            raise RuntimeError(f"no free device slot for block {i}: budget {self.budget} exceeded")
        k = self.free.pop(0)
        slot, s, m = self.slots[k], self.S[i], self.numel[i]
        lo = self.rank * s
        t0 = time.perf_counter()
        if self.cuda:
            with torch.cuda.stream(self.up_stream):
                if k in self.slot_free_ev:
                    self.up_stream.wait_event(self.slot_free_ev.pop(k))
                start = self._mark(self.up_stream)
                part = slot[lo:lo + s] if self.sliced else slot[:m]
                part.copy_(self.host[i][:part.numel()], non_blocking=True)
                ev = torch.cuda.Event(enable_timing=self.trace is not None)
                ev.record(self.up_stream)
                self.up_done[i] = ev
                self._traced("U", i, start, ev if self.trace is not None else None)
        else:
            start = self._mark()
            if self.sliced:
                slot[lo:lo + s].copy_(self.host[i])
            else:
                slot[:m].copy_(self.host[i][:m])
            self._traced("U", i, start, self._mark())
        self._count("h2d", (s if self.sliced else m) * self.esize, t0)
        if self.sliced:  # the rest of the block comes from the peers
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self.up_done[i])
            t0 = time.perf_counter()
            parts = self.comm.all_gather(slot[lo:lo + s], tag="zo2.gather")
            for r, part in enumerate(parts):
                if r != self.rank:
                    slot[r * s:(r + 1) * s].copy_(part)
            self._count("d2d", (self.n - 1) * s * self.esize, t0)
        self.where[i] = k
        self.max_slots_used = max(self.max_slots_used, len(self.where))
        flat, off = slot, 0
        for p, shape in zip(self.blocks[i], self._shapes[i], strict=True):
            size = math.prod(shape)
            p.data = flat[off:off + size].view(shape)
            off += size
        self.log.record("U", i, len(self.where))

    def before_compute(self, i: int) -> None:
        if i not in self.where:
            raise RuntimeError(f"block {i} computed while not resident")
        if self.cuda and i in self.up_done:
            torch.cuda.current_stream(self.device).wait_event(self.up_done.pop(i))
        self._compute_start = self._mark()

    def computed(self, i: int) -> None:
        self._traced("C", i, self._compute_start, self._mark())
        self.log.record("C", i, len(self.where))

    def offload(self, i: int) -> None:
        k = self.where.pop(i)
        slot, s, m = self.slots[k], self.S[i], self.numel[i]
        lo = self.rank * s
        t0 = time.perf_counter()
        if self.cuda:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.off_stream):
                self.off_stream.wait_event(done)
                start = self._mark(self.off_stream)
                src = slot[lo:lo + s] if self.sliced else slot[:m]
                self.host[i][:src.numel()].copy_(src, non_blocking=True)
                ev = torch.cuda.Event(enable_timing=self.trace is not None)
                ev.record(self.off_stream)
                self.slot_free_ev[k] = ev
                self._traced("O", i, start, ev if self.trace is not None else None)
        else:
            start = self._mark()
            if self.sliced:
                self.host[i].copy_(slot[lo:lo + s])
            else:
                self.host[i][:m].copy_(slot[:m])
            self._traced("O", i, start, self._mark())
        self._count("d2h", (s if self.sliced else m) * self.esize, t0)
        for p in self.blocks[i]:
            p.data = torch.empty(0, dtype=self.dtype, device=self.device)
        self.free.append(k)
        self.log.record("O", i, len(self.where))

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # -- whole-model views ------------------------------------------------------------
    def block_tensors(self, i: int) -> list[Tensor]:
        """Block ``i``'s parameters as CPU tensors, from the host (gathering slices when sliced)."""
        self.synchronize()
        flat = self.host[i].cpu()
        if self.sliced:
            flat = torch.cat(self.comm.all_gather(flat, tag="zo2.final"))
        out, off = [], 0
        for shape in self._shapes[i]:
            size = math.prod(shape)
            out.append(flat[off:off + size].view(shape).clone())
            off += size
        return out

