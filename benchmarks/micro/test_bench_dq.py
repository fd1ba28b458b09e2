"""Micro-benchmarks of the double-quantisation hot paths, as ratios to a plain copy.

Skipped by default (``--benchmark-skip`` in pyproject addopts).  Run with::

    pytest benchmarks/micro/test_bench_dq.py --benchmark-only --benchmark-columns=min,median,rounds

Inputs are gradient-difference-sized vectors (d = 7510, the digits MLP, and
d = 79510, the paper's MNIST MLP).  Each benchmark stores its median over the
copy's median as ``extra_info["ratio_to_copy"]`` (the copy runs first in each
group).  Times are tracked, never asserted.
"""

from __future__ import annotations

import pytest
import torch

from algorithms.dataparallel import dq_wire as wire

SIZES = [7510, 79510]
_copy_median: dict[int, float] = {}


def _vec(d: int) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(d))


def _ratio(benchmark, d: int) -> None:
    med = benchmark.stats.stats.median
    if d in _copy_median:
        benchmark.extra_info["ratio_to_copy"] = med / _copy_median[d]


@pytest.mark.parametrize("d", SIZES)
def test_copy(benchmark, d):
    x = _vec(d)
    benchmark.group = f"dq-{d}"
    benchmark(x.clone)
    _copy_median[d] = benchmark.stats.stats.median


@pytest.mark.parametrize("d", SIZES)
@pytest.mark.parametrize("b", [4, 8])
def test_quantise_pack(benchmark, d, b):
    x, g = _vec(d), torch.Generator().manual_seed(0)
    benchmark.group = f"dq-{d}"
    msg = benchmark(wire.quantized, x, b, g)
    assert msg.paper_bits == 32 + b * d
    _ratio(benchmark, d)


@pytest.mark.parametrize("d", SIZES)
def test_sparsify_encode(benchmark, d):
    x, g = _vec(d), torch.Generator().manual_seed(0)
    benchmark.group = f"dq-{d}"
    msg = benchmark(wire.sparse_quantized, x, 4, 1.0, g)
    assert msg.nnz > 0
    _ratio(benchmark, d)
