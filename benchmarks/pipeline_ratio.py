"""``pipeline-sgd`` against a hand-written 2-process GPipe on gloo (the transport-only reference).

The reference uses the project's own stages (``build_stage``), batches
(``batch``), micro-batches, loss and SGD, and moves the boundary tensors with
bare ``dist.isend`` / ``dist.recv`` of the raw float tensors: no framing, no
codec, no meter.  Its sends are posted without waiting and waited on at the end
of the step.  Both are timed per step inside the step loop; a repeat runs
``pipeline-sgd`` (through the launcher, two gloo processes) and the reference
(two spawned gloo processes), alternately; the table gives the ratio of their
median step times per repeat (median [min, max]) and the per-process CPU time
per step.  The reference's final ``params_sha256`` is printed beside
``pipeline-sgd``'s: equal, so both did the same arithmetic.  The load average
is printed: the machine may be shared, and only ratios of one run compare.

    python3 -m benchmarks.pipeline_ratio [--model tiny-opt] [--repeats 5] [--steps 12]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks.gloo_pair import run_pair
from benchmarks.spread import extremes
from harness.launcher import run
from harness.registry import make_config

WARMUP = 2  # steps left out of a reference's median (the peer's first infers the boundary shapes)


def hand_gpipe_step(cfg, rank: int, stage, ids: torch.Tensor, labels: torch.Tensor) -> None:
    """One GPipe step of stage ``rank`` of 2 with bare ``dist.isend`` / ``dist.recv`` of the raw
    boundary tensors; its sends are waited on at the end of the step (the caller steps the optimiser)."""
    from harness.models import PRESETS, lm_loss

    M = cfg.micro_batches
    idc, labc = ids.chunk(M), labels.chunk(M)
    posted, saved = [], []
    for mb in range(M):
        if rank == 0:
            (h,) = stage(idc[mb], input_ids=idc[mb])
            out = h.detach().contiguous()
            posted.append((dist.isend(out, 1), out))
            saved.append(h)
        else:
            h = torch.empty(idc[mb].shape + (PRESETS[cfg.model].d_model,), dtype=cfg.torch_dtype)
            dist.recv(h, 0)
            h.requires_grad_()
            loss = lm_loss(stage(h, input_ids=idc[mb])[0], labc[mb]) / M
            loss.item()  # the engine reads each micro-batch's loss too
            saved.append((h, loss))
    for mb in range(M):
        if rank == 1:
            h, loss = saved[mb]
            loss.backward()
            g = h.grad.contiguous()
            posted.append((dist.isend(g, 0), g))
        else:
            g = torch.empty_like(saved[mb])
            dist.recv(g, 1)
            saved[mb].backward(g)
    for w, _ in posted:
        w.wait()


def _reference_rank(rank: int, port: int, cfg, make_step, q) -> None:
    """Stage ``rank`` of a 2-process reference: the project's stage, batches and SGD, one step of
    ``make_step(cfg, rank, stage)`` (a callable of ids and labels) per batch, each step timed."""
    from algorithms.pipeline.local import batch
    from harness.models import build_stage

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(cfg.threads_per_rank or 1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    p = cfg.params
    stage = build_stage(cfg.model, seed=cfg.seed, num_stages=2, stage_index=rank, cut=p.cut, dtype=cfg.torch_dtype)
    opt = torch.optim.SGD(stage.parameters(), lr=p.lr, momentum=p.momentum, foreach=False)
    step_fn = make_step(cfg, rank, stage)
    times, cpu = [], []
    dist.barrier()
    for step in range(cfg.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        ids, labels = batch(cfg, step, "cpu")
        opt.zero_grad(set_to_none=True)
        step_fn(ids, labels)
        opt.step()
        times.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    # numpy arrays pickle by value (a tensor would be shared through a file descriptor of this process)
    q.put((rank, times, cpu, [(i, t.detach().numpy().copy()) for i, _, t in stage.global_named_parameters()]))
    dist.barrier()
    dist.destroy_process_group()


def timed_reference(cfg, make_step) -> tuple[float, float, str]:
    """Run a reference (``_reference_rank``; ``make_step`` picklable): (median step s of the slower
    rank, its CPU s per step, params_sha256 of both stages)."""
    from harness.results.fingerprint import params_sha256

    out = run_pair(_reference_rank, cfg, make_step)
    meds = [statistics.median(t[WARMUP:]) for _, t, _, _ in out]
    slow = max(range(2), key=lambda r: meds[r])
    params = sorted(((i, torch.from_numpy(a)) for *_, ps in out for i, a in ps), key=lambda p: p[0])
    return meds[slow], statistics.median(out[slow][2][WARMUP:]), params_sha256(params)


def _hand_gpipe(cfg, rank: int, stage):
    return functools.partial(hand_gpipe_step, cfg, rank, stage)


def gpipe(cfg) -> tuple[float, float, str]:
    """The hand-written GPipe: (median step s of the slower rank, its CPU s per step, params_sha256)."""
    return timed_reference(cfg, _hand_gpipe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-opt")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    cfg = make_config("pipeline-sgd", model=a.model, world_size=2, backend="gloo", steps=a.steps,
                      batch_size=a.batch_size, seq_len=a.seq_len, micro_batches=a.micro_batches)
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}")
    print(f"{a.model} batch {a.batch_size}x{a.seq_len}, {a.micro_batches} micro-batches, {a.steps} steps, gloo, 2 ranks")
    ratios, rows = [], []
    for _ in range(a.repeats):
        rec = run(cfg)
        eng = rec.metrics["step_time_s"].value
        ref, ref_cpu, sha = gpipe(cfg)
        ratios.append(eng / ref)
        rows.append((eng, ref, ref_cpu))
        print(f"  pipeline-sgd {1e3 * eng:8.2f} ms   hand-written GPipe {1e3 * ref:8.2f} ms "
              f"(cpu {1e3 * ref_cpu:.2f} ms)   ratio {eng / ref:.3f}")
    print(f"pipeline-sgd / hand-written GPipe: median {extremes(ratios)} over {a.repeats} interleaved repeats")
    print(f"params_sha256 pipeline-sgd {rec.metrics['params_sha256'].value}")
    print(f"params_sha256 hand-written  {sha}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
