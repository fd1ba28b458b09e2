"""pytest-benchmark micro-benchmarks: perturbation generation and the in-place perturb/restore/update."""

import pytest
import torch

from algorithms.zo.perturb import Perturber, z_for

SHAPES = {"768x3072": (768, 3072), "50272x64": (50272, 64), "64x64": (64, 64)}


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_bench_z_for(benchmark, shape):
    z = benchmark(z_for, 1234, 7, SHAPES[shape])
    assert z.shape == SHAPES[shape]


@pytest.mark.parametrize("mode", ["exact", "inplace"])
def test_bench_perturb_restore_update(benchmark, mode):
    params = [(i, torch.zeros(256, 1024)) for i in range(4)]
    pert = Perturber(params, mode)

    def one_direction():
        pert.shift(5, 1e-3)
        pert.restore()
        pert.update(5, 1e-4)

    benchmark(one_direction)
    assert params[0][1].abs().max() > 0
