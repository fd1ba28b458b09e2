"""The fp32 codec's cost for one 16 KiB payload: mean of 2000 encodes, then of 2000 decodes, 3 passes.

Run from a tree's root with ``PYTHONPATH=.`` so that tree's codecs are the ones measured."""

import time

import torch

from algorithms.codecs import decode, make_codec

codec = make_codec("fp32")
x = torch.randn(2 * 64 * 32)
payload = codec.encode(x)
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(2000):
        codec.encode(x)
    t1 = time.perf_counter()
    for _ in range(2000):
        decode(payload)
    t2 = time.perf_counter()
    print(f"encode {1e6 * (t1 - t0) / 2000:.1f} us  decode {1e6 * (t2 - t1) / 2000:.1f} us")
