"""Lazy sampling (spec Algorithm 1 and its large-batch rules) over the harness data.

Every rank builds the same :class:`LazyData` and so agrees, with no
communication, on each step's batch and on which rows are fresh.

* Source of samples: with ``dataset_size = 0`` the k-th fresh draw of a row is
  row ``b`` of ``dataset.batch(k)`` (the stream ``pipeline-sgd`` reads, so
  ``p = 1`` sees exactly its batches).  With ``dataset_size = N`` the data is
  the finite set of the first ``N / B`` batches, visited epoch by epoch (the
  first epoch in stream order, later ones in a seeded order) (what AQ-SGD's per-sample buffers need); sample ``j*B + b`` is
  row ``b`` of batch ``j``.
* ``rule = "batch"``: with probability ``1 - p`` keep the whole previous batch,
  otherwise draw a new one (the rule the paper used for GPT-2).
  ``rule = "sample"``: each row is kept or redrawn independently.
* Step 0 is always fresh (spec A2).
"""

from __future__ import annotations

import torch

from harness.data import get_dataset
from harness.seeding import keyed_generator

RULES = ("batch", "sample")


class LazyData:
    def __init__(self, data: str, *, batch_size: int, seq_len: int, seed: int, p: float = 1.0,
                 rule: str = "batch", dataset_size: int = 0, model: str | None = None):
        if not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p}")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
        if dataset_size and dataset_size % batch_size:
            raise ValueError(f"dataset_size {dataset_size} is not a multiple of batch_size {batch_size}")
        self.dataset = get_dataset(data)
        self.B, self.T, self.seed, self.p, self.rule = batch_size, seq_len, seed, p, rule
        self.model = model  # a text task tokenises with the model's tokenizer
        self.num_batches = dataset_size // batch_size
        self._coin = keyed_generator(seed, "lazy-sampling", p, rule)
        self._draws = torch.full((batch_size,), -1, dtype=torch.long)  # fresh draws per row so far
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._orders: dict[int, torch.Tensor] = {}
        self.ids = self.labels = self.sample_ids = None

    def _source(self, k: int) -> tuple[int, int]:
        """(data batch index, sample-id base) of the k-th draw."""
        if not self.num_batches:
            return k, k * self.B
        epoch, pos = divmod(k, self.num_batches)
        if epoch not in self._orders:  # epoch 0 in stream order, so a short run matches pipeline-sgd
            g = keyed_generator(self.seed, "epoch", epoch)
            self._orders[epoch] = (torch.arange(self.num_batches) if epoch == 0 else
                                   torch.randperm(self.num_batches, generator=g))
        j = int(self._orders[epoch][pos])
        return j, j * self.B

    def _batch(self, j: int):
        if j not in self._cache:
            if len(self._cache) > 4 * self.B:
                self._cache.clear()
            self._cache[j] = self.dataset.batch(j, batch_size=self.B, seq_len=self.T, seed=self.seed,
                                                model=self.model)
        return self._cache[j]

    def next(self, step: int) -> torch.Tensor:
        """Advance to ``step``; returns the bool mask of fresh rows (ids/labels are attributes)."""
        if step == 0:
            fresh = torch.ones(self.B, dtype=torch.bool)
        elif self.rule == "batch":
            fresh = torch.full((self.B,), bool(torch.rand((), generator=self._coin) < self.p))
        else:
            fresh = torch.rand(self.B, generator=self._coin) < self.p
        if step > 0 and not bool(fresh.any()):
            return fresh  # nothing changes
        self._draws += fresh.long()
        ids, labels, sids = [], [], []
        for b in range(self.B):
            j, base = self._source(int(self._draws[b]))
            bi, bl = self._batch(j)
            ids.append(bi[b])
            labels.append(bl[b])
            sids.append(base + b)
        self.ids, self.labels = torch.stack(ids), torch.stack(labels)
        self.sample_ids = torch.tensor(sids, dtype=torch.long)
        return fresh


def fresh_schedule(data: str, *, batch_size: int, seq_len: int, seed: int, p: float, rule: str,
                   dataset_size: int, steps: int) -> list[torch.Tensor]:
    """The fresh-row masks of a run (a pure function of the config; used by closed forms)."""
    lazy = LazyData(data, batch_size=batch_size, seq_len=seq_len, seed=seed, p=p, rule=rule,
                    dataset_size=dataset_size)
    return [lazy.next(t) for t in range(steps)]
