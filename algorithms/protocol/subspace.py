"""The subspace machinery of Protocol Models (spec §1.3, §2.1-§2.7).

* :func:`make_basis`: the shared orthonormal basis ``U`` (d x k), QR of a seeded
  Gaussian drawn on a CPU generator, so every rank derives the same ``U``.
* :func:`project_` / :func:`off_subspace`: put a tensor's ``d``-axis into
  ``S = Col(U)`` and measure how far it is from it.
* :class:`Wire`: the lossless boundary map.  ``encode(x, ids) = (x - B[ids]) U``
  and ``decode(c, ids) = c Uᵀ + B[ids]``, with ``B[ids] = T_fixed[ids] + PE_fixed``
  the high-rank part every node knows.  Both run under autograd, so the
  gradient that crosses the wire backward is ``G U`` (k values per token).
* :class:`SubspaceAdamW`: AdamW whose second moment is averaged along the
  ``d``-axis for the down projections (paper eqs. 12-14, cleaned as spec §2.6):
  every row of the update is then a scalar times a row of the first moment,
  so it stays in ``S``.
* :func:`grassmann_step`: one Riemannian gradient step on the Grassmannian
  plus QR retraction (paper eq. 11, spec §2.7).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.seeding import keyed_generator


def _generator(*parts) -> torch.Generator:
    return keyed_generator("commbench.protocol", *parts)


def make_basis(d: int, k: int, seed: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Orthonormal ``U`` (d x k) from a seed: QR of N(0, 1) noise, computed in float64."""
    if not 1 <= k < d:
        raise ValueError(f"subspace dimension k must satisfy 1 <= k < d = {d}, got k = {k}")
    z = torch.randn(d, k, generator=_generator("basis", seed), dtype=torch.float64)
    q, r = torch.linalg.qr(z)
    q = q * _signs(r)  # unique QR: the same U whatever the LAPACK
    return q.to(dtype)


def fixed_table(rows: int, d: int, seed: int, name: str, std: float,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """A frozen high-rank table (``T_fixed`` or ``PE_fixed``): N(0, std²), drawn in float32."""
    t = torch.randn(rows, d, generator=_generator("fixed", name, seed), dtype=torch.float32)
    return t.mul_(std).to(dtype)


def _signs(r: Tensor) -> Tensor:
    s = torch.sign(torch.diagonal(r))
    return torch.where(s == 0, torch.ones_like(s), s)


def _moved(t: Tensor, axis: int) -> Tensor:
    return t.movedim(axis, -1)


@torch.no_grad()
def project_(t: Tensor, U: Tensor, axis: int) -> Tensor:
    """In place: ``t``'s ``axis`` (of size d) onto ``Col(U)``."""
    m = _moved(t, axis)
    m.copy_((m @ U) @ U.T)
    return t


@torch.no_grad()
def projected(t: Tensor, U: Tensor, axis: int) -> Tensor:
    return project_(t.clone(), U, axis)


@torch.no_grad()
def off_subspace(t: Tensor, U: Tensor, axis: int) -> float:
    """``max|(I - P) t| / max|t|`` along ``axis`` (0 for a zero tensor)."""
    m = _moved(t, axis)
    scale = float(m.abs().max()) if m.numel() else 0.0
    if scale == 0.0:
        return 0.0
    return float((m - (m @ U) @ U.T).abs().max()) / scale


class Wire:
    """The boundary encode / decode of one run (shared by every stage)."""

    def __init__(self, U: Tensor, t_fixed: Tensor, pe_fixed: Tensor | None):
        self.U = U
        self.t_fixed = t_fixed
        self.pe_fixed = pe_fixed

    @property
    def d(self) -> int:
        return self.U.shape[0]

    @property
    def k(self) -> int:
        return self.U.shape[1]

    def base(self, ids: Tensor) -> Tensor:
        """``PE + T_fixed[ids]``: the high-rank part of the residual stream, [b, n, d]."""
        b = self.t_fixed[ids]
        if self.pe_fixed is not None:
            b = b + self.pe_fixed[: ids.shape[-1]]
        return b

    def encode(self, x: Tensor, ids: Tensor) -> Tensor:
        return (x - self.base(ids)) @ self.U

    def decode(self, c: Tensor, ids: Tensor) -> Tensor:
        return c @ self.U.T + self.base(ids)


class SubspaceAdamW(torch.optim.Optimizer):
    """Per-tensor AdamW (torch's decoupled decay and bias correction).

    A parameter group with ``row_axis = a`` replaces ``v̂`` by its mean over
    axis ``a`` (the model-width axis ``d``): the paper's row-constant second
    moment, which keeps rows of the update in the span of the first moment's.
    """

    def __init__(self, groups, lr: float, betas: tuple[float, float], eps: float, weight_decay: float):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, row_axis=None))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for w in g["params"]:
                if w.grad is None:
                    continue
                st = self.state[w]
                if not st:
                    st["t"] = 0
                    st["exp_avg"] = torch.zeros_like(w)
                    st["exp_avg_sq"] = torch.zeros_like(w)
                st["t"] += 1
                t, m, v = st["t"], st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(w.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(w.grad, w.grad, value=1 - b2)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                if g["row_axis"] is not None:
                    v_hat = v_hat.mean(dim=g["row_axis"], keepdim=True)
                w.mul_(1 - g["lr"] * g["weight_decay"])
                w.sub_(g["lr"] * m_hat / (v_hat.sqrt() + g["eps"]))


@torch.no_grad()
def grassmann_step(U: Tensor, s_acc: Tensor, count: int, eta0: float) -> Tensor:
    """One step on the Grassmannian towards the top-k eigenspace of ``S = s_acc / count``.

    Euclidean gradient ``-2 S U``, Riemannian ``R = -2 (I - U Uᵀ) S U``, step
    ``η = η0 / λ_max(S)``, retraction by QR (signs fixed so Q is unique).
    """
    s = s_acc / max(count, 1)
    e = -2.0 * (s @ U)
    r = e - U @ (U.T @ e)
    lam = float(torch.linalg.eigvalsh(s)[-1])
    if not lam > 0:
        return U.clone()
    q, rr = torch.linalg.qr(U - (eta0 / lam) * r)
    return q * _signs(rr)
