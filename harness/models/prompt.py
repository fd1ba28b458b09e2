"""Prompt-based classification with a causal LM, as MeZO fine-tunes OPT (MeZO §3, App. E.2).

A sentence becomes ``template.format(text=...)`` ("<tweet> It was"), and the
class is the label word the LM head scores highest at the last real token
(" terrible" for 0, " great" for 1, MeZO's SST-2 words).  The loss is the
cross-entropy over the label words' logits.  The LM head's label-word rows are
all a classifier needs, so the model carries only those rows (a ``[C, d]``
head initialised from the tied embedding's rows): scoring is identical to the
full LM head restricted to the words, and the 262k-row head never enters a
pipeline stage.  Tokens: ``<bos> + text + suffix``, the text truncated so the
suffix always fits, padded on the right (a causal model's real tokens never
see the padding).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptTemplate", "encode_prompted", "label_token_ids"]


@dataclass(frozen=True)
class PromptTemplate:
    """``suffix`` follows the text; ``words[c]`` is the label word of class ``c`` (one token each,
    with its leading space: the word continues the prompt)."""

    suffix: str
    words: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.words) < 2 or len(set(self.words)) != len(self.words):
            raise ValueError(f"a prompt needs two or more distinct label words, got {self.words!r}")

    def describe(self) -> str:
        return f"'<text>{self.suffix}' -> {' / '.join(repr(w) for w in self.words)}"


class PromptError(ValueError):
    """A template the tokenizer cannot score (a label word that is not one token)."""


def label_token_ids(tok, prompt: PromptTemplate) -> list[int]:
    """The token id of each label word; every word must be exactly one token."""
    ids, bad = [], []
    for word in prompt.words:
        got = tok(word, add_special_tokens=False)["input_ids"]
        if len(got) != 1:
            bad.append(f"{word!r} -> {len(got)} tokens {got}")
        else:
            ids.append(got[0])
    if bad:
        raise PromptError("label words must be single tokens of the model's tokenizer: " + "; ".join(bad))
    if len(set(ids)) != len(ids):
        raise PromptError(f"label words {prompt.words!r} map to the same token")
    return ids


def encode_prompted(tok, texts, prompt: PromptTemplate, seq_len: int) -> list[list[int]]:
    """``[bos] + text + suffix`` per text, the text cut so the whole fits ``seq_len``, right-padded."""
    suffix = tok(prompt.suffix, add_special_tokens=False)["input_ids"]
    bos = [] if tok.bos_token_id is None else [tok.bos_token_id]
    room = seq_len - len(bos) - len(suffix)
    if room < 1:
        raise PromptError(f"seq_len {seq_len} leaves no room for text beside the prompt's "
                          f"{len(bos) + len(suffix)} tokens")
    pad = tok.pad_token_id
    out = []
    for ids in tok(list(texts), add_special_tokens=False)["input_ids"]:
        row = bos + ids[:room] + suffix
        out.append(row + [pad] * (seq_len - len(row)))
    return out
