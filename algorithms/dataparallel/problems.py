"""Problems for double quantisation: regularised objectives P(x) = f(x) + h(x) on real data.

``x`` is always one flat parameter vector (that is what the parameter server
quantises).  ``f(x) = (1/n) Σ ℓ_i(x) + (λ₂/2)‖x‖²`` (the L2 term lives in f, so it
is smooth) and ``h(x) = λ₁‖x‖₁`` (handled by the soft-threshold prox).

All data is real and offline, from the scikit-learn wheel (no download):

* ``logreg-cancer``: breast_cancer, 569 × 30 standardised features + bias, labels ±1;
* ``logreg-digits``: digits, 1797 × 64 pixels / 16 + bias, label "digit ≥ 5" as ±1;
* ``mlp-digits``: digits, the paper's 784-100-10 ReLU MLP shape at the digits'
  64-100-10 (d = 7510), softmax cross-entropy.  (The paper uses MNIST; real
  28×28 MNIST / Fashion-MNIST is not pip-installable.)

Gradients are written out by hand (no autograd) so a worker's gradient is a
pure, fast function of (x, indices); the full gradient is assembled from the
workers' partial sums exactly as :meth:`Problem.full_grad` does it, so a
one-worker run reproduces serial prox-SVRG bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from harness.data import Dataset, register_dataset

from .tables import PROBLEM_DATA, PROBLEMS  # noqa: F401  (re-exported; declares the tables' data)


class _TableData(Dataset):
    """A real table shipped inside the scikit-learn wheel; the problems read it
    whole (``Problem``), so token batches do not apply."""

    def batch(self, step, **kw):
        raise NotImplementedError(f"{self.name} is a feature table; use algorithms.dataparallel.problems")


@register_dataset
class BreastCancerData(_TableData):
    name = "sklearn-breast-cancer"
    description = "Wisconsin breast cancer, 569 x 30, binary (standardised)"


@register_dataset
class DigitsData(_TableData):
    name = "sklearn-digits"
    description = "handwritten digits, 1797 x 64 (8x8), 10 classes"


@cache
def _dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    if name == "cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
        X = (X - X.mean(0)) / X.std(0)
        return X, y.astype(np.int64)
    if name == "digits":
        X, y = datasets.load_digits(return_X_y=True)
        return X / 16.0, y.astype(np.int64)
    raise ValueError(f"unknown dataset {name!r}")


def soft_threshold(v: torch.Tensor, thr: float) -> torch.Tensor:
    """prox of thr·‖·‖₁: sign(v) max(|v| − thr, 0)  (identity when thr = 0)."""
    if thr == 0.0:
        return v
    return torch.sign(v) * torch.clamp(v.abs() - thr, min=0.0)


@dataclass
class Problem:
    name: str
    n: int
    d: int
    l1: float
    l2: float

    # ---- data term, implemented by subclasses --------------------------------
    def data_grad_sum(self, x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
        """Σ_{i ∈ idx} ∇ℓ_i(x) (all samples when idx is None)."""
        raise NotImplementedError

    def data_loss(self, x: torch.Tensor) -> float:
        raise NotImplementedError

    def init(self, seed: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    # ---- shared --------------------------------------------------------------
    def finish_full_grad(self, data_sum: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """∇f(x) from Σ_i ∇ℓ_i(x) (the master does this with the workers' partial sums)."""
        return data_sum / self.n + self.l2 * x

    def full_grad(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish_full_grad(self.data_grad_sum(x, None), x)

    def batch_grad(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """∇f_B(x) = mean_{i∈B} ∇ℓ_i(x) + λ₂x."""
        return self.data_grad_sum(x, idx) / idx.numel() + self.l2 * x

    def objective(self, x: torch.Tensor) -> float:
        """P(x) = f(x) + h(x): the training loss that is logged and thresholded."""
        return (self.data_loss(x) + 0.5 * self.l2 * float(x.pow(2).sum())
                + self.l1 * float(x.abs().sum()))

    def prox(self, v: torch.Tensor, step: float) -> torch.Tensor:
        return soft_threshold(v, step * self.l1)

    def partition(self, worker: int, workers: int) -> torch.Tensor:
        """Worker w keeps the disjoint partition {i : i mod W = w}."""
        return torch.arange(worker, self.n, workers, dtype=torch.int64)


class LogReg(Problem):
    def __init__(self, name: str, X: np.ndarray, y: np.ndarray, l1: float, l2: float, dtype: torch.dtype):
        A = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
        super().__init__(name, A.shape[0], A.shape[1], l1, l2)
        self.A = torch.tensor(A, dtype=dtype)
        self.y = torch.tensor(np.where(y > 0, 1.0, -1.0), dtype=dtype)

    def data_grad_sum(self, x, idx):
        A, y = (self.A, self.y) if idx is None else (self.A[idx], self.y[idx])
        # ∇ log(1 + exp(−y aᵀx)) = −y σ(−y aᵀx) a
        r = -y * torch.sigmoid(-y * (A @ x))
        return A.T @ r

    def data_loss(self, x):
        return float(torch.nn.functional.softplus(-self.y * (self.A @ x)).mean())

    def init(self, seed, dtype):
        return torch.zeros(self.d, dtype=dtype)


class MLP(Problem):
    """64-h-10 ReLU MLP; x = [W1 (in×h), b1 (h), W2 (h×10), b2 (10)] flattened."""

    def __init__(self, name: str, X: np.ndarray, y: np.ndarray, hidden: int, l1: float, l2: float,
                 dtype: torch.dtype):
        self.din, self.h, self.k = X.shape[1], hidden, int(y.max()) + 1
        d = self.din * hidden + hidden + hidden * self.k + self.k
        super().__init__(name, X.shape[0], d, l1, l2)
        self.X = torch.tensor(X, dtype=dtype)
        self.y = torch.tensor(y, dtype=torch.int64)

    def _unpack(self, x):
        i, h, k = self.din, self.h, self.k
        W1, b1, W2, b2 = torch.split(x, [i * h, h, h * k, k])
        return W1.view(i, h), b1, W2.view(h, k), b2

    def data_grad_sum(self, x, idx):
        X, y = (self.X, self.y) if idx is None else (self.X[idx], self.y[idx])
        W1, b1, W2, b2 = self._unpack(x)
        z = X @ W1 + b1
        a = torch.relu(z)
        p = torch.softmax(a @ W2 + b2, dim=1)
        p[torch.arange(y.numel()), y] -= 1.0  # d(CE)/d(logits), summed over the batch
        da = (p @ W2.T) * (z > 0)
        return torch.cat([(X.T @ da).reshape(-1), da.sum(0), (a.T @ p).reshape(-1), p.sum(0)])

    def data_loss(self, x):
        W1, b1, W2, b2 = self._unpack(x)
        logits = torch.relu(self.X @ W1 + b1) @ W2 + b2
        return float(torch.nn.functional.cross_entropy(logits, self.y))

    def init(self, seed, dtype):
        # PyTorch's default Linear init, U(±1/√fan_in), from a seeded generator
        g = torch.Generator().manual_seed(seed)
        parts = []
        for fan_in, shape in ((self.din, self.din * self.h), (self.din, self.h),
                              (self.h, self.h * self.k), (self.h, self.k)):
            bound = 1.0 / math.sqrt(fan_in)
            parts.append((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound)
        return torch.cat(parts).to(dtype)


def make_problem(name: str, *, l1: float = 1e-4, l2: float = 1e-4, dtype: torch.dtype = torch.float32,
                 hidden: int = 100) -> Problem:
    if name == "logreg-cancer":
        X, y = _dataset("cancer")
        return LogReg(name, X, y, l1, l2, dtype)
    if name == "logreg-digits":
        X, y = _dataset("digits")
        return LogReg(name, X, (y >= 5).astype(np.int64), l1, l2, dtype)
    if name == "mlp-digits":
        X, y = _dataset("digits")
        return MLP(name, X, y, hidden, l1, l2, dtype)
    raise ValueError(f"unknown problem {name!r}; choose from {', '.join(PROBLEMS)}")
