"""Gemma-3 as a prompt-based classifier, anchored on Hugging Face's own Gemma-3 and its checkpoint.

Always (a tiny Gemma-3 with random weights, so CI covers the family without the opt-in package):
* every pipeline split, cut between blocks or inside the GeGLU FFN, reproduces Hugging Face's
  ``Gemma3ForCausalLM`` bit for bit at every stage boundary (its ``hidden_states``), and the
  scorer's logits are that model's full LM-head logits at the last real token, restricted to the
  label words (the tied head's rows);
* a label word that is not one token, a damaged converted checkpoint and a missing package are
  refused by name (the words; the file and the expected hash; the install command).

When the opt-in package is installed (``COMMBENCH_GEMMA=1 bash scripts/install.sh``), on the
real checkpoint: the loaded tensors are the checkpoint's (read with ``safetensors``) and its
hash is the pinned one, the label head is the embedding's label rows, the split model equals
Hugging Face's forward at every boundary, and the prompted rows decode to text + template.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.models import PRESETS, build_model, gemma, split_model
from harness.models import pretrained as pre
from harness.models.prompt import PromptError, PromptTemplate, encode_prompted, label_token_ids
from harness.models.weights import prompt_scorer_class

MODEL = "gemma3-270m"
LABEL_ROWS = [7, 11]  # the tiny model's "label words"


@functools.cache
def _tiny():
    """``(scorer, hf)``: a 4-block Gemma-3 (one full-attention layer every 2, a 6-token window so the
    sliding mask differs from the causal one) as our scorer and as Hugging Face's causal LM, with
    the same random weights (norm weights too, which Gemma initialises to zero)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
               sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2,
               max_position_embeddings=64, pad_token_id=0, use_cache=False, attention_dropout=0.0,
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(Gemma3TextConfig(**cfg, tie_word_embeddings=True)).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("norm.weight"):
                p.normal_(0, 0.3)
    hf.config._attn_implementation = "eager"
    ours = prompt_scorer_class()(Gemma3TextConfig(**cfg, num_labels=2, tie_word_embeddings=False)).eval()
    ours.config._attn_implementation = "eager"
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    state["lm_head.weight"] = hf.model.embed_tokens.weight[LABEL_ROWS].detach().clone()
    ours.load_state_dict(state, strict=True)
    return ours, hf


def _tiny_ids(lengths):
    g = torch.Generator().manual_seed(sum(lengths))
    ids = torch.zeros(len(lengths), 16, dtype=torch.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 40, (n,), generator=g)
    return ids


