"""Split-layer selection (SparQ App. B.1): cut where the quantised FFN activation is sparsest.

Candidates for each of the M-1 cuts are the FFN activations of the blocks
within ``window`` of the even split (``harness.models.default_boundaries``
with ``cut="ffn_act"``; block 5 of 12 for M = 2, the paper's "Block 6").  On
``calib`` validation batches we measure each candidate's non-zero ratio after
``Q_b`` (the fraction of codes the sparse body must carry) and keep the
sparsest, ties broken toward the even split.  The paper gives no rule for
M > 2; we apply the same one around each quantile.
"""

from __future__ import annotations

import functools
import threading

import torch

from harness.data import get_dataset
from harness.models import PRESETS, build_model, default_boundaries, split_model

from .wire import GRANULARITY, act_nnz

_LOCK = threading.Lock()  # ranks of the threads backend share the cache


def candidates(num_blocks: int, num_stages: int, window: int) -> list[list[int]]:
    """Candidate blocks for each cut, nearest to the even split first."""
    targets = default_boundaries(num_blocks, num_stages, "ffn_act")
    out = []
    for t in targets:
        near = sorted(range(t - window, t + window + 1), key=lambda j: (abs(j - t), j))
        out.append([j for j in near if 0 <= j < num_blocks])
    return out


@torch.no_grad()
def measure_nnz(model_name: str, blocks: list[int], *, bits: int | None, signed: str | bool = "auto",
                granularity: str = GRANULARITY, seed: int = 0, data: str = "synthetic-markov",
                batch_size: int = 8, seq_len: int = 32, calib: int = 2, dtype: torch.dtype = torch.float32) -> dict[int, float]:
    """Mean non-zero ratio of block j's (quantised) FFN activation, for each j in ``blocks``."""
    model = build_model(model_name, seed=seed, dtype=dtype).eval()
    ds = get_dataset(data)
    batches = [ds.batch(k, batch_size=batch_size, seq_len=seq_len, seed=seed, split="val",
                        model=model_name)[0] for k in range(calib)]
    out = {}
    for j in sorted(set(blocks)):
        head = split_model(model, 2, "ffn_act", [j])[0]
        acts = [head(ids)[0] for ids in batches]
        out[j] = sum(act_nnz(a, bits, signed, granularity) / a.numel() for a in acts) / len(acts)
    return out


@functools.lru_cache(maxsize=64)
def _select(model_name, num_stages, window, bits, signed, granularity, seed, data, batch_size, seq_len, calib,
            dtype):
    cands = candidates(PRESETS[model_name].num_blocks, num_stages, window)
    rho = measure_nnz(model_name, [j for c in cands for j in c], bits=bits, signed=signed,
                      granularity=granularity, seed=seed, data=data, batch_size=batch_size, seq_len=seq_len,
                      calib=calib, dtype=dtype)
    cuts: list[int] = []
    for m, cand in enumerate(cands):
        later = len(cands) - 1 - m  # cuts still to place after this one
        ok = [j for j in cand if (not cuts or j > cuts[-1]) and j < PRESETS[model_name].num_blocks - later]
        if not ok:  # the windows collided: fall back to the next free block
            ok = [cuts[-1] + 1 if cuts else 0]
            rho.update(measure_nnz(model_name, ok, bits=bits, signed=signed, granularity=granularity,
                                   seed=seed, data=data,
                                   batch_size=batch_size, seq_len=seq_len, calib=calib, dtype=dtype))
        cuts.append(min(ok, key=lambda j: rho[j]))  # min keeps the first (nearest) on ties
    return tuple(cuts), dict(rho)


def select_split(model_name: str, num_stages: int, *, window: int = 1, bits: int | None = 4,
                 signed: str | bool = "auto", granularity: str = GRANULARITY, seed: int = 0,
                 data: str = "synthetic-markov", batch_size: int = 8,
                 seq_len: int = 32, calib: int = 2,
                 dtype: torch.dtype = torch.float32) -> tuple[tuple[int, ...], dict[int, float]]:
    """``(cuts, {candidate block: measured non-zero ratio})`` for ``num_stages`` stages."""
    with _LOCK:
        return _select(model_name, num_stages, window, bits, signed, granularity, seed, data, batch_size,
                       seq_len, calib, dtype)
