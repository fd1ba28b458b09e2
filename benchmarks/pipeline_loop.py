"""One contestant of ``pipeline_interleaved``, step after step in a pair of gloo processes, for a
profiler or a system-call counter to attach to (a timing of its own is not the point: the
interleaved benchmark times).  Each rank prints its pid and its gloo threads' ids once warm.

    python3 -m benchmarks.pipeline_loop "engine[1f1b]" [--steps 1500] [--post-ahead | --post-none] [--call-cpu]
    perf stat -e syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvfrom -t TID,TID -- sleep 3

``--post-ahead`` makes the engine's 1F1B post all its receives ahead as GPipe does, and
``--post-none`` none (``pipeline_interleaved.AHEAD_CHOICES``; ``engine.POSTS_AHEAD`` posts the
gradients' only), the choices its docstring measured against.

``--call-cpu`` times, in each rank's thread CPU once warm, every call of the channel's ``send``
and ``recv`` (a whole message; ``EncodedChannel``'s for the contestant that copies payloads),
the dense codec's ``writer``, ``encode`` and ``decode`` and its check and copy of a payload
whose header it has seen (``_decode_seen``, what its reader does with a message), the Comm's
``send_written``, ``send``, ``recv`` and ``recv_read`` and, for a contestant with a Comm of its own (the engine's), the
transport's calls that post a message (``gloo send``, ``gloo recv``: the process group's own,
which ``torch.distributed.pipelining`` makes as well); a call's time includes that of the timed
calls inside it, and their timing.  Each rank prints the whole step's CPU (its main thread) and
one line per call: its mean CPU in the steps, and for the last ``encode`` and ``decode``, timed
again 1000 times back to back on the same input after the loop, back to back too: a call
between a stage's forward and backward passes runs with the caches the model's compute left,
which a codec benchmark on its own never sees.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.gloo_pair import run_pair
from benchmarks.pipeline_interleaved import AHEAD_CHOICES, CONTESTANTS, EncodedChannel, _contestants
from benchmarks.pipelining_ratio import engine_config

WARM = 10  # steps before the ids are printed


AGAIN = 1000  # back-to-back repeats of the last encode and decode (--call-cpu)


class _CallCpu:
    """Thread CPU of every call of ``cls.meth`` for each (cls, meth), once ``on``; the last call's
    arguments are kept to time it again back to back."""

    def __init__(self, methods):
        self.on, self.cpu, self.calls, self.last = False, {}, {}, {}
        for cls, meth in methods:
            setattr(cls, meth, self._timed(getattr(cls, meth), f"{cls.__name__}.{meth}"))

    def _timed(self, fn, meth):
        def call(*args, **kw):
            t = time.thread_time()
            out = fn(*args, **kw)
            if self.on:
                self.cpu[meth] = self.cpu.get(meth, 0.0) + time.thread_time() - t
                self.calls[meth] = self.calls.get(meth, 0) + 1
                self.last[meth] = (fn, args, kw)
            return out
        return call

    def report(self, rank: int) -> str:
        lines = []
        for meth in sorted(self.cpu):
            in_steps = 1e6 * self.cpu[meth] / self.calls[meth]
            again = ""
            if meth in ("DenseCodec.encode", "DenseCodec.decode"):
                fn, args, kw = self.last[meth]
                t = time.thread_time()
                for _ in range(AGAIN):
                    fn(*args, **kw)
                again = f", back to back {1e6 * (time.thread_time() - t) / AGAIN:.1f} us"
            lines.append(f"rank {rank}: {meth} {in_steps:.1f} us CPU per call in the steps "
                         f"({self.calls[meth]} calls){again}")
        return "\n".join(lines) + "\n"


class _TimedGroup:
    """A Comm's process group whose ``send`` and ``recv`` (the posting of one message: gloo's
    rendezvous notices, and the bytes where the peer's receive is posted) are timed by a
    :class:`_CallCpu`; everything else passes through."""

    def __init__(self, group, timed: _CallCpu):
        self._group = group
        self.send = timed._timed(group.send, "gloo send")
        self.recv = timed._timed(group.recv, "gloo recv")

    def __getattr__(self, name):
        return getattr(self._group, name)


def _rank(rank: int, port: int, cfg, name: str, steps: int, posts: tuple[str, ...] | None, call_cpu: bool,
          q) -> None:
    from algorithms.codecs.channel import Channel
    from algorithms.codecs.dense import DenseCodec
    from algorithms.pipeline import engine
    from algorithms.pipeline.local import batch
    from harness.comm.base import Comm
    from harness.comm.torchdist import TorchDistComm

    if posts is not None:
        engine.POSTS_AHEAD["1f1b"] = posts
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(cfg.threads_per_rank or 1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = TorchDistComm("gloo", timeout_s=120.0)
    _, opt, step, own = _contestants(cfg, rank, comm, (name,))[name]
    timed = _CallCpu([(Channel, "send"), (Channel, "recv"), (EncodedChannel, "send"), (EncodedChannel, "recv"),
                      (DenseCodec, "writer"), (DenseCodec, "encode"), (DenseCodec, "decode"),
                      (DenseCodec, "_decode_seen"), (Comm, "send_written"), (Comm, "send"), (Comm, "recv"), (Comm, "recv_read")]) \
        if call_cpu else None
    if timed is not None and own is not comm:  # the contestant's own Comm: its transport calls too
        own._pg = _TimedGroup(own._pg, timed)
    step_cpu = 0.0  # the main thread's, over the steps once warm
    for s in range(steps):
        if s == WARM:
            if timed is not None:
                timed.on = True
            gloo = [t for t in sorted(os.listdir("/proc/self/task"))
                    if Path(f"/proc/self/task/{t}/comm").read_text().startswith("gloo")]
            # one write of the whole line: the two ranks share the pipe, and print's separate writes
            # of the text and its newline interleaved with the other rank's
            posted = ",".join(engine.POSTS_AHEAD["1f1b"]) or "none"
            os.write(2, f"rank {rank}: pid {os.getpid()}, gloo threads {','.join(gloo)}, "
                        f"1F1B posts ahead: {posted}\n".encode())
        ids, labels = batch(cfg, s, "cpu")
        t = time.thread_time()
        opt.zero_grad(set_to_none=True)
        step(ids, labels)
        opt.step()
        step_cpu += time.thread_time() - t if s >= WARM else 0.0
    if timed is not None:
        timed.on = False
        whole = f"rank {rank}: the step {1e3 * step_cpu / (steps - WARM):.2f} ms CPU (main thread)\n"
        os.write(2, (whole + timed.report(rank)).encode())  # one write: the ranks share the pipe
    q.put((rank, None))
    comm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("contestant", choices=CONTESTANTS)
    ap.add_argument("--steps", type=int, default=1500)
    posting = ap.add_mutually_exclusive_group()
    posting.add_argument("--post-ahead", dest="posts", action="store_const",
                         const=AHEAD_CHOICES["engine[1f1b] ahead"], help="the engine's 1F1B posts all its receives ahead")
    posting.add_argument("--post-none", dest="posts", action="store_const",
                         const=AHEAD_CHOICES["engine[1f1b] none ahead"], help="the engine's 1F1B posts no receive ahead")
    ap.add_argument("--call-cpu", action="store_true",
                    help="time the codec's and the Comm's calls in the steps and back to back")
    ap.add_argument("--model", default="tiny-opt")
    a = ap.parse_args()
    if a.steps <= WARM:
        ap.error(f"--steps must be above {WARM}")
    cfg = engine_config("gpipe", model=a.model, batch_size=8, seq_len=64, micro_batches=4, steps=a.steps)
    run_pair(_rank, cfg, a.contestant, a.steps, a.posts, a.call_cpu, timeout_s=24 * 3600)


if __name__ == "__main__":
    main()
