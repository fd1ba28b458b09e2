"""The seeded perturbation engine: z is a pure function of (seed, global index)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.zo.perturb import NO_CLOCK, Perturber, as_scalar, step_seeds, z_for, zo_update
from harness.models import build_model, split_model

SEEDS = st.integers(0, 2**63 - 1)
SHAPES = st.lists(st.integers(1, 7), min_size=1, max_size=3)


def _digest(seed: int, indices, shape) -> str:
    h = hashlib.sha256()
    for i in indices:
        h.update(z_for(seed, i, shape).numpy().tobytes())
    return h.hexdigest()


@given(seed=SEEDS, idx=st.integers(0, 500), shape=SHAPES)
def test_z_is_bit_identical_across_calls_and_interleaved_draws(seed, idx, shape):
    a = z_for(seed, idx, shape)
    torch.randn(5)  # global RNG state must not matter
    z_for(seed + 1, idx, shape)  # nor other draws
    assert torch.equal(a, z_for(seed, idx, shape))
    assert torch.equal(z_for(seed, idx, shape, torch.float64), a.double())  # float64 = exact upcast


def test_z_is_bit_identical_across_processes():
    # A fresh interpreter (own torch, own global RNG state) regenerates the same bytes.
    seed, idx, shape = 12345, [0, 3, 77], (5, 33)
    code = ("import hashlib, torch; torch.manual_seed(99); from algorithms.zo import perturb as m; "
            "h = hashlib.sha256(); "
            f"[h.update(m.z_for({seed}, i, {shape}).numpy().tobytes()) for i in {idx}]; print(h.hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == _digest(seed, idx, shape)


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_z_does_not_depend_on_the_split(model):
    full = build_model(model, seed=0)
    ref = {i: z_for(7, i, p.shape) for i, p in enumerate(full.parameters())}
    for M, cut in [(2, "ffn_act"), (3, "block"), (4, "ffn_act")]:
        seen = {}
        for stage in reversed(split_model(full, M, cut)):  # any order of visiting the stages
            for i, _, p in stage.global_named_parameters():
                seen[i] = z_for(7, i, p.shape)
        assert seen.keys() == ref.keys()
        assert all(torch.equal(seen[i], ref[i]) for i in ref)


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [(i, (torch.randn(s, generator=g) * 0.02).to(dtype)) for i, s in enumerate([(40, 30), (30,), (7, 5, 3)])]


@pytest.mark.parametrize("central", [False, True])
def test_exact_mode_restores_bit_exactly(central):
    params = _params()
    before = [t.clone() for _, t in params]
    pert = Perturber(params, "exact")
    pert.shift(3, 1e-3)
    assert not torch.equal(params[0][1], before[0])
    if central:
        pert.shift(3, -2e-3)
    pert.restore()
    assert all(torch.equal(t, b) for (_, t), b in zip(params, before, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inplace_mode_drift_is_measured_and_small(dtype):
    params = _params(dtype)
    before = [t.clone() for _, t in params]
    pert = Perturber(params, "inplace", track_drift=True)
    mu = 1e-3
    pert.shift(9, mu)
    pert.shift(9, -2 * mu)
    pert.restore()  # the classic +mu, -2mu, +mu sequence
    drift = max(float((t - b).abs().max()) for (_, t), b in zip(params, before, strict=True))
    assert pert.drift_max == drift  # the reported drift is the real one
    eps = torch.finfo(dtype).eps
    bound = max(float((6 * eps * (b.abs() + 2 * mu * z_for(9, i, b.shape, dtype).abs())).max())
                for (i, _), b in zip(params, before, strict=True))
    assert drift <= bound  # seed-sparq P3
    assert 0 <= pert.drift_changed <= pert.restored_elements


def test_update_is_minus_lr_over_p_sum_g_z():
    params = _params(torch.float64)
    x0 = [t.clone() for _, t in params]
    seeds, g, lr = step_seeds(0, 4, 3), [0.5, -2.0, 1.25], 0.1
    zo_update(Perturber(params, "exact"), seeds, g, lr)
    for (i, t), x in zip(params, x0, strict=True):
        G = sum(gi * z_for(s, i, x.shape, torch.float64) for s, gi in zip(seeds, g, strict=True)) / 3
        torch.testing.assert_close(t, x - lr * G, rtol=0, atol=1e-12)  # seed-sparq P12


@given(num=st.integers(-(2**40), 2**40), den=st.floats(1e-6, 1e3))
def test_projected_gradient_is_rounded_to_the_float32_it_travels_as(num, den):
    # g travels as one float32 (as_scalar's docstring, checks/MUTATION.md): a float64
    # loss difference must give every rank the float32 value, not the float64 one.
    diff = torch.tensor(num / 3, dtype=torch.float64)
    g = as_scalar(diff, den)
    assert g == float(torch.tensor(num / 3 / den, dtype=torch.float64).to(torch.float32))
    assert isinstance(g, float)


def test_projected_gradient_of_a_float64_difference_is_not_kept_in_float64():
    g = as_scalar(torch.tensor(1.0, dtype=torch.float64), 3.0)
    assert g != 1.0 / 3.0 and g == float(torch.tensor(1.0 / 3.0).to(torch.float32))


def test_update_with_a_scalar_missing_or_extra_fails():
    # zip(strict=True): a lost or extra g must not silently drop a direction of Eq. 3
    for g in ([0.5, -2.0], [0.5, -2.0, 1.25, 3.0]):
        params = _params(torch.float64)
        with pytest.raises(ValueError, match="zip"):
            zo_update(Perturber(params, "exact"), step_seeds(0, 4, 3), g, 0.1)


@pytest.mark.parametrize("keep_z", [False, True])
def test_keep_z_draws_once_per_perturbation_and_without_it_every_pass(keep_z):
    # module docstring: keep_z reuses one draw for +mu, -2mu and the restore;
    # without it each pass draws again; an update always draws its own z.
    params = _params()
    pert = Perturber(params, "inplace", keep_z=keep_z)
    for seed in (3, 4):
        pert.shift(seed, 1e-3)
        pert.shift(seed, -2e-3)
        pert.restore()
        pert.update(seed + 10, 0.5)
    passes = (1 if keep_z else 3) + 1
    assert pert.z_generations == 2 * passes * len(params)


def test_seed_schedule_is_shared_and_distinct():
    assert step_seeds(0, 5, 4) == step_seeds(0, 5, 4)
    assert len(set(step_seeds(0, 5, 4) + step_seeds(0, 6, 4) + step_seeds(1, 5, 4))) == 12


def test_shifting_along_another_seed_without_restore_fails():
    pert = Perturber(_params(), "exact")
    pert.shift(1, 1e-3)
    # the whole sentence: the message is the user's only hint at the fix
    with pytest.raises(RuntimeError, match=r"^restore\(\) the previous perturbation before shifting along another seed$"):
        pert.shift(2, 1e-3)
    with pytest.raises(RuntimeError, match=r"^update\(\) while a perturbation is applied; restore\(\) first$"):
        pert.update(1, 0.1)
    with pytest.raises(ValueError, match="mode"):
        Perturber(_params(), "sloppy")


def test_each_pass_is_timed_under_its_phase():
    # ZO2 / DistZO2 report seconds per phase (algorithms/zo/phases.py): the z
    # draws under zgen, the shifts and the restore under perturb, the update's
    # additions under update.
    seen = []

    def clock(phase):
        seen.append(phase)
        return NO_CLOCK

    pert = Perturber(_params(), "exact", clock=clock)
    pert.update(1, 0.1)
    assert set(seen) == {"zgen", "update"}
    seen.clear()
    pert.shift(1, 1e-3)
    pert.restore()
    assert set(seen) == {"zgen", "perturb"}
