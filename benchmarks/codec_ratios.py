"""Codec encode cost as a multiple of ``torch.clone`` on a 4M-element float32 tensor.

Every repeat times each case once, in turn (interleaved), and divides it by the
clone timed in the same repeat (each the least of three back-to-back runs); the table gives the median ratio and its
[min, max] over repeats, for wall and process CPU time, at 1 and 2 intra-op
threads (the codec pool follows ``torch.get_num_threads``).  The machine's load
average is printed before and after: the ratios are only comparable within one
run.  Also prints the body CRC's cost alone (CPU ms per MiB), its share of a 4-bit qstoch encode, and
``sparse-qstoch``'s bytes over its information floor on a 10 % top-k gradient.

    python3 -m benchmarks.codec_ratios [--repeats 15] [--threads 1,2] [--rows 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from algorithms.codecs import make_codec
from algorithms.codecs._core import set_body_checksum
from algorithms.codecs._crc import crc32 as body_crc32
from benchmarks.spread import extremes

N_ROWS, N_COLS = 4096, 1024
CRC_BYTES = 2 << 20


def _inputs(rows: int = N_ROWS) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(rows, N_COLS, generator=g)
    return {"dense": dense, "top10%": top_fraction(dense, 0.1)}


def top_fraction(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """``x`` with all but its ``ratio`` largest magnitudes zeroed (a top-k sparsified gradient)."""
    k = int(ratio * x.numel())
    thr = x.abs().reshape(-1).kthvalue(x.numel() - k).values
    return torch.where(x.abs() > thr, x, torch.zeros_like(x))


def _cases(x: torch.Tensor, sparse: torch.Tensor) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(2)
    q4 = make_codec("qstoch:bits=4")
    qc = make_codec("qchannel:bits=4")
    tk = make_codec("topk:ratio=0.1")
    sq = make_codec("sparse-qstoch:bits=4")
    body = np.random.default_rng(0).integers(0, 256, CRC_BYTES, dtype=np.uint8)

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
        "sparse-qstoch4": lambda: sq.encode(sparse, g),
        "crc32-2MiB": lambda: body_crc32(body),  # the body CRC alone, on a 4-bit qstoch body's size
    }


def _time(fn: Callable[[], object]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


Samples = dict[tuple[int, str], list[tuple[float, float]]]


def measure(threads: list[int], repeats: int, rows: int = N_ROWS) -> Samples:
    """(threads, case) -> [(wall s, cpu s)], thread counts and cases interleaved in every repeat."""
    inp = _inputs(rows)
    cases = _cases(inp["dense"], inp["top10%"])
    out: Samples = {(th, k): [] for th in threads for k in cases}
    for th in threads:  # warm-up: pools, scratch buffers
        torch.set_num_threads(th)
        for fn in cases.values():
            fn()
    for _ in range(repeats):
        for th in threads:
            torch.set_num_threads(th)
            for k, fn in cases.items():
                # the least disturbed of three: one sample on a shared machine is mostly its load
                out[(th, k)].append(min(_time(fn) for _ in range(3)))
    return out


def report(s: Samples, threads: list[int], rows: int = N_ROWS) -> None:
    cases = [k for (th, k) in s if th == threads[0]]
    n_el = rows * N_COLS
    for th in threads:
        clone = s[(th, "clone")]
        print(f"\nthreads={th}: clone of {n_el} fp32 median {1e3 * statistics.median(w for w, _ in clone):.2f} ms; "
              "encode / clone of the same repeat, median [min, max]")
        print(f"  {'case':16s} {'ms':>8s} {'wall ratio':>22s} {'cpu ratio':>22s}")
        for k in cases:
            if k == "clone":
                continue
            w = [a[0] / b[0] for a, b in zip(s[(th, k)], clone, strict=True)]
            c = [a[1] / max(b[1], 1e-9) for a, b in zip(s[(th, k)], clone, strict=True)]
            ms = 1e3 * statistics.median(a[0] for a in s[(th, k)])
            print(f"  {k:16s} {ms:8.2f} {extremes(w, 2):>22s} {extremes(c, 2):>22s}")
        crc = [a[1] for a in s[(th, "crc32-2MiB")]]
        print(f"  body CRC-32 alone: {1e3 * statistics.median(crc) / (CRC_BYTES / 2**20):.3f} ms CPU per MiB "
              f"[{1e3 * min(crc) / 2:.3f}, {1e3 * max(crc) / 2:.3f}]")
    if len(threads) > 1:
        a, b = threads[0], threads[-1]
        print(f"\nwall time at {b} threads / at {a} thread(s), same repeat, median [min, max] (>1: slower)")
        for k in cases:
            r = [y[0] / x[0] for x, y in zip(s[(a, k)], s[(b, k)], strict=True)]
            print(f"  {k:16s} {extremes(r, 2):>22s}")


def sparse_qstoch_floor() -> list[tuple[str, int, float]]:
    """(case, payload bytes, bytes / floor) for 4-bit sparse-qstoch on top-k sparsified gradients."""
    rows = []
    g = torch.Generator().manual_seed(5)
    for ratio in (0.01, 0.1, 0.3):
        x = top_fraction(torch.randn(1 << 20, generator=g), ratio)
        c = make_codec("sparse-qstoch:bits=4")
        p = c.encode(x, torch.Generator().manual_seed(6))
        rows.append((f"1M, {ratio:.0%} nonzero", p.nbytes, 8 * p.nbytes / c.floor_bits(x)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", type=int, default=N_ROWS, help=f"rows of {N_COLS} float32 (default: 4M elements)")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}  cpus: {os.cpu_count()}  torch {torch.__version__}")
    threads = [int(t) for t in a.threads.split(",")]
    report(measure(threads, a.repeats, a.rows), threads, a.rows)
    print("\nsparse-qstoch:bits=4 bytes / information floor")
    for case, nb, r in sparse_qstoch_floor():
        print(f"  {case:22s} {nb:9d} B  {r:.3f}")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
