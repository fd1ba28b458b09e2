"""Parameter server for (double-)quantised asynchronous prox-SVRG: master, workers, delay schedule.

One master owns x and a clock t (master updates in the epoch); W workers
pull x, compute a (variance-reduced) minibatch gradient on what they pulled,
and push it back; the master applies each pushed gradient to its *current*
iterate (only the gradient is stale).  Each epoch starts with a synchronous
full-precision map-reduce of the snapshot gradient ∇f(x̃) (SVRG variants).

Asynchrony is an **event schedule** per epoch: a sequence of ``pull w`` and
``push w`` events drawn from a seed (:func:`schedule`), with the bounded
delay ``t − D(t) ≤ τ`` built in.  The same master and worker code runs

* in one process (:func:`simulate`): the deterministic simulator used for exact
  checks and the bits-to-threshold tables, and
* as real ranks over a Comm (:func:`master_epoch`, :func:`worker_epoch`;
  processes on gloo): the master serves the events in schedule order while the
  workers compute concurrently; point-to-point FIFO order makes the run
  follow the schedule exactly, so it reaches the simulator's parameters bit
  for bit; or
* free-running (:func:`master_epoch_arrival`, :func:`worker_epoch_arrival`):
  the master serves whichever worker's message arrives first
  (``Comm.recv_any``).  The bounded delay is still enforced, by admission: a
  pull is granted only while ``t − v_min + H ≤ τ`` (``v_min`` the oldest
  outstanding version, ``H`` the outstanding pulls before this one); a push
  never raises ``t − v_min + H − 1``, so every push has delay ≤ τ whatever the
  arrival order, and a worker whose pull would break the bound waits.  The
  realised delays (histogram, maximum) are recorded; the run is not
  reproducible bit for bit (the arrival order is the machine's).

All randomness (minibatches, quantiser draws, sparsifier draws, schedule) is
keyed by (seed, purpose, epoch, pull index), never by which process runs it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from harness.seeding import keyed_generator

from . import dq_wire as wire
from .problems import Problem

FULL = wire.FULL


@dataclass(frozen=True)
class Variant:
    name: str
    quant_x: bool  # parameters go down quantised (b_x bits)
    quant_g: bool  # gradients go up quantised (b bits)
    sparse: bool = False  # sparsify the gradient difference before quantising
    accel: bool = False  # Acc-AsyLPG: θ_s, y-sequence, epoch-average snapshot
    svrg: bool = True  # variance reduction (snapshot gradient); False = plain async SGD


VARIANTS = {v.name: v for v in (
    Variant("asyfpg", False, False),
    Variant("acc-asyfpg", False, False, accel=True),
    Variant("qsvrg", False, True),
    Variant("asylpg", True, True),
    Variant("sparse-asylpg", True, True, sparse=True),
    Variant("acc-asylpg", True, True, accel=True),
    Variant("qsgd", False, True, svrg=False),
)}


@dataclass(frozen=True)
class Setup:
    """Everything the engine needs (the harness params map onto it)."""

    variant: Variant
    lr: float
    m: int  # master updates per epoch
    batch: int = 20
    b: int = 8  # gradient bits (32 = full precision)
    bx: int = 8  # parameter bits (32 = full precision)
    mu: float = 1.0  # precision constraint (2) / (7)
    adaptive_bx: bool = False  # choose the smallest b_x that satisfies the constraint
    bx_max: int = 16
    phi: float = 1.0  # sparsifier budget as a fraction of ‖α‖₁/‖α‖∞
    tau: int = 0  # maximum delay
    workers: int = 1
    seed: int = 0
    eval_every: int = 0  # evaluate P(x) every this many updates (0: at epoch ends only)

    def __post_init__(self):
        wire.check_bits(self.b, "b (gradient bits)")
        wire.check_bits(self.bx, "b_x (parameter bits)")
        if self.workers < 1:
            raise ValueError(f"a parameter server needs at least one worker, got {self.workers}")
        if self.tau < 0:
            raise ValueError(f"the delay bound tau must be >= 0, got {self.tau}")
        if not self.phi > 0:
            raise ValueError(f"the sparsifier budget phi must be > 0, got {self.phi}")
        if self.phi > 1:
            raise ValueError(f"phi is a fraction of the largest valid budget ‖α‖₁/‖α‖∞ and must be <= 1, got {self.phi}")
        if self.variant.sparse and self.b == FULL:
            raise ValueError("sparse-asylpg quantises the survivors: b must be 2..16")
        if not self.mu > 0:
            raise ValueError(f"mu must be > 0, got {self.mu}")
        if self.lr <= 0 or self.m < 1 or self.batch < 1:
            raise ValueError("lr must be > 0 and m, batch >= 1")
        if not 2 <= self.bx_max <= 16:
            raise ValueError(f"bx_max must be 2..16, got {self.bx_max}")

    @property
    def gbits(self) -> int:
        return self.b if self.variant.quant_g else FULL

    @property
    def xbits(self) -> int:
        return self.bx if self.variant.quant_x else FULL


def keyed_gen(seed: int, *key) -> torch.Generator:
    """This module's streams: blake2b of ``repr((seed, *key))``, 63 bits."""
    return keyed_generator(seed, *key, text=repr, digest="blake2b", bits=63)


