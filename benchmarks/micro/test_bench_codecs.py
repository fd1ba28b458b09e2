"""Micro-benchmarks of the codec hot paths on a 4M-element float32 tensor.

Skipped by default (``--benchmark-skip`` in pyproject addopts).  Run with::

    pytest benchmarks/micro/test_bench_codecs.py --benchmark-only \
        --benchmark-columns=min,median,mean,rounds

The reference is ``x.clone()`` of the same input; the goal for quantise + pack
(``qstoch:bits=4`` and ``qchannel:bits=4`` encode, header and payload
included) is within 5x of the copy.  Times are tracked, never asserted.
"""

from __future__ import annotations

import pytest
import torch

from algorithms.codecs import make_codec

N_ROWS, N_COLS = 4096, 1024  # 4,194,304 elements, 16 MiB of float32


@pytest.fixture(scope="module")
def dense_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N_ROWS, N_COLS, generator=g)


@pytest.fixture(scope="module")
def relu_input() -> torch.Tensor:
    """ReLU of mostly negative pre-activations: about 7% nonzero."""
    g = torch.Generator().manual_seed(1)
    return torch.relu(torch.randn(N_ROWS, N_COLS, generator=g) - 1.5)


def test_copy_reference(benchmark, dense_input):
    benchmark.group = "codec-4M"
    benchmark(dense_input.clone)


def test_qstoch4_quantise_pack(benchmark, dense_input):
    benchmark.group = "codec-4M"
    codec = make_codec("qstoch:bits=4")
    g = torch.Generator().manual_seed(2)
    p = benchmark(codec.encode, dense_input, g)
    assert p.nbytes == codec.encoded_nbytes(dense_input)


def test_qchannel4_quantise_pack(benchmark, dense_input):
    benchmark.group = "codec-4M"
    codec = make_codec("qchannel:bits=4")
    p = benchmark(codec.encode, dense_input)
    assert p.nbytes == codec.encoded_nbytes(dense_input)


def test_qchannel4_relu_quantise_sparse_pack(benchmark, relu_input):
    benchmark.group = "codec-4M-relu"
    codec = make_codec("qchannel:bits=4")
    p = benchmark(codec.encode, relu_input)
    assert p.nbytes < relu_input.numel() // 2


def test_sparse_encode_relu(benchmark, relu_input):
    benchmark.group = "codec-4M-relu"
    codec = make_codec("sparse")
    p = benchmark(codec.encode, relu_input)
    assert p.nbytes == codec.encoded_nbytes(relu_input)


def test_qstoch4_decode(benchmark, dense_input):
    benchmark.group = "codec-4M-decode"
    codec = make_codec("qstoch:bits=4")
    p = codec.encode(dense_input, torch.Generator().manual_seed(3))
    benchmark(codec.decode, p)


def test_qchannel4_decode(benchmark, dense_input):
    benchmark.group = "codec-4M-decode"
    codec = make_codec("qchannel:bits=4")
    p = codec.encode(dense_input)
    benchmark(codec.decode, p)