@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 16), min_size=1, max_size=4))
def test_tiny_scorer_is_the_hf_lm_head_at_the_last_real_token(lengths):
    ours, hf = _tiny()
    ids = _tiny_ids(lengths)
    with torch.no_grad():
        full = hf(input_ids=ids).logits  # [B, T, V], the tied LM head
        expected = full[torch.arange(len(lengths)), torch.tensor(lengths) - 1][:, LABEL_ROWS]
        torch.testing.assert_close(ours(ids).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cut", ["block", "ffn_act"])
def test_tiny_split_equals_hugging_face_at_every_boundary(cut):
    ours, hf = _tiny()
    ids = _tiny_ids([16, 9, 3])
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True).hidden_states
        logits = ours(ids).logits
        n = ours.config.num_hidden_layers
        for stages in range(2, n + (cut == "ffn_act") + 1):
            x = (ids,)
            for s in split_model(ours, stages, cut):
                x = s(*x, input_ids=ids)
                if s.index == stages - 1:
                    break
                c = s.boundaries[s.index]
                if cut == "block":
                    assert torch.equal(x[0], ref[c])
                else:  # the residual after block c's attention half, and its GeGLU product
                    layer = ours.model.layers[c]
                    assert torch.equal(x[1], _attn_half(ours, layer, ref[c]))
                    h = layer.pre_feedforward_layernorm(x[1])
                    assert torch.equal(x[0], layer.mlp.act_fn(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
            assert torch.equal(x[0], logits)


def _attn_half(model, layer, h):
    """Block ``layer``'s residual after attention, by Hugging Face's modules (the anchor's path)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    pos = torch.arange(h.shape[1]).unsqueeze(0)
    kw = dict(config=model.config, inputs_embeds=h, attention_mask=None, past_key_values=None, position_ids=pos)
    kind = layer.self_attn.layer_type
    mask = (create_causal_mask if kind == "full_attention" else create_sliding_window_causal_mask)(**kw)
    pe = model.model.rotary_emb(h, pos, kind)
    a, _ = layer.self_attn(hidden_states=layer.input_layernorm(h), position_embeddings=pe,
                           attention_mask=mask, position_ids=pos, past_key_values=None)
    return h + layer.post_attention_layernorm(a)


def test_label_words_that_are_not_one_token_are_named():
    tok = pre.tokenizer("minilm-l6")  # any tokenizer shows the rule; MiniLM's is installed everywhere
    assert len(label_token_ids(tok, PromptTemplate(" It was", ("terrible", "great")))) == 2
    with pytest.raises(PromptError, match="'unfathomably' -> [0-9]+ tokens"):
        label_token_ids(tok, PromptTemplate(" It was", ("great", "unfathomably")))


def test_prompted_rows_keep_the_template_whole_and_pad_on_the_right():
    tok = pre.tokenizer("minilm-l6")
    prompt = PromptTemplate(" it was", ("terrible", "great"))
    suffix = tok(prompt.suffix, add_special_tokens=False)["input_ids"]
    long, short = "word " * 100, "fine"
    rows = encode_prompted(tok, [long, short], prompt, 16)
    assert all(len(r) == 16 for r in rows)
    assert rows[0][-len(suffix):] == suffix  # the text is cut, never the template
    kept = [t for t in rows[1] if t != tok.pad_token_id]
    assert kept == tok(short, add_special_tokens=False)["input_ids"] + suffix
    assert rows[1][len(kept):] == [tok.pad_token_id] * (16 - len(kept))
    with pytest.raises(PromptError, match="seq_len 2 leaves no room"):
        encode_prompted(tok, [short], prompt, 2)


def test_a_damaged_converted_checkpoint_is_refused_by_name(tmp_path, monkeypatch):
    src = pre.SOURCES[MODEL]
    (tmp_path / src.weights_file).write_bytes(b"truncated")

    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(pre, "_find_spec", lambda m: Spec())
    monkeypatch.setattr(gemma, "convert", lambda: tmp_path)
    pre._verified.cache_clear()
    try:
        with pytest.raises(pre.PretrainedUnavailableError) as e:
            pre.checkpoint_dir(MODEL)
        assert str(tmp_path / src.weights_file) in str(e.value) and src.sha256 in str(e.value)
        assert f"delete {tmp_path}" in str(e.value)
        monkeypatch.setattr(pre, "_find_spec", lambda m: None)
        pre._verified.cache_clear()
        with pytest.raises(pre.PretrainedUnavailableError, match="COMMBENCH_GEMMA=1 bash scripts/install.sh"):
            pre.checkpoint_dir(MODEL)
    finally:
        pre._verified.cache_clear()


# --------------------------------------------------------------------------- the real checkpoint

real = pytest.mark.skipif(not gemma.installed(), reason="opt-in: COMMBENCH_GEMMA=1 bash scripts/install.sh")


@functools.cache
def _real():
    return build_model(MODEL, seed=0).eval()


@pytest.mark.slow
@real
def test_real_loaded_tensors_are_the_checkpoints_and_the_head_its_label_rows():
    from safetensors import safe_open

    src = pre.SOURCES[MODEL]
    path = os.path.join(pre.checkpoint_dir(MODEL), src.weights_file)
    assert pre.checkpoint_sha256(path) == src.sha256
    params = dict(_real().named_parameters())
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        for key in keys:
            assert torch.equal(params[key].detach(), f.get_tensor(key)), key
        assert set(params) - keys == {"lm_head.weight"}
        rows = [pre.tokenizer(MODEL)(w, add_special_tokens=False)["input_ids"][0]
                for w in PRESETS[MODEL].prompt.words]
        assert torch.equal(params["lm_head.weight"].detach(), f.get_tensor("model.embed_tokens.weight")[rows])


@pytest.mark.slow
@real
def test_real_split_equals_hugging_face_at_every_boundary():
    from transformers import AutoModelForCausalLM

    from harness.data import get_dataset

    ids, _ = get_dataset("tweets-sentiment").batch(0, batch_size=3, seq_len=32, seed=1, split="val", model=MODEL)
    hf = AutoModelForCausalLM.from_pretrained(pre.checkpoint_dir(MODEL), dtype=torch.float32,
                                              attn_implementation="eager", local_files_only=True).eval()
    model = _real()
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True)
        last = ids.ne(0).sum(1) - 1
        torch.testing.assert_close(model(ids).logits,
                                   ref.logits[torch.arange(3), last][:, _label_rows()],
                                   rtol=1e-4, atol=1e-4)
        for stages in (2, 3, 6, 18):
            x = (ids,)
            for s in split_model(model, stages, "block"):
                x = s(*x, input_ids=ids)
                if s.index < stages - 1:
                    assert torch.equal(x[0], ref.hidden_states[s.boundaries[s.index]])
            assert torch.equal(x[0], model(ids).logits)


def _label_rows():
    return [pre.tokenizer(MODEL)(w, add_special_tokens=False)["input_ids"][0] for w in PRESETS[MODEL].prompt.words]


@pytest.mark.slow
@real
def test_real_prompted_rows_decode_to_text_and_template():
    from harness.data import get_dataset

    tok = pre.tokenizer(MODEL)
    ds = get_dataset("tweets-sentiment")
    ids, _ = ds.encoded("val", MODEL, 64)
    texts, _ = ds.texts("val")
    checked = 0
    for row, text in zip(ids[:100], texts[:100], strict=True):
        kept = row[row.ne(tok.pad_token_id)].tolist()
        if len(tok(text, add_special_tokens=False)["input_ids"]) + 3 > 64:
            continue  # cut rows keep the template, checked above
        assert kept[0] == tok.bos_token_id
        assert tok.decode(kept[1:]) == text + PRESETS[MODEL].prompt.suffix
        checked += 1
    assert checked > 80


@pytest.mark.slow
@real
def test_real_sparq_bytes_equal_the_closed_form():
    from checks.test_pretrained import sparq_dense_bytes_match_the_closed_form

    sparq_dense_bytes_match_the_closed_form(MODEL)
