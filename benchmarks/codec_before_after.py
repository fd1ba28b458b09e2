"""Codec encode time of this tree against another commit's codecs, interleaved in one process.

Extract the other commit's codec package first (it imports only itself)::

    mkdir -p old-codecs && git archive BASE algorithms/codecs | tar -x -C old-codecs
    python3 -m benchmarks.codec_before_after old-codecs/algorithms/codecs [--threads 1] [--repeats 9]

Every repeat times ``torch.clone`` and each encoder once (the least of three
back-to-back runs, by CPU time), old and new in turn, on the 4M-element float32
input of ``benchmarks.codec_ratios`` (``sparse-qstoch`` on its top-10 % sparsified copy); prints each encoder's wall and CPU time over
the clone's of the same repeat and the new / old CPU ratio, median [min, max].
The load average is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

from algorithms import codecs as new
from benchmarks.codec_ratios import top_fraction

SPECS = ("qstoch:bits=4", "qchannel:bits=4", "topk:ratio=0.1", "sparse-qstoch:bits=4")


def _load(path: str):
    spec = importlib.util.spec_from_file_location("oldcodecs", os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["oldcodecs"] = mod
    spec.loader.exec_module(mod)
    return mod


def _t(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _fmt(v: list[float]) -> str:
    return f"{statistics.median(v):6.2f} [{min(v):.2f}, {max(v):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="a directory holding another commit's algorithms/codecs package")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    old = _load(a.old)
    torch.set_num_threads(a.threads)
    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(2)
    cases = {"clone": x.clone}
    sparse = top_fraction(x, 0.1)  # sparse-qstoch's input in training: a top-k gradient
    for s in SPECS:
        for name, mod in (("old", old), ("new", new)):
            codec = mod.make_codec(s)
            inp = sparse if s.startswith("sparse") else x
            cases[f"{s} {name}"] = lambda c=codec, inp=inp: c.encode(inp, g)
    for fn in cases.values():
        fn()
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    print(f"load average before: {os.getloadavg()}  threads {a.threads}")
    for _ in range(a.repeats):
        for k, fn in cases.items():
            res[k].append(min((_t(fn) for _ in range(3)), key=lambda t: t[1]))
    clone = res["clone"]
    print(f"clone median {1e3 * statistics.median(w for w, _ in clone):.2f} ms")
    for k in cases:
        if k != "clone":
            w = [x[0] / c[0] for x, c in zip(res[k], clone, strict=True)]
            c = [x[1] / c[1] for x, c in zip(res[k], clone, strict=True)]
            print(f"  {k:22s} {1e3 * statistics.median(x[0] for x in res[k]):8.2f} ms  "
                  f"wall / clone {_fmt(w)}  cpu / clone {_fmt(c)}")
    for s in SPECS:
        r = [n[1] / o[1] for n, o in zip(res[f"{s} new"], res[f"{s} old"], strict=True)]
        print(f"  {s:22s} new / old cpu {_fmt(r)}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
