"""The pipeline engine against its peers, step by step in one pair of gloo processes.

The launcher-level benchmarks (``pipeline_ratio``, ``pipelining_ratio``) start a
pair of processes per run and alternate whole runs: on a shared VM whose speed
drifts by tens of per cent over seconds, their per-repeat ratios spread over
±30 %.  Here two spawned gloo ranks hold one copy of the stages per contestant
(same seed) and run the contestants' steps in turn, in an order drawn at random
every round (``turns``: a rotation favoured some contestants), with a barrier before
each: the engine's ``pipeline_step`` over a ``TorchDistComm`` of its own in both
schedules (what ``pipeline-sgd`` runs per step, without the launcher's per-step
bookkeeping), ``torch.distributed.pipelining``'s ``ScheduleGPipe`` and ``Schedule1F1B``, the hand-written GPipe of
``pipeline_ratio`` (bare ``dist.isend`` / ``recv``), the engine's 1F1B with its links
carrying raw tensor bytes, no codec (what the lossless codec's work per message costs it), and
the engine's 1F1B posting all its receives ahead as its GPipe does, and none ahead
(``AHEAD_CHOICES``: the other choices of ``engine.POSTS_AHEAD``, which posts the gradients'
only), and the engine's 1F1B whose links encode each message into a
payload of its own that the Comm copies into its frame and decode a payload copied out of the
Comm's buffer (what they did before the codec wrote into the frame and read where the message
arrived: ``Codec.writer``, ``Codec.reader``).  A step's time is the slower
rank's, from the barrier to after the optimiser step; a ratio is taken per step
between neighbours in time (the same round), and the table gives its median
[quartiles] over the measured steps and the 95 % interval of that median
(``spread.median_interval``: whether a median of 1.02 is above 1.0), with each
contestant's median step time and CPU time, the latter also split by thread (mean per step, both ranks, from
``/proc/self/task``: the main thread, gloo's transport threads, any other;
clock-tick resolution, so only a mean over many steps says anything).  Every
contestant's final ``params_sha256`` is printed: all equal (the same
arithmetic), or the table says DIFFER.

The last line is this machine's idle penalty (``idle_penalty``): one micro-batch's compute
right after 0.5 and 5 ms of sleep, against back to back.  Where it is above
``idle_penalty.MAX_PENALTY``, a schedule
whose stages wait longer for each other pays for it in compute, so part of a ratio between
schedules is the machine's.

``--back-to-back K`` runs K steps per contestant's turn, one after the other with no barrier
between them, as a training loop runs; the table then gives the ratios of the turn's first step
(after the barrier) and of the steps after it apart.  A step after a barrier starts both ranks
together, with nothing of the last step in flight; back to back, a rank starts its next step as
soon as its own part of the last is done, so what a schedule overlaps across a step's boundary
shows only there (the launcher-level benchmarks time steps back to back).

``--contestants A,B,...`` runs only those (in the same interleaving) and the ratios between
them: more rounds of the pair a question is about in the same time.

    python3 -m benchmarks.pipeline_interleaved [--model tiny-opt] [--steps 200] [--micro-batches 4]
        [--back-to-back 1] [--contestants engine[1f1b],Schedule1F1B]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import statistics
import time

import torch
import torch.distributed as dist

from algorithms.codecs import Payload
from algorithms.codecs.channel import Channel
from benchmarks import progress
from benchmarks.gloo_pair import run_pair
from benchmarks.idle_penalty import MAX_PENALTY, penalty, stage_work
from benchmarks.pipeline_ratio import hand_gpipe_step
from benchmarks.pipelining_ratio import StageModule, engine_config
from benchmarks.spread import median_interval, quartiles
from benchmarks.turns import turn_order

WARMUP = 3  # rounds left out (the peer's first step infers its boundary shapes)
CONTESTANTS = ("engine[gpipe]", "engine[1f1b]", "ScheduleGPipe", "Schedule1F1B", "hand-written GPipe",
               "engine[1f1b] raw bytes", "engine[1f1b] ahead", "engine[1f1b] none ahead", "engine[1f1b] encoded")
#: The engine's 1F1B posting other receives ahead than its own (``engine.POSTS_AHEAD``): every
#: one, as its GPipe does, and none, as it did before it posted the gradients'
AHEAD_CHOICES = {"engine[1f1b] ahead": ("act", "grad"), "engine[1f1b] none ahead": ()}
RATIOS = (("engine[gpipe]", "ScheduleGPipe"), ("engine[1f1b]", "Schedule1F1B"),
          ("engine[gpipe]", "hand-written GPipe"), ("engine[1f1b]", "engine[gpipe]"),
          ("Schedule1F1B", "ScheduleGPipe"), ("engine[1f1b] raw bytes", "Schedule1F1B"),
          ("engine[1f1b]", "engine[1f1b] raw bytes"), ("engine[1f1b] ahead", "Schedule1F1B"),
          ("engine[1f1b] ahead", "engine[1f1b]"), ("engine[1f1b]", "engine[1f1b] none ahead"),
          ("engine[1f1b] none ahead", "Schedule1F1B"), ("engine[1f1b]", "engine[1f1b] encoded"),
          ("engine[1f1b] encoded", "Schedule1F1B"))


def _raw_bytes_links(stage, rank: int, rows: int, seq_len: int):
    """The engine's links with no codec: each boundary tensor crosses as its raw bytes and is
    viewed back in the shape the stage's boundary has (what a codec's header would carry).  The
    engine's 1F1B over them is what that schedule costs without the lossless codec's work per
    message (its payload copy, header and CRCs); the same arithmetic, so the same parameters."""
    from algorithms.codecs.channel import Channel
    from algorithms.pipeline.engine import StageLinks

    class RawBytes(Channel):
        def __init__(self, spec):
            super().__init__(codec=None)
            self.shape, self.dtype = spec.shape, spec.dtype

        def send(self, comm, x, dst, tag, key=None):
            comm.send(x.detach().contiguous().reshape(-1).view(torch.uint8), dst, tag=tag)

        def recv(self, comm, src, tag, key=None, device=None):
            return comm.recv(src, tag=tag).view(self.dtype).reshape(self.shape)

    (into,), (out,) = stage.input_specs(rows, seq_len), stage.output_specs(rows, seq_len)
    return StageLinks(fwd_in=RawBytes(into) if rank == 1 else None, bwd_out=RawBytes(into) if rank == 1 else None,
                      fwd_out=RawBytes(out) if rank == 0 else None, bwd_in=RawBytes(out) if rank == 0 else None)


class EncodedChannel(Channel):
    """A channel whose every message is encoded into a payload of its own that the Comm copies
    into its frame, and received as a payload copied out of the Comm's buffer, then decoded: the
    channel before the codec wrote into the frame and read where it arrived (``Codec.writer``,
    ``Codec.reader``).  On the host only."""

    def send(self, comm, x, dst, tag, key=None):
        x = x.detach() if x.requires_grad else x
        comm.send(self.codec.encode(x, generator=self.generator).data, dst, tag=tag)

    def recv(self, comm, src, tag, key=None, device=None):
        return self.codec.decode(Payload(comm.recv(src, tag=tag)), max_numel=self.max_numel)


def _encoded_links(rank: int, world_size: int, codecs):
    """The engine's links, made of :class:`EncodedChannel`."""
    from algorithms.pipeline.engine import StageLinks

    links = StageLinks.direct(rank, world_size, codecs)
    for c in links.all():
        c.__class__ = EncodedChannel
    return links


