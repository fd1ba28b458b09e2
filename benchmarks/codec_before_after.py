"""Codec encode time of this tree against another commit's codecs, interleaved in one process.

Extract the other commit's codec package first (it imports only itself)::

    mkdir -p old-codecs && git archive BASE algorithms/codecs | tar -x -C old-codecs
    python3 -m benchmarks.codec_before_after old-codecs/algorithms/codecs [--threads 1] [--repeats 9]
    python3 -m benchmarks.codec_before_after old-codecs/algorithms/codecs --message

``--message``: a pipeline's per-message cost instead, where the header and the Python around
the body dominate: encode and decode, each timed as a loop of ``MESSAGE_LOOP`` calls, of one
micro-batch activation (2 x 64 x 64 float32, 32 KiB; tiny-opt's own is 2 x 64 x 32) in the
lossless and compressing codecs a pipeline link uses (``MESSAGE_SPECS``), printed in
microseconds per call with the new / old CPU ratio.  Old and new decode the same payload (each codec's own encoding).

Every repeat times ``torch.clone`` and each encoder once (the least of three
back-to-back runs, by CPU time), old and new in turn, on the 4M-element float32
input of ``benchmarks.codec_ratios`` (``sparse-qstoch`` on its top-10 % sparsified copy); prints each encoder's wall and CPU time over
the clone's of the same repeat and the new / old CPU ratio, median [min, max].
The load average is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from algorithms import codecs as new
from benchmarks.codec_ratios import top_fraction
from benchmarks.other_commit import load_package
from benchmarks.spread import extremes

SPECS = ("qstoch:bits=4", "qchannel:bits=4", "topk:ratio=0.1", "sparse-qstoch:bits=4")
MESSAGE_SPECS = ("fp32", "fp16", "qstoch:bits=4", "topk:ratio=0.1")
MESSAGE_LOOP = 2000


def _t(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _messages(old, repeats: int) -> None:
    """Per-message encode and decode of a 32 KiB activation, old and new interleaved."""
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(0))
    cases = {}
    for s in MESSAGE_SPECS:
        for name, mod in (("old", old), ("new", new)):
            codec = mod.make_codec(s)
            p = codec.encode(x, torch.Generator().manual_seed(2))
            cases[f"{s} encode {name}"] = lambda c=codec: [c.encode(x) for _ in range(MESSAGE_LOOP)]
            cases[f"{s} decode {name}"] = lambda c=codec, p=p: [c.decode(p, x.numel()) for _ in range(MESSAGE_LOOP)]
    res = _interleaved(cases, repeats)
    us = 1e6 / MESSAGE_LOOP
    for s in MESSAGE_SPECS:
        for op in ("encode", "decode"):
            o, n = res[f"{s} {op} old"], res[f"{s} {op} new"]
            r = [b[1] / a[1] for a, b in zip(o, n, strict=True)]
            print(f"  {s:16s} {op}  old {us * statistics.median(c for _, c in o):7.2f} us  "
                  f"new {us * statistics.median(c for _, c in n):7.2f} us  new / old cpu {extremes(r, 2)}")


def _interleaved(cases: dict, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Each case once per repeat, in turn: the least of three runs by CPU time."""
    for fn in cases.values():
        fn()
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(repeats):
        for k, fn in cases.items():
            res[k].append(min((_t(fn) for _ in range(3)), key=lambda t: t[1]))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="a directory holding another commit's algorithms/codecs package")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--message", action="store_true",
                    help="per-message encode and decode of a 32 KiB activation (module docstring)")
    a = ap.parse_args()
    old = load_package(a.old, "oldcodecs")
    torch.set_num_threads(a.threads)
    print(f"load average before: {os.getloadavg()}  threads {a.threads}")
    if a.message:
        _messages(old, a.repeats)
        print(f"load average after: {os.getloadavg()}")
        return
    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(2)
    cases = {"clone": x.clone}
    sparse = top_fraction(x, 0.1)  # sparse-qstoch's input in training: a top-k gradient
    for s in SPECS:
        for name, mod in (("old", old), ("new", new)):
            codec = mod.make_codec(s)
            inp = sparse if s.startswith("sparse") else x
            cases[f"{s} {name}"] = lambda c=codec, inp=inp: c.encode(inp, g)
    res = _interleaved(cases, a.repeats)
    clone = res["clone"]
    print(f"clone median {1e3 * statistics.median(w for w, _ in clone):.2f} ms")
    for k in cases:
        if k != "clone":
            w = [x[0] / c[0] for x, c in zip(res[k], clone, strict=True)]
            c = [x[1] / c[1] for x, c in zip(res[k], clone, strict=True)]
            print(f"  {k:22s} {1e3 * statistics.median(x[0] for x in res[k]):8.2f} ms  "
                  f"wall / clone {extremes(w, 2)}  cpu / clone {extremes(c, 2)}")
    for s in SPECS:
        r = [n[1] / o[1] for n, o in zip(res[f"{s} new"], res[f"{s} old"], strict=True)]
        print(f"  {s:22s} new / old cpu {extremes(r, 2)}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
