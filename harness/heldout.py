"""Held-out evaluation on a labelled task: accuracy and loss before and after training.

On a classification data set (``modality == "classify"``) every run evaluates the
same fixed rows of the validation split — the first ``HELDOUT_ROWS`` of its order
for seed 0 (the file is grouped by source, so its own order is not a sample),
whatever the run's seed — once before its measured window opens and once after it
closes, so neither the bytes nor the times of the evaluation enter the run's
metrics.  The record gets ``val_accuracy_start`` / ``val_loss_start`` (the
starting model), ``val_accuracy`` / ``val_loss`` (the trained one) and
``majority_accuracy`` (always predicting the most frequent class on the same
rows), the three a reader needs side by side.

A split model is evaluated stage by stage over the run's Comm: each stage's
outputs cross raw (their bytes as they are, under tag ``heldout``), so the
evaluation is the uncompressed forward of the model the run trained.
"""

from __future__ import annotations

import torch

__all__ = ["HELDOUT_ROWS", "evaluate_model", "evaluate_stages", "heldout_batches"]

HELDOUT_ROWS = 512  # 2 % standard error on an accuracy near 80 %
TAG = "heldout"


def heldout_batches(cfg, device) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The held-out rows in batches of ``cfg.batch_size`` (the last may be smaller); None when the
    run's data has no labels to be accurate about."""
    from .data import get_dataset

    ds = get_dataset(cfg.data)
    if ds.modality != "classify":
        return None
    ids, labels = ds.encoded("val", cfg.model, cfg.seq_len)
    rows = ds.order("val", seed=0, epoch=0)[:HELDOUT_ROWS]
    ids, labels = ids[rows], labels[rows]
    n = len(rows)
    return [(ids[i:i + cfg.batch_size].to(device), labels[i:i + cfg.batch_size].to(device))
            for i in range(0, n, cfg.batch_size)]


def _record(ctx, when: str, correct: int, loss_sum: float, rows: int, labels: list[torch.Tensor]) -> None:
    suffix = "_start" if when == "start" else ""
    ctx.extra[f"val_accuracy{suffix}"] = (correct / rows, "fraction")
    ctx.extra[f"val_loss{suffix}"] = (loss_sum / rows, "nats/sample")
    y = torch.cat(labels)
    ctx.extra["majority_accuracy"] = (float(torch.bincount(y).max()) / rows, "fraction")


def _score(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, float]:
    """(correct predictions, summed cross-entropy) of one batch."""
    logits = logits.float()
    correct = int((logits.argmax(-1) == labels).sum())
    loss = float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
    return correct, loss


@torch.no_grad()
def evaluate_model(ctx, model, when: str) -> None:
    """Held-out accuracy of an unsplit model (``model(ids).logits``); no-op on unlabelled data."""
    batches = heldout_batches(ctx.cfg, ctx.device)
    if batches is None:
        return
    correct, loss = 0, 0.0
    for ids, labels in batches:
        c, lsum = _score(model(ids).logits, labels)
        correct, loss = correct + c, loss + lsum
    _record(ctx, when, correct, loss, sum(len(y) for _, y in batches), [y for _, y in batches])


@torch.no_grad()
def evaluate_stages(ctx, stage, when: str) -> None:
    """Held-out accuracy of a model split one stage per rank; the last rank records it."""
    batches = heldout_batches(ctx.cfg, ctx.device)
    if batches is None:
        return
    comm, rank, last = ctx.comm, ctx.rank, ctx.world_size - 1
    correct, loss = 0, 0.0
    for ids, labels in batches:
        if rank == 0:
            inputs = (ids,)
        else:
            specs = stage.input_specs(ids.shape[0], ids.shape[1])
            inputs = tuple(comm.recv(rank - 1, tag=TAG).view(s.dtype).reshape(s.shape).to(ctx.device)
                           for s in specs)
        outputs = stage(*inputs, input_ids=ids)
        if rank == last:
            c, lsum = _score(outputs[0], labels)
            correct, loss = correct + c, loss + lsum
        else:
            for t in outputs:
                comm.send(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8), rank + 1, tag=TAG)
    if rank == last:
        _record(ctx, when, correct, loss, sum(len(y) for _, y in batches), [y for _, y in batches])
