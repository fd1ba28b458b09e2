"""The language-model loss shared by every training loop."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["lm_loss"]


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy: per token for a causal LM (``labels`` are the next tokens, the shape of
    input_ids, logits ``[B, T, V]``), per sample for a classifier (labels ``[B]``, logits ``[B, C]``).

    Half-precision logits are upcast to float32 first; float32/float64 are used as is.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

