"""Codec encode cost as a multiple of ``torch.clone`` on a 4M-element float32 tensor.

Every repeat times each case once, in turn (interleaved), and divides it by the
clone timed in the same repeat; the table gives the median ratio and its
[min, max] over repeats, for wall and process CPU time, at 1 and 2 intra-op
threads (the codec pool follows ``torch.get_num_threads``).  The machine's load
average is printed before and after: the ratios are only comparable within one
run.  Also prints the body CRC's share of a 4-bit qstoch encode and
``sparse-qstoch``'s bytes over its information floor on a 10 % top-k gradient.

    python3 -m benchmarks.codec_ratios [--repeats 15] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from algorithms.codecs import make_codec
from algorithms.codecs._core import set_body_checksum

N_ROWS, N_COLS = 4096, 1024


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(N_ROWS, N_COLS, generator=g)
    return {"dense": dense}


def _cases(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(2)
    q4 = make_codec("qstoch:bits=4")
    qc = make_codec("qchannel:bits=4")
    tk = make_codec("topk:ratio=0.1")

    def q4_nocrc() -> object:
        old = set_body_checksum(False)
        try:
            return q4.encode(x, g)
        finally:
            set_body_checksum(old)

    return {
        "clone": x.clone,
        "qstoch4": lambda: q4.encode(x, g),
        "qstoch4-nocrc": q4_nocrc,
        "qchannel4": lambda: qc.encode(x),
        "topk10%": lambda: tk.encode(x),
    }


def _time(fn: Callable[[], object]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def ratios(threads: int, repeats: int) -> dict[str, tuple[list[float], list[float], float]]:
    torch.set_num_threads(threads)
    x = _inputs()["dense"]
    cases = _cases(x)
    for fn in cases.values():  # warm-up: pools, scratch buffers
        fn()
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        t = {k: _time(fn) for k, fn in cases.items()}
        for k in cases:
            wall[k].append(t[k][0] / t["clone"][0])
            cpu[k].append(t[k][1] / max(t["clone"][1], 1e-9))
    clone_ms = statistics.median([0.0])  # placeholder replaced below
    clone_ms = 1e3 * statistics.median(_time(x.clone)[0] for _ in range(5))
    return {k: (wall[k], cpu[k], clone_ms) for k in cases if k != "clone"}


def _fmt(v: list[float]) -> str:
    return f"{statistics.median(v):6.2f} [{min(v):.2f}, {max(v):.2f}]"


def sparse_qstoch_floor() -> list[tuple[str, int, float]]:
    """(case, payload bytes, bytes / floor) for 4-bit sparse-qstoch on top-k sparsified gradients."""
    rows = []
    g = torch.Generator().manual_seed(5)
    for ratio in (0.01, 0.1, 0.3):
        x = torch.randn(1 << 20, generator=g)
        k = int(ratio * x.numel())
        thr = x.abs().kthvalue(x.numel() - k).values
        x = torch.where(x.abs() > thr, x, torch.zeros_like(x))
        c = make_codec("sparse-qstoch:bits=4")
        p = c.encode(x, torch.Generator().manual_seed(6))
        rows.append((f"1M, {ratio:.0%} nonzero", p.nbytes, 8 * p.nbytes / c.floor_bits(x)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}  torch {torch.__version__}")
    for th in (int(s) for s in a.threads.split(",")):
        res = ratios(th, a.repeats)
        clone_ms = next(iter(res.values()))[2]
        print(f"\nthreads={th}  clone of 4M fp32 = {clone_ms:.2f} ms; encode / clone, median [min, max] "
              f"over {a.repeats} interleaved repeats")
        print(f"  {'case':16s} {'wall':>22s} {'cpu':>22s}")
        for k, (w, c, _) in res.items():
            print(f"  {k:16s} {_fmt(w):>22s} {_fmt(c):>22s}")
    print("\nsparse-qstoch:bits=4 bytes / information floor")
    for case, nb, r in sparse_qstoch_floor():
        print(f"  {case:22s} {nb:9d} B  {r:.3f}")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
