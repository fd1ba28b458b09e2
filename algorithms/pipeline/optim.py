"""Stage optimisers: torch SGD / AdamW and Clapping's momentum and Adam (eq. 3 and 107).

The paper's conventions differ from torch's (Algorithms 4 and 5): its momentum
``m`` weights the *new* gradient, ``ũ = (1 - m) ũ + m g`` (an EMA starting at
0), and its Adam has ``β`` on the new term, ``ε`` inside the square root and no
bias correction.  Every update is per tensor, so any split of the model into
stages updates each parameter exactly as the unsplit model would.
"""

from __future__ import annotations

import torch

OPTIMIZERS = ("sgd", "ema", "paper-adam", "adamw")
SCHEDULES = ("constant", "linear", "warmup-linear")


def lr_factor(schedule: str, step: int, steps: int, warmup: float) -> float:
    """The peak lr's multiplier at 0-based ``step`` of ``steps``.

    ``constant``: 1.  ``linear``: Clapping App. I.3.2, "scheduled by a linear scheduler" (Hugging
    Face's linear schedule without warm-up: 1 - step / steps).  ``warmup-linear``: Protocol Models §8.1, "a base learning rate η = 3e-4 (with
    warmup and linear decay)": linear warm-up over ``warmup`` of the steps (the paper gives no
    length; spec G16: 2 %), then linear decay to 0 after the last step (the end value is not given
    either)."""
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, 1 - step / steps)
    if schedule != "warmup-linear":
        raise ValueError(f"lr schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    w = max(1, round(warmup * steps))
    if step < w:
        return (step + 1) / w
    return (steps - step) / (steps - w + 1)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def schedule_problem(schedule: str, warmup: float) -> str | None:
    """Why a (schedule, warm-up fraction) pair is invalid (None when it is valid)."""
    if schedule not in SCHEDULES:
        return f"lr_schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
    if not 0 <= warmup < 1:
        return f"warmup must be a fraction of the steps in [0, 1), got {warmup}"
    return None


class PaperMomentum(torch.optim.Optimizer):
    """``ũ ← (1 - m) ũ + m g``; ``w ← w - γ ũ`` (Algorithm 4, eq. 3)."""

    def __init__(self, params, lr: float, m: float):
        super().__init__(params, dict(lr=lr, m=m))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for w in group["params"]:
                if w.grad is None:
                    continue
                u = self.state[w].setdefault("u", torch.zeros_like(w))
                u.mul_(1 - group["m"]).add_(w.grad, alpha=group["m"])
                w.sub_(u, alpha=group["lr"])


class PaperAdam(torch.optim.Optimizer):
    """Eq. 107: ``ũ ← (1-β1)ũ + β1 g``, ``s ← (1-β2)s + β2 g²``, ``w ← w - γ ũ / sqrt(s + ε)``."""

    def __init__(self, params, lr: float, beta1: float, beta2: float, eps: float):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for w in group["params"]:
                if w.grad is None:
                    continue
                st = self.state[w]
                u = st.setdefault("u", torch.zeros_like(w))
                s = st.setdefault("s", torch.zeros_like(w))
                u.mul_(1 - group["beta1"]).add_(w.grad, alpha=group["beta1"])
                s.mul_(1 - group["beta2"]).addcmul_(w.grad, w.grad, value=group["beta2"])
                w.sub_(u / (s + group["eps"]).sqrt(), alpha=group["lr"])


def make_optimizer(params, p) -> torch.optim.Optimizer:
    """From a params dataclass with lr, optimizer, momentum, m, beta1, beta2, eps, weight_decay."""
    if p.optimizer == "sgd":  # foreach=False: identical for any grouping into stages
        return torch.optim.SGD(params, lr=p.lr, momentum=p.momentum, foreach=False)
    if p.optimizer == "ema":
        return PaperMomentum(params, lr=p.lr, m=p.m)
    if p.optimizer == "paper-adam":
        return PaperAdam(params, lr=p.lr, beta1=p.beta1, beta2=p.beta2, eps=p.eps)
    # torch AdamW; the paper's β weights the new term, torch's the old one
    return torch.optim.AdamW(params, lr=p.lr, betas=(1 - p.beta1, 1 - p.beta2), eps=p.eps,
                             weight_decay=p.weight_decay, foreach=False)