# --------------------------------------------------------------------------- schedule
def schedule(m: int, workers: int, tau: int, seed: int, epoch: int) -> list[tuple[str, int, int]]:
    """One epoch's events ``(kind, worker, j)``; ``j`` is the pull index the event belongs to.

    Exactly m pulls and m pushes.  The delay bound is kept by an
    earliest-deadline rule: holders sorted by version v_0 <= v_1 <= ... must
    satisfy ``v_i + τ >= t + i`` (pushing them oldest first would meet every
    deadline).  A pull is allowed while that stays true (i.e. fewer than τ+1
    holders); a push of a random holder is taken when the rest stays feasible,
    else the oldest holder pushes.  Otherwise a fair coin picks pull or push
    and workers are drawn uniformly.  τ = 0 gives pull, push, pull, push, ...
    (serial).  All holders are drained before the epoch ends.
    """
    g = keyed_gen(seed, "schedule", epoch)

    def draw(n: int) -> int:
        return int(torch.randint(n, (), generator=g))

    def feasible(versions: list[int], clock: int) -> bool:
        return all(v + tau >= clock + i for i, v in enumerate(sorted(versions)))

    t = pulls = 0
    holders: dict[int, tuple[int, int]] = {}  # worker -> (version, j)
    events = []
    while t < m:
        idle = [w for w in range(workers) if w not in holders]
        can_pull = pulls < m and idle and len(holders) <= tau
        if can_pull and (not holders or draw(2) == 0):
            w = idle[draw(len(idle))]
            holders[w] = (t, pulls)
            events.append(("pull", w, pulls))
            pulls += 1
            continue
        ws = sorted(holders)
        w = ws[draw(len(ws))]
        if not feasible([v for k, (v, _) in holders.items() if k != w], t + 1):
            w = min(holders, key=lambda k: holders[k])
        events.append(("push", w, holders.pop(w)[1]))
        t += 1
    return events


# --------------------------------------------------------------------------- master
@dataclass
class Stats:
    bits_down: int = 0  # paper bits, inner iterations, master -> workers
    bits_up: int = 0  # paper bits, inner iterations, workers -> master
    bits_epoch: int = 0  # paper bits of the per-epoch full-precision map-reduce
    bytes_total: int = 0  # real payload bytes, every message either way
    flags: int = 0
    pulls: int = 0
    checks: int = 0  # precision constraint evaluations
    violations: int = 0
    max_mu: float = 0.0  # largest realised E‖Q(x)−x‖² / ‖x − x̃‖²
    max_delay: int = 0
    delay_hist: Counter = field(default_factory=Counter)  # realised delay -> pushes
    deferred: int = 0  # arrival mode: pull requests held back to keep the delay bound
    nnz: int = 0
    bx_hist: Counter = field(default_factory=Counter)
    trace: list = field(default_factory=list)  # (updates, bits_inner, bits_total, loss)

    @property
    def bits_inner(self) -> int:
        return self.bits_down + self.bits_up

    def extra(self) -> dict[str, tuple[float, str]]:
        return {"paper_bits_down": (self.bits_down, "bits"), "paper_bits_up": (self.bits_up, "bits"),
                "paper_bits_epoch": (self.bits_epoch, "bits"), "payload_bytes_total": (self.bytes_total, "bytes"),
                "flag_messages": (self.flags, "messages"), "constraint_checks": (self.checks, "checks"),
                "constraint_violations": (self.violations, "checks"), "max_realised_mu": (self.max_mu, "ratio"),
                "max_delay": (self.max_delay, "updates")}

    def arrival_extra(self, tau: int) -> dict[str, tuple[float, str]]:
        """The free-running master's realised delays (histogram, bound checks)."""
        out = {f"delay_hist_{d}": (float(self.delay_hist.get(d, 0)), "pushes") for d in range(self.max_delay + 1)}
        out["delay_bound_violations"] = (float(sum(n for d, n in self.delay_hist.items() if d > tau)), "pushes")
        out["pulls_deferred_by_tau"] = (float(self.deferred), "events")
        return out

    def bits_to(self, threshold: float, total: bool = False) -> float | None:
        for _, inner, tot, loss in self.trace:
            if loss < threshold:
                return tot if total else inner
        return None


