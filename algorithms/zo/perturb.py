"""Seeded perturbations: z as a pure function of (seed, global parameter index).

MeZO draws z from a global generator walked over ``named_parameters()``, so z
depends on the order and on which tensors a process holds; the SparQ paper's
Perturb/Update (Algorithms 1-3) resets the *same* seed on every node, which
correlates the nodes' perturbations.  Here every parameter tensor gets its
own generator, seeded with ``mix64("z", seed, global_index)``, where the global
index is the tensor's position in the unsplit model: z is then the same
whether a tensor sits in a one-process model or in any pipeline stage, on any
rank, process or backend.  z is drawn in float32 on the CPU and then cast and
moved, so a float64 or CUDA run sees exactly the float32 CPU values.

The step seeds follow a shared schedule ``s_{t,i} = mix64("step", run_seed,
t, i)``: every node computes them locally, so no seed is ever sent.

:class:`Perturber` applies ``x <- x + c z`` in place.  Two restore modes:

* ``exact``: the unperturbed tensors are stashed once per perturbation and
  copied back, so restore is bit-exact (costs one extra copy of the params);
* ``inplace``: the classic MeZO sequence (+mu, restore -mu; or +mu, -2mu,
  restore +mu), which is cheap but does not restore bit-exactly.  With
  ``track_drift`` it also stashes, only to measure the drift it leaves.

``keep_z`` keeps the z of the current perturbation between the shift and
the restore, so the +mu, -2mu and restore passes reuse one draw instead of
drawing it again each time (ZO2 keeps one module on the device at a time, so
that is at most one module's z).  Each element still sees the same additions
with the same tensors in the same order, so the bits are unchanged.
``z_generations`` counts the draws (one per parameter tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from harness.seeding import keyed_seed

from .params import MODES  # noqa: E402,F401  (re-exported)


def mix64(*parts: object) -> int:
    """A 64-bit integer from a SHA-256 of the parts (domain-separated by the first part)."""
    return keyed_seed("commbench.zo", *parts)


def step_seed(run_seed: int, step: int, i: int) -> int:
    """Seed of perturbation ``i`` at iteration ``step`` (the shared schedule)."""
    return mix64("step", int(run_seed), int(step), int(i))


def step_seeds(run_seed: int, step: int, num: int) -> list[int]:
    return [step_seed(run_seed, step, i) for i in range(num)]


def z_for(seed: int, index: int, shape: Sequence[int], dtype: torch.dtype = torch.float32,
          device: torch.device | str = "cpu") -> Tensor:
    """The perturbation of global parameter ``index`` under ``seed`` (a pure function)."""
    g = torch.Generator(device="cpu").manual_seed(mix64("z", int(seed), int(index)))
    z = torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    return z.to(device=device, dtype=dtype)


class _NoClock:
    """The default clock: times nothing (a :class:`~.phases.PhaseClock` has the same call)."""

    def __call__(self, phase: str) -> _NoClock:
        return self

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


NO_CLOCK = _NoClock()


class Perturber:
    """Perturb, restore and update ``(global_index, parameter)`` pairs in place."""

    def __init__(self, params: Sequence[tuple[int, Tensor]], mode: str = "exact",
                 track_drift: bool = False, keep_z: bool = False, clock=NO_CLOCK):
        if mode not in MODES:
            raise ValueError(f"perturbation mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.params = [(int(i), p) for i, p in params]
        self.mode = mode
        self.track_drift = track_drift and mode == "inplace"
        self._stash: list[Tensor] | None = None
        self._seed: int | None = None
        self._applied = 0.0  # sum of the scales applied since the last restore (inplace)
        self.drift_max = 0.0  # max |restored - original| seen so far (inplace + track_drift)
        self.drift_changed = 0  # elements not restored bit-exactly, summed over restores
        self.restored_elements = 0
        self.keep_z = keep_z
        self.clock = clock  # phases.PhaseClock: zgen / perturb / update seconds
        self.z_generations = 0
        self._z: list[Tensor] | None = None  # keep_z: the current perturbation's draws

    def _draw(self, seed: int, idx: int, p: Tensor) -> Tensor:
        with self.clock("zgen"):
            self.z_generations += 1
            return z_for(seed, idx, p.shape, p.dtype, p.device)

    # The in-place updates run under ``with torch.no_grad()`` rather than the
    # ``@torch.no_grad()`` decorator: same effect, and mutmut 3 mutates no
    # decorated function (checks/MUTATION.md).
    def _add(self, seed: int, scale: float, phase: str = "perturb") -> None:
        with torch.no_grad():
            if self.keep_z and phase == "perturb" and self._z is None:
                self._z = [self._draw(seed, idx, p) for idx, p in self.params]
            for k, (idx, p) in enumerate(self.params):
                z = self._z[k] if self._z is not None else self._draw(seed, idx, p)
                with self.clock(phase):
                    p.add_(z, alpha=scale)

    def shift(self, seed: int, scale: float) -> None:
        """``x <- x + scale z(seed)`` (the first shift after a restore remembers x)."""
        with torch.no_grad():
            if self._seed is None:
                self._seed = seed
                if self.mode == "exact" or self.track_drift:
                    with self.clock("perturb"):
                        self._stash = [p.detach().clone() for _, p in self.params]
            elif seed != self._seed:
                raise RuntimeError("restore() the previous perturbation before shifting along another seed")
            self._add(seed, scale)
            self._applied += scale

    def restore(self) -> None:
        """Undo the shifts since the last restore (bit-exactly in ``exact`` mode)."""
        if self._seed is None:
            return
        with torch.no_grad():
            if self.mode == "exact":
                with self.clock("perturb"):
                    for (_, p), s in zip(self.params, self._stash, strict=True):
                        p.copy_(s)
            else:
                self._add(self._seed, -self._applied)  # -mu after +mu; +mu after +mu, -2mu
                if self._stash is not None:
                    for (_, p), s in zip(self.params, self._stash, strict=True):
                        d = (p - s).abs()
                        if d.numel():
                            self.drift_max = max(self.drift_max, float(d.max()))
                        self.drift_changed += int(torch.count_nonzero(d))
                        self.restored_elements += d.numel()
        self._stash, self._seed, self._applied, self._z = None, None, 0.0, None

    def update(self, seed: int, coeff: float) -> None:
        """ZO-SGD update along one direction: ``x <- x - coeff z(seed)``."""
        if self._seed is not None:
            raise RuntimeError("update() while a perturbation is applied; restore() first")
        with torch.no_grad():
            self._add(seed, -coeff, "update")


def zo_update(perturber: Perturber, seeds: Sequence[int], scalars: Sequence[float], lr: float) -> None:
    """``x <- x - (lr / P) sum_i g_i z_i`` (Eq. 3), applied direction by direction."""
    P = len(seeds)
    for s, g in zip(seeds, scalars, strict=True):
        perturber.update(s, lr / P * float(g))


def as_scalar(diff: Tensor, denom: float) -> float:
    """The projected gradient ``g = diff / denom`` as it travels: one float32."""
    return float((diff.detach() / denom).to(torch.float32))
