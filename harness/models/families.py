"""Where each Hugging Face model family keeps its parts: one description per family.

A :class:`FamilySpec` names, as ``named_modules()`` paths, the embedding, the
stack of blocks, the final norm and the LM head of a causal LM (for an encoder
classifier: the pooler and the classifier), and, inside one
block, its attention half (norm, attention, output projection) and its FFN half
(norm, input projections, activation, output projection).  The model zoo
(initialisation, the stage adapters) and the algorithms that constrain or hook
particular tensors (Protocol Models) read these names from here instead of
spelling them out themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FAMILIES", "FAMILY_SPECS", "FamilySpec", "family_spec"]


@dataclass(frozen=True)
class FamilySpec:
    """Module paths of one family (model-level ones from the ``*ForCausalLM`` root,
    block-level ones from a block)."""

    name: str
    # model level
    layers: str  # the ModuleList of transformer blocks
    token_embedding: str
    position_embedding: str | None  # learned absolute positions; None with RoPE
    final_norm: str
    lm_head: str
    rotary: str | None  # the parameter-free rotary embedding every stage needs
    # block level: the attention half ...
    attn_norm: str
    attn: str
    attn_out: str  # attention output projection (writes into the residual stream)
    # ... and the FFN half
    ffn_norm: str
    ffn_in: tuple[str, ...]  # projections before the activation (SwiGLU: gate, up)
    ffn_act: str
    ffn_out: str  # FFN down projection (writes into the residual stream)
    ffn_width: str  # config attribute holding the FFN width
    out_axis: int  # model-width axis of a projection weight: 0 for nn.Linear, 1 for GPT-2's Conv1D
    # the 16-bit float the family's activations fit in: bf16 where the residual stream outgrows
    # fp16's 65,504 (Gemma-3, trained and served in bf16)
    half_dtype: str = "fp16"

    def block(self, i: int) -> str:
        """Path of block ``i``."""
        return f"{self.layers}.{i}"

    @property
    def residual_out(self) -> tuple[str, str]:
        """The two projections of a block that write into the residual stream."""
        return (self.attn_out, self.ffn_out)


FAMILY_SPECS: dict[str, FamilySpec] = {
    "opt": FamilySpec(
        "opt", layers="model.decoder.layers", token_embedding="model.decoder.embed_tokens",
        position_embedding="model.decoder.embed_positions",
        final_norm="model.decoder.final_layer_norm", lm_head="lm_head", rotary=None,
        attn_norm="self_attn_layer_norm", attn="self_attn", attn_out="self_attn.out_proj",
        ffn_norm="final_layer_norm", ffn_in=("fc1",), ffn_act="activation_fn", ffn_out="fc2",
        ffn_width="ffn_dim", out_axis=0),
    "gpt2": FamilySpec(
        "gpt2", layers="transformer.h", token_embedding="transformer.wte",
        position_embedding="transformer.wpe", final_norm="transformer.ln_f", lm_head="lm_head",
        rotary=None, attn_norm="ln_1", attn="attn", attn_out="attn.c_proj", ffn_norm="ln_2",
        ffn_in=("mlp.c_fc",), ffn_act="mlp.act", ffn_out="mlp.c_proj", ffn_width="n_inner",
        out_axis=1),
    "llama": FamilySpec(
        "llama", layers="model.layers", token_embedding="model.embed_tokens",
        position_embedding=None, final_norm="model.norm", lm_head="lm_head",
        rotary="model.rotary_emb", attn_norm="input_layernorm", attn="self_attn",
        attn_out="self_attn.o_proj", ffn_norm="post_attention_layernorm",
        ffn_in=("mlp.gate_proj", "mlp.up_proj"), ffn_act="mlp.act_fn", ffn_out="mlp.down_proj",
        ffn_width="intermediate_size", out_axis=0),
    # A post-LN encoder (BERT, MiniLM): no norm before the attention; each half's LayerNorm
    # follows its residual add (``attention.output`` and ``output``).  The root is a
    # ``*ForSequenceClassification``: the "head" is the CLS pooler and the classifier.
    "bert": FamilySpec(
        "bert", layers="bert.encoder.layer", token_embedding="bert.embeddings.word_embeddings",
        position_embedding="bert.embeddings.position_embeddings",
        final_norm="bert.pooler", lm_head="classifier", rotary=None,
        attn_norm="attention.output.LayerNorm", attn="attention", attn_out="attention.output.dense",
        ffn_norm="output.LayerNorm", ffn_in=("intermediate.dense",),
        ffn_act="intermediate.intermediate_act_fn", ffn_out="output.dense",
        ffn_width="intermediate_size", out_axis=0),
    # Gemma-3 (text): sandwich norms (each half's output is normed again before its residual add),
    # a scaled embedding, GeGLU, sliding-window and full attention with two rotary bases.  The
    # root is the prompt scorer (:func:`.weights.prompt_scorer_class`): ``lm_head`` holds only the
    # label words' rows.
    "gemma3_text": FamilySpec(
        "gemma3_text", layers="model.layers", token_embedding="model.embed_tokens",
        position_embedding=None, final_norm="model.norm", lm_head="lm_head",
        rotary="model.rotary_emb", attn_norm="input_layernorm", attn="self_attn",
        attn_out="self_attn.o_proj", ffn_norm="pre_feedforward_layernorm",
        ffn_in=("mlp.gate_proj", "mlp.up_proj"), ffn_act="mlp.act_fn", ffn_out="mlp.down_proj",
        ffn_width="intermediate_size", out_axis=0, half_dtype="bf16"),
}

FAMILIES = tuple(FAMILY_SPECS)


def family_spec(family: str) -> FamilySpec:
    """The description of ``family`` (``"opt"``, ``"gpt2"``, ``"llama"``, ``"bert"``)."""
    try:
        return FAMILY_SPECS[family]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported model family {family!r}; supported: {', '.join(FAMILIES)}") from None


def _family_of(config: Any) -> str:
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise ValueError(f"unsupported model type {mt!r}; supported: {', '.join(FAMILIES)}")
    return mt