def smallest_bits(x: torch.Tensor, bound: float, bx_max: int) -> int:
    """Adaptive b_x: the fewest bits whose exact E‖Q(x) − x‖² is within the bound (else full precision)."""
    return next((b for b in range(2, bx_max + 1) if wire.exact_mse(x, b) <= bound), FULL)


class Master:
    def __init__(self, prob: Problem, setup: Setup, dtype: torch.dtype):
        self.prob, self.st, self.var = prob, setup, setup.variant
        self.x = prob.init(setup.seed, dtype)
        self.anchor = self.x.clone()  # x̃ (AsyLPG: x̃^s; Acc: x̃^{s-1})
        self.y = self.x.clone()  # Acc-AsyLPG's y sequence
        self.g_tilde = torch.zeros_like(self.x)
        self.stats = Stats()
        self.updates = 0
        self.losses: list[float] = []

    # ---- epoch boundary ----------------------------------------------------
    def begin_epoch(self, s: int) -> wire.Msg | None:
        """Set up epoch s; returns the snapshot every worker gets (None without variance reduction)."""
        self.s, self.t = s, 0
        self.version: dict[int, int] = {}
        if self.var.accel:
            self.theta = 2.0 / (s + 3)  # paper's θ_s = 2/(s+2) with s = 1, 2, ...
            self.eta = self.st.lr / self.theta  # experiments: η_s = lr/θ_s
            self.x = self.theta * self.y + (1 - self.theta) * self.anchor
            self.x_sum = torch.zeros_like(self.x)
        if not self.var.svrg:
            return None
        snap = wire.full(self.anchor)
        self.stats.bits_epoch += snap.paper_bits * self.st.workers
        self.stats.bytes_total += snap.nbytes * self.st.workers
        return snap

    def set_full_grad(self, partials: list[torch.Tensor]) -> None:
        """g̃ = ∇f(x̃) from the workers' partial sums, added in worker order."""
        total = None
        for data in partials:
            self.stats.bits_epoch += 32 * self.prob.d
            self.stats.bytes_total += data.numel()
            part = wire.decode_dense(data, self.prob.d)
            total = part if total is None else total + part
        self.g_tilde = self.prob.finish_full_grad(total, self.anchor)

    def end_epoch(self) -> None:
        self.anchor = self.x_sum / self.st.m if self.var.accel else self.x.clone()
        self.x = self.anchor.clone() if self.var.accel else self.x
        self._evaluate()

    # ---- inner iterations --------------------------------------------------
    def _param_bits(self, x: torch.Tensor) -> int:
        """b_x for this pull (fixed, or the smallest satisfying the constraint), checking (2)/(7)."""
        st = self.st
        bound = st.mu * float((x - self.anchor).pow(2).sum())
        if self.var.accel:
            bound *= self.theta  # (7): θ_s μ ‖x − x̃^{s−1}‖²
        bits = smallest_bits(x, bound, st.bx_max) if st.adaptive_bx else st.bx
        mse = wire.exact_mse(x, bits)
        self.stats.checks += 1
        self.stats.violations += mse > bound
        if bound > 0:
            self.stats.max_mu = max(self.stats.max_mu, mse / bound * st.mu)
        self.stats.bx_hist[bits] += 1
        return bits

    def pull(self, j: int) -> wire.Msg:
        x, st = self.x, self.st
        self.version[j] = self.t
        self.stats.pulls += 1
        if self.var.svrg and torch.equal(x, self.anchor):
            msg = wire.flag()  # the worker holds x̃ already
            self.stats.flags += 1
        elif self.var.quant_x:
            msg = wire.quantized(x, self._param_bits(x), keyed_gen(st.seed, "x", self.s, j))
        else:
            msg = wire.full(x)
        self.stats.bits_down += msg.paper_bits
        self.stats.bytes_total += msg.nbytes
        return msg

    def may_pull(self) -> bool:
        """Arrival mode's admission rule: one more pull keeps every delay within τ.

        With ``H`` pulls outstanding (oldest at version ``v_min``), at most ``H``
        pushes can land before the oldest one, so granting a pull now is safe
        iff ``t − v_min + H ≤ τ``; pushes never increase ``t − v_min + H``.
        """
        v_min = min(self.version.values(), default=self.t)
        return self.t - v_min + len(self.version) <= self.st.tau

    def _grad_bits(self, data: torch.Tensor) -> int:
        d = self.prob.d
        if self.var.sparse:
            nnz = wire.sparse_nnz(data, d)
            self.stats.nnz += nnz
            return wire.sparse_paper_bits(d, nnz, self.st.gbits)
        return wire.dense_paper_bits(d, self.st.gbits)

    def push(self, j: int, data: torch.Tensor) -> None:
        """Apply the gradient computed on the model of pull j to the current iterate."""
        st, prob = self.st, self.prob
        delay = self.t - self.version.pop(j)
        self.stats.max_delay = max(self.stats.max_delay, delay)
        self.stats.delay_hist[delay] += 1
        self.stats.bits_up += self._grad_bits(data)
        self.stats.bytes_total += data.numel()
        if self.var.sparse:
            g = wire.decode_sparse(data, prob.d, self.x.dtype)
        else:
            g = wire.decode_dense(data, prob.d)
        u = g + self.g_tilde if self.var.svrg else g
        if self.var.accel:
            self.y = prob.prox(self.y - self.eta * u, self.eta)
            self.x = self.anchor + self.theta * (self.y - self.anchor)
            self.x_sum += self.x
        else:
            self.x = prob.prox(self.x - st.lr * u, st.lr)
        self.t += 1
        self.updates += 1
        if st.eval_every and self.updates % st.eval_every == 0 and self.t < st.m:
            self._evaluate()

    def _evaluate(self) -> None:
        loss = self.prob.objective(self.x)
        s = self.stats
        s.trace.append((self.updates, s.bits_inner, s.bits_inner + s.bits_epoch, loss))
        self.losses.append(loss)


