"""ZO-SGD parameters and the two-point estimators (SparQ Eq. 3 and Eq. 7).

:func:`walk` visits the points a node evaluates in one iteration, with its
parameters shifted accordingly; every node (one process for MeZO, each stage
for SparQ) walks the same schedule, so the same evaluation index always means
the same point ``x + sign mu u_i`` on every node.

* forward difference: ``x`` once, then ``x + mu u_i`` for i = 1..P
  (``g_i = (f(x + mu u_i) - f(x)) / mu``);
* central difference: ``x + mu u_i`` and ``x - mu u_i`` for each i
  (``g_i = (f(x + mu u_i) - f(x - mu u_i)) / (2 mu)``).

All P evaluations use the same ``x_t``; the update
``x <- x - (lr / P) sum_i g_i u_i`` comes after the last of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .params import DIFFERENCES, ZOParams  # noqa: F401  (re-exported)
from .perturb import Perturber, as_scalar


def evaluations(difference: str, P: int) -> list[tuple[int | None, int]]:
    """``(direction, sign)`` of each evaluation, in order (direction None: unperturbed)."""
    if difference == "forward":
        return [(None, 0)] + [(i, +1) for i in range(P)]
    return [(i, s) for i in range(P) for s in (+1, -1)]


def walk(pert: Perturber, seeds: Sequence[int], mu: float, difference: str) -> Iterator[tuple[int | None, int]]:
    """Yield once per evaluation, with ``pert``'s parameters at ``x + sign mu u_i``."""
    if difference == "forward":
        yield None, 0
        for i, s in enumerate(seeds):
            pert.shift(s, +mu)
            yield i, +1
            pert.restore()
    else:
        for i, s in enumerate(seeds):
            pert.shift(s, +mu)
            yield i, +1
            pert.shift(s, -2 * mu)
            yield i, -1
            pert.restore()


def scalars(losses: Sequence[torch.Tensor], difference: str, mu: float) -> list[float]:
    """The P projected gradients (float32 values), from the losses in evaluation order."""
    if difference == "forward":
        return [as_scalar(f - losses[0], mu) for f in losses[1:]]
    return [as_scalar(losses[j] - losses[j + 1], 2 * mu) for j in range(0, len(losses), 2)]


def logged_loss(losses: Sequence[torch.Tensor], difference: str) -> float:
    """f(x) for forward differences; the mean of the 2P perturbed losses for central ones."""
    if difference == "forward":
        return float(losses[0])
    return float(sum(float(f) for f in losses) / len(losses))


def drift_extras(pert: Perturber) -> dict[str, tuple[float, str]]:
    if not pert.track_drift:
        return {}
    frac = pert.drift_changed / max(1, pert.restored_elements)
    return {"restore_drift_max": (pert.drift_max, "abs"),
            "restore_drift_fraction": (frac, "ratio")}
