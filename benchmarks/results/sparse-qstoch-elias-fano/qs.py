"""qstoch and sparse-qstoch (4 bits) on 4M float32: median of 15 encodes and of 15 decodes.

``python3 qs.py THREADS`` from a tree's root with ``PYTHONPATH=.``; sparse-qstoch encodes the
entries with ``|x| > 1.645`` (about 10 % nonzero)."""

import statistics
import sys
import time

import torch

from algorithms.codecs import decode
from algorithms.codecs.registry import make_codec

torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(1)
x = torch.randn(1 << 22, generator=g)
out = []
for spec in ("qstoch:bits=4", "sparse-qstoch:bits=4"):
    codec = make_codec(spec)
    y = x if spec.startswith("qstoch") else torch.where(x.abs() > 1.645, x, 0.0)
    payload = codec.encode(y, g)
    enc, dec = [], []
    for _ in range(15):
        t0 = time.perf_counter()
        codec.encode(y, g)
        enc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode(payload)
        dec.append(time.perf_counter() - t0)
    out.append(f"{spec} enc {1e3 * statistics.median(enc):.2f} dec {1e3 * statistics.median(dec):.2f}")
print(" | ".join(out))
