"""Held-out evaluation on a labelled task: accuracy and loss before and after training.

On a classification data set (``modality == "classify"``) every run evaluates the
same fixed rows of the validation split — the first ``cfg.heldout_rows`` of its order
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

import functools
import os

import torch

__all__ = ["PROBE_ROWS", "evaluate_model", "evaluate_params", "evaluate_stages", "heldout_batches",
           "init_head", "probe_head"]

PROBE_ROWS = 1024  # training rows the linear probe is fitted on
TAG = "heldout"


def heldout_batches(cfg, device) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The held-out rows in batches of ``cfg.batch_size`` (the last may be smaller); None when the
    run's data has no labels to be accurate about."""
    from .data import get_dataset

    ds = get_dataset(cfg.data)
    if ds.modality != "classify":
        return None
    ids, labels = ds.encoded("val", cfg.model, cfg.seq_len)
    rows = ds.order("val", seed=0, epoch=0)[:cfg.heldout_rows]
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
def evaluate_params(ctx, named_params, when: str) -> None:
    """Held-out accuracy of the unsplit model holding ``named_params`` (``(global index, tensor)``
    of every parameter), for engines that keep the weights outside a model (ZO2's host blocks);
    the last rank evaluates, as the pipelines' last stage does."""
    if ctx.rank != ctx.world_size - 1 or heldout_batches(ctx.cfg, ctx.device) is None:
        return
    from .models import build_model

    model = build_model(ctx.cfg.model, seed=ctx.cfg.seed, dtype=ctx.dtype).eval().to(ctx.device)
    values = dict(named_params)
    for i, p in enumerate(model.parameters()):
        p.copy_(values[i])
    evaluate_model(ctx, model, when)


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


# --------------------------------------------------------------------------- linear probing


def _cache_path(model: str, data: str, seq_len: int):
    import hashlib
    import os
    from pathlib import Path

    from .models import PRESETS
    from .models.pretrained import SOURCES

    key = f"{SOURCES[PRESETS[model].pretrained].sha256}/{data}/{seq_len}/{PROBE_ROWS}/v1"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commbench"
    return root / f"probe-{model}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@functools.lru_cache(maxsize=4)
def probe_head(model: str, data: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fit_probe_head`, kept on disk (``~/.cache/commbench``, keyed by the checkpoint's
    hash, the data, the sequence length and the row count): each rank process of each run would
    otherwise repeat the same deterministic fit."""
    import json

    path = _cache_path(model, data, seq_len)
    if path.is_file():
        try:  # plain JSON numbers (float32 values round-trip exactly through a double)
            entry = json.loads(path.read_text())
            return (torch.tensor(entry["weight"], dtype=torch.float32),
                    torch.tensor(entry["bias"], dtype=torch.float32))
        except (ValueError, KeyError, TypeError, OSError):  # a damaged entry is recomputed
            pass
    w, b = fit_probe_head(model, data, seq_len)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"weight": w.tolist(), "bias": b.tolist()}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: no cache, same numbers
    return w, b


def fit_probe_head(model: str, data: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The classifier ``(weight [2, d], bias [2])`` of a linear probe: L2-regularised logistic
    regression (scikit-learn, lbfgs, deterministic) on the frozen pretrained model's pooled
    features of the first ``PROBE_ROWS`` training rows in the seed-0 order, written as the two
    logits ``(-f/2, +f/2)`` whose softmax is the fitted probability.  A pure function of the
    checkpoint and the data, so every rank and every method starts from the same head."""
    from sklearn.linear_model import LogisticRegression

    from .data import get_dataset
    from .models import build_model

    net = build_model(model, seed=0).eval()
    ds = get_dataset(data)
    ids, labels = ds.encoded("train", model, seq_len)
    rows = ds.order("train", seed=0, epoch=0)[:PROBE_ROWS]
    ids, labels = ids[rows], labels[rows]
    if int(labels.max()) > 1:
        raise ValueError("the linear probe fits a binary task")
    feats = []
    with torch.no_grad():
        for i in range(0, len(ids), 64):
            x = ids[i:i + 64]
            out = net.bert(input_ids=x, attention_mask=x.ne(net.config.pad_token_id).long())
            feats.append(out.pooler_output.double())
    fit = LogisticRegression(C=1.0, max_iter=2000).fit(torch.cat(feats).numpy(), labels.numpy())
    w = torch.tensor(fit.coef_[0], dtype=torch.float32)
    b = float(fit.intercept_[0])
    return torch.stack([-w / 2, w / 2]), torch.tensor([-b / 2, b / 2], dtype=torch.float32)


def init_head(ctx, named_params) -> None:
    """Set the classifier head to the linear probe when the run asks for it (``head=probe``);
    ``named_params``: ``(global name, parameter)`` pairs of what this rank holds."""
    cfg = ctx.cfg
    if getattr(cfg, "head", "fresh") != "probe":
        return
    weight, bias = probe_head(cfg.model, cfg.data, cfg.seq_len)
    with torch.no_grad():
        for name, p in named_params:
            if name == "classifier.weight":
                p.copy_(weight.to(p.dtype))
            elif name == "classifier.bias":
                p.copy_(bias.to(p.dtype))