# --------------------------------------------------------------------------- worker
class Worker:
    def __init__(self, prob: Problem, setup: Setup, w: int):
        self.prob, self.st, self.w = prob, setup, w
        self.part = prob.partition(w, setup.workers)
        self.anchor: torch.Tensor | None = None

    def epoch_start(self, data: torch.Tensor) -> wire.Msg:
        """Store x̃ and return the partial full gradient Σ_{i ∈ partition} ∇ℓ_i(x̃)."""
        self.anchor = wire.decode_dense(data, self.prob.d)
        return wire.full(self.prob.data_grad_sum(self.anchor, self.part))

    def compute(self, s: int, j: int, data: torch.Tensor) -> wire.Msg:
        st, prob = self.st, self.prob
        xhat = self.anchor if wire.is_flag(data) else wire.decode_dense(data, prob.d)
        pick = torch.randint(self.part.numel(), (st.batch,), generator=keyed_gen(st.seed, "batch", s, j))
        idx = self.part[pick]
        alpha = prob.batch_grad(xhat, idx)
        if st.variant.svrg:
            alpha = alpha - prob.batch_grad(self.anchor, idx)
        gen = keyed_gen(st.seed, "g", s, j)
        if st.variant.sparse:
            return wire.sparse_quantized(alpha, st.gbits, st.phi, gen)
        return wire.quantized(alpha, st.gbits, gen)


# --------------------------------------------------------------------------- drivers
def epoch_events(st: Setup, s: int) -> list[tuple[str, int, int]]:
    return schedule(st.m, st.workers, st.tau, st.seed, s)


def simulate_epoch(master: Master, workers: list[Worker], s: int) -> None:
    snap = master.begin_epoch(s)
    if snap is not None:
        master.set_full_grad([wk.epoch_start(snap.data).data for wk in workers])
    held: dict[int, wire.Msg] = {}
    for kind, w, j in epoch_events(master.st, s):
        if kind == "pull":
            held[w] = master.pull(j)
        else:
            master.push(j, workers[w].compute(s, j, held.pop(w).data).data)
    master.end_epoch()


