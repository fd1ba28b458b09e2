"""Run fingerprints: the SHA-256 of a model's parameters (metric ``params_sha256``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from .schema import _is_int, _tname


def params_sha256(params: Iterable[tuple[int, Any]]) -> str:
    """SHA-256 of a whole model's parameters as float32 little-endian bytes.

    ``params`` yields ``(global_index, tensor)`` pairs, where the global index is
    the parameter's position in the unsplit model's ``named_parameters()``; they
    may come in any order (for instance gathered from pipeline stages). The
    indices must be exactly 0..N-1, each once: a missing stage or a duplicated
    parameter raises ValueError instead of producing a plausible hash.
    Tensors of any floating dtype are cast to float32 first.
    """
    import torch

    by_index: dict[int, Any] = {}
    for item in params:
        try:
            idx, t = item
        except (TypeError, ValueError):
            raise ValueError(f"params must yield (global_index, tensor) pairs, got {item!r}") \
                from None
        if not _is_int(idx):
            raise ValueError(f"global parameter index must be an int, not {_tname(idx)}")
        if idx in by_index:
            raise ValueError(f"global parameter index {idx} appears more than once")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"parameter {idx} is a {_tname(t)}, not a torch.Tensor")
        if t.is_complex():
            raise ValueError(f"parameter {idx} is complex; params_sha256 hashes real tensors")
        by_index[idx] = t
    if not by_index:
        raise ValueError("no parameters to hash")
    n = len(by_index)
    if min(by_index) < 0:
        raise ValueError(f"negative global parameter index {min(by_index)}")
    if max(by_index) != n - 1:
        missing = sorted(set(range(max(by_index) + 1)) - set(by_index))
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise ValueError(f"global parameter indices are not 0..{max(by_index)}: missing {shown}")
    h = hashlib.sha256()
    with torch.no_grad():
        for i in range(n):
            t = by_index[i].detach().to(device="cpu", dtype=torch.float32).contiguous()
            h.update(t.numpy().astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def params_sha256_of_model(model: Any) -> str:
    """:func:`params_sha256` of an unsplit ``torch.nn.Module`` (``named_parameters()`` order)."""
    return params_sha256(enumerate(p for _, p in model.named_parameters()))
