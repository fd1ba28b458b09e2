"""Clapping's E = 2 logistic-regression toy (App. I.1, Fig. 5), single-process simulator.

Worker 1 holds ``(w, b)`` and computes ``y_1 = -ζ (ξᵀw + b)`` per sample;
worker 2 computes ``ln(1 + e^{ỹ_1})``; the regulariser ``C_r(‖w‖² + b²)``
is computed on worker 1, which holds ``w``.  Only the forward link is
compressed, by the *relative* noise compressor ``C(z) = z ⊙ (1 + δ)``,
``δ ~ U(-0.2, 0.2)`` (the paper's additive ``y + δ`` would make EF a no-op:
EF would then send exactly what direct compression sends).  The backward
message ``σ(ỹ_1)`` is exact.  Momentum is the paper's EMA (Algorithm 4), its
"moving average 0.9" being ``m = 0.1``.  Where App. I.1 is silent the
choices are ours: the step halves at every quarter of T and the momentum
buffer is cleared then; ``N = 10 000``, labels from a random teacher,
features ``ξ* + ε`` with std (not variance) 0.5 and 0.3.

Variants: ``none``, ``direct`` (ỹ = C(y)), ``ef`` (Clapping-FC with p = 1,
i.e. EF21), ``fc`` and ``fu`` (lazy sampling with probability ``p``, batch-wise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VARIANTS = ("none", "direct", "ef", "fc", "fu")
C_R = 0.005


@dataclass(frozen=True)
class Problem:
    xi: torch.Tensor  # [N, d]
    zeta: torch.Tensor  # [N]
    f_star: float


def make_problem(seed: int, n: int = 10_000, d: int = 200, newton_steps: int = 12) -> Problem:
    g = torch.Generator().manual_seed(seed)
    xi = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.5 + torch.randn(n, d, generator=g, dtype=torch.float64) * 0.3
    w_teacher = torch.randn(d, generator=g, dtype=torch.float64)
    zeta = torch.sign(xi @ w_teacher)
    zeta[zeta == 0] = 1
    # f* by Newton's method on the strongly convex objective (quadratic convergence)
    x1 = torch.cat([xi, torch.ones(n, 1, dtype=torch.float64)], 1)
    theta = torch.zeros(d + 1, dtype=torch.float64)
    for _ in range(newton_steps):
        z = x1 @ theta
        s = torch.sigmoid(-zeta * z)
        grad = x1.T @ (-zeta * s) / n + 2 * C_R * theta
        hess = (x1.T * (s * (1 - s))) @ x1 / n + 2 * C_R * torch.eye(d + 1, dtype=torch.float64)
        theta = theta - torch.linalg.solve(hess, grad)
    w, b = theta[:d], theta[d]
    return Problem(xi, zeta, objective(xi, zeta, w, b))


def objective(xi, zeta, w, b) -> float:
    y = -zeta * (xi @ w + b)
    return float(torch.nn.functional.softplus(y).mean() + C_R * (w @ w + b * b))


def train(prob: Problem, variant: str, *, seed: int, steps: int, p: float = 0.5, batch: int = 128,
          lr: float = 0.1, m: float = 0.1, noise: float = 0.2) -> list[float]:
    """Optimality gap ``f(w_t) - f*`` at every quarter of the run (and at the end)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}")
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    g = torch.Generator().manual_seed(seed)
    n, d = prob.xi.shape
    w, b = torch.zeros(d, dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    uw, ub = torch.zeros_like(w), torch.zeros_like(b)
    state = torch.zeros(batch, dtype=torch.float64)  # ỹ_1: one row per batch slot, both ends
    lazy_p = p if variant in ("fc", "fu") else 1.0
    idx = None
    gaps = []
    for t in range(steps):
        if t and t % (steps // 4) == 0:  # halve the step, clear the momentum
            gaps.append(objective(prob.xi, prob.zeta, w, b) - prob.f_star)
            lr, uw, ub = lr / 2, torch.zeros_like(w), torch.zeros_like(b)
        fresh = idx is None or bool(torch.rand((), generator=g) < lazy_p)
        if fresh:
            idx = torch.randint(n, (batch,), generator=g)
        xi, zeta = prob.xi[idx], prob.zeta[idx]
        y = -zeta * (xi @ w + b)  # worker 1
        delta = (torch.rand(batch, generator=g, dtype=torch.float64) * 2 - 1) * noise
        if variant == "none" or (variant == "fu" and fresh):
            y_tilde = y
        elif variant == "direct":
            y_tilde = y * (1 + delta)  # C(y)
        else:  # error feedback (ef, fc, and fu within a lazy window)
            y_tilde = state + (y - state) * (1 + delta)  # x̃ + C(y − x̃)
        state = y_tilde
        v = torch.sigmoid(y_tilde) / batch  # worker 2: d loss / d ỹ_1 (exact backward)
        gw = xi.T @ (v * -zeta) + 2 * C_R * w
        gb = (v * -zeta).sum() + 2 * C_R * b
        uw, ub = (1 - m) * uw + m * gw, (1 - m) * ub + m * gb
        w, b = w - lr * uw, b - lr * ub
    gaps.append(objective(prob.xi, prob.zeta, w, b) - prob.f_star)
    return gaps