def simulate(prob: Problem, setup: Setup, epochs: int, dtype: torch.dtype = torch.float64,
             stop_below: float | None = None, stop_above: float | None = None,
             epoch_times: list[float] | None = None) -> Master:
    """The deterministic simulator: the whole parameter server in this process.

    It stops at the end of the first epoch whose evaluations include a loss below ``stop_below``
    (the threshold reached) or one above ``stop_above`` or not finite (the run diverged).
    ``epoch_times``, when given, receives each epoch's wall seconds (a time is shown with its
    spread)."""
    master = Master(prob, setup, dtype)
    workers = [Worker(prob, setup, w) for w in range(setup.workers)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: intra-op threads only add overhead (10x on a busy 2-core box)
    try:
        for s in range(epochs):
            t0 = time.perf_counter()
            simulate_epoch(master, workers, s)
            if epoch_times is not None:
                epoch_times.append(time.perf_counter() - t0)
            if stop_below is not None and master.stats.bits_to(stop_below) is not None:
                break
            if stop_above is not None and any(not loss <= stop_above for *_, loss in master.stats.trace):
                break
    finally:
        torch.set_num_threads(threads)
    return master


TAG_SNAP, TAG_PARTIAL, TAG_MODEL, TAG_GRAD = "dq/snapshot", "dq/partial", "dq/model", "dq/grad"


def master_epoch(comm, master: Master, s: int) -> None:
    """Rank 0's epoch over a Comm (worker w is rank w + 1)."""
    snap = master.begin_epoch(s)
    if snap is not None:
        for w in range(master.st.workers):
            comm.send(snap.data, w + 1, TAG_SNAP)
        master.set_full_grad([comm.recv(w + 1, TAG_PARTIAL) for w in range(master.st.workers)])
    for kind, w, j in epoch_events(master.st, s):
        if kind == "pull":
            comm.send(master.pull(j).data, w + 1, TAG_MODEL)
        else:
            master.push(j, comm.recv(w + 1, TAG_GRAD))
    master.end_epoch()


def worker_epoch(comm, worker: Worker, s: int) -> None:
    if worker.st.variant.svrg:
        comm.send(worker.epoch_start(comm.recv(0, TAG_SNAP)).data, 0, TAG_PARTIAL)
    for kind, w, j in epoch_events(worker.st, s):
        if kind == "pull" and w == worker.w:
            comm.send(worker.compute(s, j, comm.recv(0, TAG_MODEL)).data, 0, TAG_GRAD)


# --------------------------------------------------------------------------- free-running (arrival order)
TAG_UP = "dq/up"  # worker -> master in arrival mode: empty = "give me a model", else a gradient
INDEX_BYTES = 4  # arrival mode: the pull index j goes down in front of the model
_EMPTY = torch.empty(0, dtype=torch.uint8)


def _with_index(j: int, data: torch.Tensor) -> torch.Tensor:
    head = torch.tensor(list(j.to_bytes(INDEX_BYTES, "little")), dtype=torch.uint8)
    return torch.cat([head, data])


def master_epoch_arrival(comm, master: Master, s: int) -> None:
    """Rank 0's epoch, serving whichever worker's message arrives first.

    Each worker sends an empty request, then one gradient per model it got (a
    gradient is also its next request); the master answers every message with
    ``j ‖ model`` or, once the epoch's m pulls are all pushed, an empty stop
    message (to every worker at once).
    """
    st = master.st
    snap = master.begin_epoch(s)
    srcs = [w + 1 for w in range(st.workers)]
    if snap is not None:
        for src in srcs:
            comm.send(snap.data, src, TAG_SNAP)
        master.set_full_grad([comm.recv(src, TAG_PARTIAL) for src in srcs])
    holding: dict[int, int] = {}  # worker -> pull index it computes on
    waiting: list[int] = []  # workers waiting for a model, in arrival order
    pulls = 0
    # Stop only when every worker waits (all m pulls out and pushed): then no
    # worker can send again before the master leaves the epoch, so a message
    # of the next epoch is never taken for one of this epoch.
    while not (pulls == st.m and len(waiting) == st.workers):
        src, data = comm.recv_any(srcs, TAG_UP)
        w = src - 1
        if w in holding:
            master.push(holding.pop(w), data)
        elif data.numel():
            raise RuntimeError(f"worker {w} pushed a gradient without holding a model")
        waiting.append(w)
        while waiting and pulls < st.m and master.may_pull():
            w = waiting.pop(0)
            holding[w] = pulls
            comm.send(_with_index(pulls, master.pull(pulls).data), w + 1, TAG_MODEL)
            master.stats.bytes_total += INDEX_BYTES
            pulls += 1
        if waiting and pulls < st.m:
            master.stats.deferred += 1  # the delay bound holds a pull back
    for w in waiting:
        comm.send(_EMPTY, w + 1, TAG_MODEL)
    master.end_epoch()


def worker_epoch_arrival(comm, worker: Worker, s: int) -> None:
    if worker.st.variant.svrg:
        comm.send(worker.epoch_start(comm.recv(0, TAG_SNAP)).data, 0, TAG_PARTIAL)
    comm.send(_EMPTY, 0, TAG_UP)
    while (data := comm.recv(0, TAG_MODEL)).numel():
        j = int.from_bytes(bytes(data[:INDEX_BYTES].tolist()), "little")
        comm.send(worker.compute(s, j, data[INDEX_BYTES:]).data, 0, TAG_UP)
