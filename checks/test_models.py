"""Models: presets, deterministic construction, and exact pipeline splitting.

The headline property: chaining the stages of a split model reproduces
``model(input_ids).logits`` bit for bit, and a pipeline-style backward (each
boundary tensor detached, gradients passed back stage by stage) reproduces the
parameter gradients of the unsplit model bit for bit, in float32 and float64,
for OPT, GPT-2 and Llama, cut between blocks or right after an FFN activation.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import models
from harness.models import (
    PRESETS,
    ModelPreset,
    build_model,
    build_stage,
    default_boundaries,
    lm_loss,
    max_stages,
    model_info,
    split_model,
)

TINY = ("tiny-opt", "tiny-gpt2", "tiny-llama")
CUTS = ("block", "ffn_act")
DTYPES = (torch.float32, torch.float64)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny tensors: intra-op threads only add overhead, and on a loaded 2-core runner
    # they make these checks 10x slower.  Exactness does not depend on it (both sides
    # of every comparison run with the same setting).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def _cached_model(name: str, seed: int = 0) -> torch.nn.Module:
    return build_model(name, seed=seed)


def _tokens(seed: int, batch: int, seq_len: int, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
    labels = torch.randint(0, vocab, (batch, seq_len), generator=g)
    return ids, labels


def _chain(stages, ids):
    x = (ids,)
    for s in stages:
        x = s(*x)
    return x[0]


def _pipeline_backward(stages, ids, labels):
    """Forward stage by stage with detached boundaries, then backward stage by stage."""
    saved = []
    x = (ids,)
    for s in stages:
        inputs = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in x)
        out = s(*inputs)
        assert len(out) == len(s.output_names)
        saved.append((inputs, out))
        x = out
    loss = lm_loss(x[0], labels)
    grads = None
    for k in reversed(range(len(stages))):
        inputs, out = saved[k]
        if k == len(stages) - 1:
            loss.backward()
        else:
            torch.autograd.backward(out, grads)
        grads = tuple(t.grad for t in inputs) if k > 0 else None
        if k > 0:
            assert all(g is not None for g in grads)
    return x[0], loss


def _reference(model, ids, labels):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    loss = lm_loss(logits, labels)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return logits.detach(), loss.detach(), grads


def _assert_same_as_unsplit(model, stages, ids, labels, ref):
    ref_logits, ref_loss, ref_grads = ref
    with torch.no_grad():
        assert torch.equal(_chain(stages, ids), ref_logits)
    model.zero_grad(set_to_none=True)
    logits, loss = _pipeline_backward(stages, ids, labels)
    assert logits.dtype == ref_logits.dtype
    assert torch.equal(logits.detach(), ref_logits)
    assert torch.equal(loss.detach(), ref_loss)
    for (name, p), g in zip(model.named_parameters(), ref_grads, strict=True):
        assert p.grad is not None, name
        assert torch.equal(p.grad, g), name
    model.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", TINY)
@settings(max_examples=6)
@given(seed=seeds, data_seed=seeds, batch=st.integers(1, 3), seq_len=st.integers(1, 12))
def test_chained_stages_bit_identical(name, dtype, seed, data_seed, batch, seq_len):
    model = build_model(name, seed=seed, dtype=dtype)
    ids, labels = _tokens(data_seed, batch, seq_len)
    ref = _reference(model, ids, labels)
    for cut in CUTS:
        for m in (1, 2, 4):
            stages = split_model(model, m, cut)
            assert len(stages) == m
            _assert_same_as_unsplit(model, stages, ids, labels, ref)


@st.composite
def _splits(draw, num_blocks: int = 4):
    cut = draw(st.sampled_from(CUTS))
    m = draw(st.integers(1, max_stages(num_blocks, cut)))
    lo = 1 if cut == "block" else 0
    cuts = draw(st.lists(st.integers(lo, num_blocks - 1), min_size=m - 1, max_size=m - 1,
                         unique=True))
    return cut, m, sorted(cuts)


@settings(max_examples=20)
@given(name=st.sampled_from(TINY), split=_splits(), seed=seeds, data_seed=seeds,
       dtype=st.sampled_from(DTYPES))
def test_any_boundaries_bit_identical(name, split, seed, data_seed, dtype):
    cut, m, cuts = split
    model = build_model(name, seed=seed, dtype=dtype)
    ids, labels = _tokens(data_seed, 2, 7)
    stages = split_model(model, m, cut, boundaries=cuts)
    assert all(s.boundaries == tuple(cuts) for s in stages)
    _assert_same_as_unsplit(model, stages, ids, labels, _reference(model, ids, labels))


# --------------------------------------------------------------------------- global indices


@settings(max_examples=25)
@given(name=st.sampled_from(TINY), split=_splits())
def test_global_indices_partition_the_model(name, split):
    cut, m, cuts = split
    model = _cached_model(name)
    full = list(model.named_parameters())
    stages = split_model(model, m, cut, boundaries=cuts)
    seen: list[int] = []
    for s in stages:
        entries = s.global_named_parameters()
        assert [i for i, _, _ in entries] == sorted(i for i, _, _ in entries)
        for i, n, p in entries:
            assert full[i][0] == n
            assert full[i][1] is p  # shared with the unsplit model
        assert len(entries) == len(list(s.parameters()))
        seen += [i for i, _, _ in entries]
    assert sorted(seen) == list(range(len(full)))  # disjoint and complete


def test_embeddings_untied_and_first_last_share_nothing():
    for name in PRESETS:
        assert PRESETS[name].hf_config().tie_word_embeddings is False
    for name in TINY:
        model = _cached_model(name)
        assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
        first, last = split_model(model, 2)
        assert not {id(p) for p in first.parameters()} & {id(p) for p in last.parameters()}


def test_ffn_act_cut_sits_after_the_activation():
    model = _cached_model("tiny-opt")
    ids, _ = _tokens(0, 2, 9)
    first, second = split_model(model, 2, "ffn_act", boundaries=[2])
    assert first.output_names == ("ffn_act", "residual") == second.input_names
    act, residual = first(ids)
    cfg = model.config
    assert act.shape == (2, 9, cfg.ffn_dim) and residual.shape == (2, 9, cfg.hidden_size)
    assert (act >= 0).all() and (act == 0).any()  # ReLU output: non-negative, sparse
    layer = model.model.decoder.layers[2]
    with torch.no_grad():
        expected = torch.relu(layer.fc1(layer.final_layer_norm(residual)))
    assert torch.equal(act, expected)
    names0 = {n for _, n, _ in first.global_named_parameters()}
    names1 = {n for _, n, _ in second.global_named_parameters()}
    assert "model.decoder.layers.2.fc1.weight" in names0 and "model.decoder.layers.2.fc2.weight" in names1
    assert not any(n.startswith("model.decoder.layers.2.fc2") for n in names0)
    assert not any(n.startswith("model.decoder.layers.2.fc1") for n in names1)


def test_ffn_act_cut_llama_is_the_swiglu_product():
    model = _cached_model("tiny-llama")
    ids, _ = _tokens(1, 2, 5)
    first, _ = split_model(model, 2, "ffn_act", boundaries=[1])
    act, residual = first(ids)
    mlp = model.model.layers[1].mlp
    x = model.model.layers[1].post_attention_layernorm(residual)
    with torch.no_grad():
        assert torch.equal(act, torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert act.shape[-1] == model.config.intermediate_size


@pytest.mark.parametrize("name", TINY)
def test_stage_specs_match_outputs(name):
    model = _cached_model(name)
    ids, _ = _tokens(2, 3, 6)
    for cut in CUTS:
        stages = split_model(model, 3, cut)
        x = (ids,)
        for s in stages:
            assert tuple(sp.shape for sp in s.input_specs(3, 6)) == tuple(t.shape for t in x)
            x = s(*x)
            specs = s.output_specs(3, 6)
            assert tuple(sp.name for sp in specs) == s.output_names
            assert tuple(sp.shape for sp in specs) == tuple(t.shape for t in x)
            assert all(sp.dtype == t.dtype for sp, t in zip(specs, x, strict=True))
            assert s.boundary_shapes(3, 6) == {sp.name: sp.shape for sp in specs}
        assert stages[0].input_names == ("input_ids",)
        assert stages[-1].output_names == ("logits",)


# --------------------------------------------------------------------------- construction


@settings(max_examples=15)
@given(name=st.sampled_from(TINY), split=_splits(), seed=seeds, dtype=st.sampled_from(DTYPES),
       data=st.data())
def test_build_stage_equals_split_of_build_model(name, split, seed, dtype, data):
    cut, m, cuts = split
    k = data.draw(st.integers(0, m - 1), label="stage_index")
    model = build_model(name, seed=seed, dtype=dtype)
    ref = split_model(model, m, cut, boundaries=cuts)[k]
    stage = build_stage(name, seed=seed, num_stages=m, stage_index=k, cut=cut, boundaries=cuts,
                        dtype=dtype)
    a, b = ref.global_named_parameters(), stage.global_named_parameters()
    assert [(i, n) for i, n, _ in a] == [(i, n) for i, n, _ in b]
    for (_, n, p), (_, _, q) in zip(a, b, strict=True):
        assert q.dtype == dtype and q.device.type == "cpu", n
        assert torch.equal(p, q), n
    for t in list(stage.parameters()) + list(stage.buffers()):
        assert t.device.type == "cpu"  # nothing left on the meta device
    total = sum(p.numel() for p in model.parameters())
    held = sum(p.numel() for p in stage.parameters())
    assert held == sum(p.numel() for p in ref.parameters())
    assert m == 1 or held < total
    # and it computes what the split stage computes
    x = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(seed))
    inputs = (x,)
    stages = split_model(model, m, cut, boundaries=cuts)
    with torch.no_grad():
        for s in stages[:k]:
            inputs = s(*inputs)
        assert all(torch.equal(u, v) for u, v in zip(stages[k](*inputs), stage(*inputs), strict=True))


def test_stages_built_concurrently_in_threads_are_identical():
    # the threads backend builds every rank's stage at the same time in one process
    from concurrent.futures import ThreadPoolExecutor

    for name in TINY:
        with ThreadPoolExecutor(4) as pool:
            built = list(pool.map(lambda k, n=name: build_stage(
                n, seed=3, num_stages=4, stage_index=k, cut="ffn_act", dtype=torch.float64), range(4)))
        ref = split_model(build_model(name, seed=3, dtype=torch.float64), 4, "ffn_act")
        for a, b in zip(built, ref, strict=True):
            for (i, _, p), (j, _, q) in zip(a.global_named_parameters(), b.global_named_parameters(),
                                            strict=True):
                assert i == j and p.dtype == q.dtype and torch.equal(p, q)
    assert torch.get_default_dtype() == torch.float32


@settings(max_examples=5)
@given(name=st.sampled_from(TINY), seed=seeds, other=seeds)
def test_build_model_is_a_pure_function_of_seed(name, seed, other):
    a = build_model(name, seed=seed)
    b = build_model(name, seed=seed)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    if other != seed:
        c = build_model(name, seed=other)
        for (n, p), (_, q) in zip(a.named_parameters(), c.named_parameters(), strict=True):
            if p.dim() >= 2:
                assert not torch.equal(p, q), n
    # float64 is the exact upcast of float32, and each value is init_value(seed, index, ...)
    d = build_model(name, seed=seed, dtype=torch.float64)
    for i, ((n, p), (_, q)) in enumerate(zip(a.named_parameters(), d.named_parameters(), strict=True)):
        assert q.dtype == torch.float64 and torch.equal(p.double(), q), n
        assert torch.equal(p, models.init_value(seed, i, n, p.shape, PRESETS[name].num_blocks)), n


def test_init_scheme():
    model = _cached_model("tiny-gpt2", 3)
    for n, p in model.named_parameters():
        if p.dim() == 1:
            expected = torch.zeros_like(p) if n.endswith("bias") else torch.ones_like(p)
            assert torch.equal(p, expected), n
        else:
            std = float(p.detach().std())
            target = 0.02 / (8**0.5) if n.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")) else 0.02
            assert abs(std - target) < 0.25 * target, n


def test_weights_roundtrip_and_untie(tmp_path):
    from transformers import AutoModelForCausalLM

    src = build_model("tiny-opt", seed=7)
    src.save_pretrained(tmp_path / "untied")
    loaded = build_model("tiny-opt", seed=0, weights=str(tmp_path / "untied"), dtype=torch.float64)
    for (n, p), (m, q) in zip(src.named_parameters(), loaded.named_parameters(), strict=True):
        assert n == m and torch.equal(p.double(), q), n
    cfg = PRESETS["tiny-llama"].hf_config()
    cfg.tie_word_embeddings = True
    tied = AutoModelForCausalLM.from_config(cfg)
    tied.save_pretrained(tmp_path / "tied")
    model = build_model("tiny-llama", seed=0, weights=str(tmp_path / "tied"))
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is not emb and torch.equal(head, emb)
    assert len(list(model.parameters())) == len(list(_cached_model("tiny-llama").parameters()))
    ids, labels = _tokens(4, 2, 6)
    stages = split_model(model, 2, "ffn_act")
    _assert_same_as_unsplit(model, stages, ids, labels, _reference(model, ids, labels))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_model("tiny-opt", seed=0, weights=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="llama"):
        build_model("tiny-opt", seed=0, weights=str(tmp_path / "tied"))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, match", [
    (lambda: build_model("no-such-model", seed=0), "tiny-opt"),
    (lambda: build_stage("nope", seed=0, num_stages=2, stage_index=0), "choose from"),
    (lambda: split_model(_cached_model("tiny-opt"), 0), ">= 1"),
    (lambda: split_model(_cached_model("tiny-opt"), 5), "at most 4"),
    (lambda: split_model(_cached_model("tiny-opt"), 6, "ffn_act"), "at most 5"),
    (lambda: split_model(_cached_model("tiny-opt"), 2, "middle"), "unknown cut"),
    (lambda: split_model(_cached_model("tiny-opt"), 2, boundaries=[0]), "out of range"),
    (lambda: split_model(_cached_model("tiny-opt"), 2, boundaries=[4]), "out of range"),
    (lambda: split_model(_cached_model("tiny-opt"), 2, "ffn_act", boundaries=[4]), "out of range"),
    (lambda: split_model(_cached_model("tiny-opt"), 3, boundaries=[2, 2]), "increasing"),
    (lambda: split_model(_cached_model("tiny-opt"), 3, boundaries=[2]), "need 2 boundaries"),
    (lambda: build_stage("tiny-opt", seed=0, num_stages=2, stage_index=2), "stage_index"),
    (lambda: build_stage("tiny-opt", seed=0, num_stages=9, stage_index=0), "at most 4"),
    (lambda: ModelPreset("bert", 2, 8, 8, 2, 10, 10, "relu"), "family"),
    (lambda: ModelPreset("opt", 2, 10, 8, 3, 10, 10, "relu"), "divisible"),
    (lambda: ModelPreset("opt", 0, 8, 8, 2, 10, 10, "relu"), "num_blocks"),
    (lambda: ModelPreset("opt", 2, 8, 8, 2, 10, 10, "nope"), "activation"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_every_preset_activation_is_one_transformers_knows():
    from transformers.activations import ACT2FN

    from harness.models.presets import ACTIVATIONS

    assert set(ACTIVATIONS) <= set(ACT2FN)


def test_stage_rejects_wrong_number_of_inputs():
    stages = split_model(_cached_model("tiny-gpt2"), 2, "ffn_act")
    with pytest.raises(ValueError, match="takes 2 inputs"):
        stages[1](torch.zeros(1, 2, 32))


# --------------------------------------------------------------------------- helpers


@settings(max_examples=25)
@given(n=st.integers(1, 40), m=st.integers(1, 41), cut=st.sampled_from(CUTS))
def test_default_boundaries_valid_and_balanced(n, m, cut):
    if m > max_stages(n, cut):
        with pytest.raises(ValueError):
            default_boundaries(n, m, cut)
        return
    b = default_boundaries(n, m, cut)
    lo = 1 if cut == "block" else 0
    assert len(b) == m - 1 and all(lo <= c <= n - 1 for c in b)
    assert all(x < y for x, y in itertools.pairwise(b))
    if cut == "block":  # stage sizes differ by at most one block
        sizes = [y - x for x, y in zip([0, *b], [*b, n], strict=True)]
        assert max(sizes) - min(sizes) <= 1


def test_default_ffn_act_split_of_opt125m_is_block_6():
    # SparQ cuts OPT-125M after the activation of "Block 6" (the sixth, 0-based 5).
    assert default_boundaries(12, 2, "ffn_act") == [5]


@settings(max_examples=10)
@given(seed=seeds, dtype=st.sampled_from(DTYPES))
def test_lm_loss_is_mean_next_token_cross_entropy(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 11, generator=g, dtype=dtype)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    manual = -torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).mean()
    assert torch.allclose(lm_loss(logits, labels), manual, rtol=1e-12 if dtype == torch.float64 else 1e-5)
    assert lm_loss(logits.half(), labels).dtype == torch.float32


def test_model_info_counts():
    for name in PRESETS:
        info = model_info(name)
        assert info["num_parameters"] == (info["embedding_parameters"] + info["head_parameters"]
                                          + sum(info["block_parameters"]))
        assert len(info["block_parameters"]) == PRESETS[name].num_blocks
    for name in TINY:
        assert model_info(name)["num_parameters"] == sum(
            p.numel() for p in _cached_model(name).parameters())
    opt = model_info("opt-125m")
    # OPT-125M has 125,239,296 parameters with a tied head; ours adds an untied 50272 x 768 head
    assert opt["num_parameters"] == 125_239_296 + 50272 * 768
    assert opt["ffn_act_width"] == 3072