@contextlib.contextmanager
def posting_ahead(tags: tuple[str, ...]):
    """The engine's 1F1B posts the receives of ``tags`` ahead (``engine.POSTS_AHEAD``) inside the
    ``with`` only: another contestant's step, after it, posts what the engine does."""
    from algorithms.pipeline.engine import POSTS_AHEAD

    own, POSTS_AHEAD["1f1b"] = POSTS_AHEAD["1f1b"], tags
    try:
        yield
    finally:
        POSTS_AHEAD["1f1b"] = own


def chosen(spec: str | None) -> tuple[str, ...]:
    """The contestants ``--contestants`` names (comma-separated, in ``CONTESTANTS``' order; None:
    all); ValueError for an unknown name, or for names between which ``RATIOS`` has no ratio."""
    if spec is None:
        return CONTESTANTS
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTESTANTS]
    if unknown:
        raise ValueError(f"unknown contestant(s) {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(CONTESTANTS)}")
    out = tuple(n for n in CONTESTANTS if n in names)
    if not ratios(out):
        raise ValueError(f"no ratio this benchmark reports is between {', '.join(out)}; its ratios: "
                         + "; ".join(f"{a} / {b}" for a, b in RATIOS))
    return out


def ratios(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The pairs of ``RATIOS`` whose both contestants run."""
    return [r for r in RATIOS if set(r) <= set(names)]


def _contestants(cfg, rank: int, comm, names: tuple[str, ...]):
    """name -> (stage, optimiser, step(ids, labels), the Comm to synchronise on) for this rank,
    each on its own stage copy.  A contestant that sends through a Comm has its own (``comm``
    synchronises the others): a Comm keeps a size history per peer and tag, and one contestant's
    sizes (the raw-byte links' lack the codec's header) would make the next one's first large
    frames of a step travel as header and body, which no run of a single algorithm does after
    its first step."""
    from torch.distributed import pipelining

    from algorithms.pipeline.engine import LinkCodecs, pipeline_step, run_step
    from algorithms.pipeline.sgd import _optimizer, _wire_codec
    from harness.comm.torchdist import TorchDistComm
    from harness.models import build_stage, lm_loss

    p, M = cfg.params, cfg.micro_batches
    wire = _wire_codec(cfg.torch_dtype)
    codecs = LinkCodecs(forward=wire, backward=wire)
    out = {}
    for name in names:
        stage = build_stage(cfg.model, seed=cfg.seed, num_stages=2, stage_index=rank, cut=p.cut,
                            dtype=cfg.torch_dtype)
        opt = _optimizer(stage.parameters(), p)
        own = TorchDistComm("gloo", timeout_s=comm.timeout_s, metered=True) if name.startswith("engine") else comm
        if name == "engine[1f1b] raw bytes":
            links = _raw_bytes_links(stage, rank, cfg.batch_size // M, cfg.seq_len)

            def step(ids, labels, stage=stage, links=links, own=own):
                run_step(own, stage, ids, labels, M, links, schedule="1f1b")
        elif name == "engine[1f1b] encoded":
            links = _encoded_links(rank, 2, codecs)

            def step(ids, labels, stage=stage, links=links, own=own):
                run_step(own, stage, ids, labels, M, links, schedule="1f1b")
        elif name in AHEAD_CHOICES:
            def step(ids, labels, stage=stage, own=own, tags=AHEAD_CHOICES[name]):
                with posting_ahead(tags):
                    pipeline_step(own, stage, ids, labels, M, codecs, "1f1b")
        elif name.startswith("engine"):
            schedule = name[len("engine["):-1]

            def step(ids, labels, stage=stage, schedule=schedule, own=own):
                pipeline_step(own, stage, ids, labels, M, codecs, schedule)
        elif name.startswith("Schedule"):
            cls = getattr(pipelining, name)
            kw = {"scale_grads": False} if "scale_grads" in inspect.signature(cls.__init__).parameters else {}
            sched = cls(pipelining.PipelineStage(StageModule(stage), rank, 2, torch.device("cpu")), M,
                        loss_fn=lambda o, y: lm_loss(o, y) / M, **kw)

            def step(ids, labels, sched=sched):
                if rank == 0:
                    sched.step(ids, input_ids=ids)
                else:
                    sched.step(input_ids=ids, target=labels, losses=[])
        else:
            def step(ids, labels, stage=stage):
                hand_gpipe_step(cfg, rank, stage, ids, labels)
        out[name] = (stage, opt, step, own)
    return out


def thread_ticks() -> dict[str, int]:
    """CPU clock ticks so far of this process's threads, by kind: the main thread, gloo's
    transport threads (named ``gloo*``), and any other."""
    out = {"main": 0, "gloo": 0, "other": 0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        kind = "main" if int(tid) == os.getpid() else "gloo" if name.startswith("gloo") else "other"
        out[kind] += int(fields[11]) + int(fields[12])  # utime + stime
    return out


def stage_params(stage) -> list[tuple[int, object]]:
    """A stage's parameters by global index, copied out as numpy arrays (what a rank hands back
    for the contestant's ``params_sha256``)."""
    return [(i, t.detach().numpy().copy()) for i, _, t in stage.global_named_parameters()]


def seconds_per_step(ticks: dict[str, dict[str, int]], steps: int) -> dict[str, dict[str, float]]:
    """Clock ticks summed over ``steps`` measured rounds, as seconds per step (by contestant and
    thread kind)."""
    return {n: {k: v / os.sysconf("SC_CLK_TCK") / steps for k, v in t.items()} for n, t in ticks.items()}


def pair_totals(threads: tuple[dict, dict], params: tuple[dict, dict]) -> tuple[dict, dict]:
    """From the two ranks' per-step thread CPU and stage parameters (each by contestant): the CPU
    per step by thread kind summed over both ranks, and each contestant's ``params_sha256``."""
    from harness.results.fingerprint import params_sha256

    cpu = {n: {k: sum(t[n][k] for t in threads) for k in ("main", "gloo", "other")} for n in threads[0]}
    shas = {n: params_sha256(sorted(((i, torch.from_numpy(t)) for p in params for i, t in p[n]),
                                    key=lambda p: p[0])) for n in params[0]}
    return cpu, shas


def _rank(rank: int, port: int, cfg, run: int, names: tuple[str, ...], q) -> None:
    from algorithms.pipeline.local import batch
    from harness.comm.torchdist import TorchDistComm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(cfg.threads_per_rank or 1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0, metered=True)
    runs = _contestants(cfg, rank, comm, names)
    wall = {n: [[] for _ in range(run)] for n in names}  # by place in the turn
    cpu = {n: [] for n in names}
    ticks = {n: {"main": 0, "gloo": 0, "other": 0} for n in names}
    for rnd in progress.rounds(cfg.steps, "pipeline_interleaved", report=rank == 0):
        batches = [batch(cfg, rnd * run + j, "cpu") for j in range(run)]
        for name in turn_order(rnd, names):
            stage, opt, fn, sync = runs[name]
            sync.barrier()  # also waits for the engine's posted sends: none is left in flight
            t0 = thread_ticks()
            for j, (ids, labels) in enumerate(batches):  # back to back, as a training loop runs
                w0, c0 = time.perf_counter(), time.process_time()
                opt.zero_grad(set_to_none=True)
                fn(ids, labels)
                opt.step()
                wall[name][j].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
            if rnd >= WARMUP:
                for kind, n in thread_ticks().items():
                    ticks[name][kind] += n - t0[kind]
    params = {n: stage_params(runs[n][0]) for n in names}
    q.put((rank, wall, cpu, params, seconds_per_step(ticks, (cfg.steps - WARMUP) * run)))
    comm.close()  # also leaves the process group


def measure(cfg, run: int = 1, names: tuple[str, ...] = CONTESTANTS) -> tuple[dict, dict, dict, dict, dict]:
    """Run the contestants interleaved on 2 spawned gloo ranks, each turn ``run`` steps back to
    back after a barrier: per contestant, the step times of the slower rank (lists over the
    measured rounds) of each turn's first step and of the ones after it (empty for ``run`` 1),
    the CPU times of both ranks per step, the mean CPU per step by thread kind (both ranks), and
    the final ``params_sha256``."""
    out = run_pair(_rank, cfg, run, names, timeout_s=3600)

    def slower(n: str, j: int) -> list[float]:  # a step takes as long as its slower rank
        return [max(a, b) for a, b in zip(out[0][1][n][j], out[1][1][n][j], strict=True)][WARMUP:]

    first = {n: slower(n, 0) for n in names}
    later = {n: [t for j in range(1, run) for t in slower(n, j)] for n in names} if run > 1 else {}
    # CPU time is the sum of both ranks'
    cpu = {n: [a + b for a, b in zip(out[0][2][n], out[1][2][n], strict=True)][WARMUP * run:]
           for n in names}
    threads, shas = pair_totals((out[0][4], out[1][4]), (out[0][3], out[1][3]))
    return first, later, cpu, threads, shas


def step_config(ap: argparse.ArgumentParser, steps: int, warmup: int):
    """Add the step's options (model, batch, micro-batches, rounds) to ``ap``, parse the command
    line and check it: (the parsed options, the engine's GPipe config)."""
    ap.add_argument("--model", default="tiny-opt")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=steps)
    a = ap.parse_args()
    if a.steps <= warmup:
        ap.error(f"--steps must be above the {warmup} warm-up rounds")
    if a.batch_size % a.micro_batches:
        ap.error("--batch-size must be a multiple of --micro-batches")
    return a, engine_config("gpipe", model=a.model, batch_size=a.batch_size, seq_len=a.seq_len,
                            micro_batches=a.micro_batches, steps=a.steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--back-to-back", type=int, default=1, metavar="K",
                    help="steps per contestant's turn, run back to back after its barrier (module docstring)")
    ap.add_argument("--contestants", metavar="A,B,...", help=f"only these (default all: {', '.join(CONTESTANTS)})")
    a, cfg = step_config(ap, 200, WARMUP)
    if a.back_to_back < 1:
        ap.error("--back-to-back must be at least 1")
    try:
        names = chosen(a.contestants)
    except ValueError as e:
        ap.error(str(e))
    print(f"torch {torch.__version__}  load average before: {os.getloadavg()}  cpus: {os.cpu_count()}")
    print(f"{a.model} batch {a.batch_size}x{a.seq_len}, {a.micro_batches} micro-batches, {a.steps} rounds "
          f"({WARMUP} left out) of {a.back_to_back} step(s) per contestant, gloo, 2 ranks, "
          f"contestants interleaved per round: {', '.join(names)}")
    first, later, cpu, threads, shas = measure(cfg, a.back_to_back, names)
    med = statistics.median
    kinds = {"after a barrier": first, **({"back to back": later} if later else {})}
    print("| contestant | " + " | ".join(f"median step, {k}" for k in kinds)
          + " | CPU per step (both ranks) | of it: main threads | gloo threads | other |")
    print("|---" * (len(kinds) + 5) + "|")
    for n in names:
        th = threads[n]
        print(f"| {n} | " + " | ".join(f"{1e3 * med(k[n]):.2f} ms" for k in kinds.values())
              + f" | {1e3 * med(cpu[n]):.2f} ms | {1e3 * th['main']:.2f} ms "
              f"| {1e3 * th['gloo']:.2f} ms | {1e3 * th['other']:.2f} ms |")
    print("| ratio (per round) | step | median [quartiles] | the median's 95 % interval | CPU ratio |")
    print("|---|---|---|---|---|")
    for a_, b_ in ratios(names):
        for kind, step in kinds.items():
            r = [x / y for x, y in zip(step[a_], step[b_], strict=True)]
            print(f"| {a_} / {b_} | {kind} | {quartiles(r)} | {median_interval(r)} "
                  f"| {med(cpu[a_]) / med(cpu[b_]):.3f} |")
    same = len(set(shas.values())) == 1
    print(f"params_sha256 of every contestant: {next(iter(shas.values())) if same else shas} "
          f"({'equal' if same else 'DIFFER'})")
    # Schedules differ in how long a stage waits for its peer; where the machine computes slower
    # after a wait (idle_penalty), part of a ratio between them is the machine's
    work = stage_work(a.model, a.batch_size // a.micro_batches, a.seq_len)
    idle = {gap: penalty(work, gap / 1e3) for gap in (0.5, 5.0)}
    print("compute after an idle gap / back to back, this machine: "
          + ", ".join(f"{v:.2f} after {g:g} ms" for g, v in idle.items())
          + ("" if max(idle.values()) <= MAX_PENALTY else
             f" (above {MAX_PENALTY}: schedules that wait differently pay it differently)"))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
