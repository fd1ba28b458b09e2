"""Family adapters: how to run the parts of each family's model, stage by stage.

Each adapter finds a family's embedding, blocks and head through its
:class:`~.families.FamilySpec`, and knows how to run the two halves of a block
that is cut after its FFN activation.  The halves repeat the ``transformers``
layer code operation for operation (same modules, same order), so the split
computation is bit-identical to the unsplit one.  Bit-exactness needs the same
kernels on both sides: the models use the ``"eager"`` attention implementation
and the stage code calls the same attention modules as the full model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .families import FamilySpec, family_spec

if TYPE_CHECKING:
    from .stages import Stage


def _at(root: Any, path: str) -> Any:
    """The attribute at dotted ``path`` (None where the family leaves a part out)."""
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _key(path: str) -> str:
    """A part's key in the stage's module dicts: its own attribute name."""
    return path.rpartition(".")[2]


class _Family:
    """Runs one family's parts; the parts are found through ``spec``."""

    def __init__(self, spec: FamilySpec):
        self.spec = spec
        self.name = spec.name

    def layers(self, model: Any) -> nn.ModuleList:
        return _at(model, self.spec.layers)

    def embed_modules(self, model: Any) -> dict[str, nn.Module]:
        s = self.spec
        out = {_key(s.token_embedding): _at(model, s.token_embedding)}
        if s.position_embedding is not None:
            out[_key(s.position_embedding)] = _at(model, s.position_embedding)
        return out

    def head_modules(self, model: Any) -> dict[str, nn.Module]:
        s = self.spec
        return {_key(s.final_norm): _at(model, s.final_norm), _key(s.lm_head): _at(model, s.lm_head)}

    def shared_modules(self, model: Any) -> dict[str, nn.Module]:
        """Parameter-free modules every stage needs (rotary embedding)."""
        s = self.spec
        return {} if s.rotary is None else {_key(s.rotary): _at(model, s.rotary)}

    def pre_modules(self, layer: nn.Module) -> dict[str, nn.Module]:
        """The block up to its FFN activation (the attention half and the FFN input)."""
        s = self.spec
        out = {_key(p): _at(layer, p) for p in (s.attn_norm, s.attn, s.ffn_norm, *s.ffn_in)}
        out["act"] = _at(layer, s.ffn_act)
        return out

    def post_modules(self, layer: nn.Module) -> dict[str, nn.Module]:
        """The rest of the block: the FFN output projection."""
        return {_key(self.spec.ffn_out): _at(layer, self.spec.ffn_out)}

    def ffn_width(self, config: Any) -> int:
        return getattr(config, self.spec.ffn_width)

    def embed(self, st: Stage, ids: Tensor) -> Tensor:
        raise NotImplementedError

    # Whether a stage needs the micro-batch's token ids besides its boundary inputs: a padded
    # family builds its attention mask from them on every stage (each rank reads the batch
    # itself, as a pipeline's stages read their labels; nothing crosses the wire for it).
    needs_input_ids = False

    def context(self, st: Stage, ref: Tensor, input_ids: Tensor | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def block(self, layer: nn.Module, h: Tensor, ctx: dict[str, Any]) -> Tensor:
        raise NotImplementedError

    def pre(self, st: Stage, m: nn.ModuleDict, h: Tensor, ctx: dict[str, Any]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def post(self, st: Stage, m: nn.ModuleDict, a: Tensor, r: Tensor) -> Tensor:
        raise NotImplementedError

    def head(self, st: Stage, h: Tensor, input_ids: Tensor | None = None) -> Tensor:
        raise NotImplementedError

    # Whether the head returns class logits [B, num_labels] rather than next-token logits.
    classifies = False


def _causal_mask(config: Any, ref: Tensor, position_ids: Tensor | None) -> Any:
    from transformers.masking_utils import create_causal_mask

    kwargs = {} if position_ids is None else {"position_ids": position_ids}
    return create_causal_mask(config=config, inputs_embeds=ref, attention_mask=None,
                              past_key_values=None, **kwargs)


class _OPT(_Family):
    # OPT may project the embedding to and from a narrower width, may have no final
    # norm (post-LN), and a post-LN block norms after its FFN residual add.

    def embed_modules(self, model):
        out = super().embed_modules(model)
        d = model.model.decoder
        if d.project_in is not None:
            out["project_in"] = d.project_in
        return out

    def head_modules(self, model):
        s, d = self.spec, model.model.decoder
        out: dict[str, nn.Module] = {}
        norm = _at(model, s.final_norm)
        if norm is not None:
            out[_key(s.final_norm)] = norm
        if d.project_out is not None:
            out["project_out"] = d.project_out
        out[_key(s.lm_head)] = _at(model, s.lm_head)
        return out

    def post_modules(self, layer):
        out = super().post_modules(layer)
        if not layer.do_layer_norm_before:
            out[_key(self.spec.ffn_norm)] = _at(layer, self.spec.ffn_norm)
        return out

    def embed(self, st, ids):
        m = st.embed
        ids = ids.view(-1, ids.shape[-1])
        inputs_embeds = m["embed_tokens"](ids)
        pos_mask = torch.ones(inputs_embeds.shape[0], inputs_embeds.shape[1], device=inputs_embeds.device)
        position_ids = torch.cumsum(pos_mask, dim=1)
        position_ids = (position_ids * pos_mask - 1).long()
        pos_embeds = m["embed_positions"](pos_mask, 0, position_ids=position_ids)
        if "project_in" in m:
            inputs_embeds = m["project_in"](inputs_embeds)
        return inputs_embeds + pos_embeds.to(inputs_embeds.device)

    def context(self, st, ref, input_ids=None):
        return {"mask": _causal_mask(st.config, ref, None)}

    def block(self, layer, h, ctx):
        return layer(h, attention_mask=ctx["mask"], position_ids=None, past_key_values=None,
                     use_cache=False)

    def pre(self, st, m, h, ctx):
        ln_before = st.config.do_layer_norm_before
        p = st.config.dropout
        residual = h
        if ln_before:
            h = m["self_attn_layer_norm"](h)
        h, _ = m["self_attn"](hidden_states=h, past_key_values=None, position_ids=None,
                              attention_mask=ctx["mask"])
        h = nn.functional.dropout(h, p=p, training=st.training)
        h = residual + h
        if not ln_before:
            h = m["self_attn_layer_norm"](h)
        shape = h.shape
        h = h.reshape(-1, h.size(-1))
        residual = h
        if ln_before:
            h = m["final_layer_norm"](h)
        h = m["fc1"](h)
        a = m["act"](h)
        return a.view(*shape[:-1], a.shape[-1]), residual.view(shape)

    def post(self, st, m, a, r):
        shape = r.shape
        residual = r.reshape(-1, r.size(-1))
        h = m["fc2"](a.reshape(-1, a.size(-1)))
        h = nn.functional.dropout(h, p=st.config.dropout, training=st.training)
        h = (residual + h).view(shape)
        if not st.config.do_layer_norm_before:
            h = m["final_layer_norm"](h)
        return h

    def head(self, st, h, input_ids=None):
        m = st.head
        if "final_layer_norm" in m:
            h = m["final_layer_norm"](h)
        if "project_out" in m:
            h = m["project_out"](h)
        return m["lm_head"](h).contiguous()


class _GPT2(_Family):
    # GPT-2 runs the embedding and the FFN output through dropout modules (p = 0 in
    # our presets, but the module calls are part of the computation we repeat).

    def embed_modules(self, model):
        return {**super().embed_modules(model), "drop": model.transformer.drop}

    def post_modules(self, layer):
        return {**super().post_modules(layer), "dropout": layer.mlp.dropout}

    def ffn_width(self, config):
        return config.n_inner if config.n_inner is not None else 4 * config.hidden_size

    @staticmethod
    def _positions(ref):
        return torch.arange(ref.shape[1], device=ref.device).unsqueeze(0)

    def embed(self, st, ids):
        m = st.embed
        ids = ids.view(-1, ids.shape[-1])
        inputs_embeds = m["wte"](ids)
        position_ids = self._positions(inputs_embeds)
        h = inputs_embeds + m["wpe"](position_ids).to(inputs_embeds.device)
        return m["drop"](h)

    def context(self, st, ref, input_ids=None):
        position_ids = self._positions(ref)
        return {"mask": _causal_mask(st.config, ref, position_ids), "position_ids": position_ids}

    def block(self, layer, h, ctx):
        return layer(h, None, ctx["mask"], None, encoder_attention_mask=None, use_cache=False,
                     position_ids=ctx["position_ids"])

    def pre(self, st, m, h, ctx):
        residual = h
        h = m["ln_1"](h)
        attn_output, _ = m["attn"](h, past_key_values=None, attention_mask=ctx["mask"],
                                   use_cache=False, position_ids=ctx["position_ids"])
        h = attn_output + residual
        residual = h
        h = m["ln_2"](h)
        a = m["act"](m["c_fc"](h))
        return a, residual

    def post(self, st, m, a, r):
        return r + m["dropout"](m["c_proj"](a))

    def head(self, st, h, input_ids=None):
        m = st.head
        return m["lm_head"](m["ln_f"](h))


class _Llama(_Family):
    def embed(self, st, ids):
        return st.embed["embed_tokens"](ids)

    def context(self, st, ref, input_ids=None):
        position_ids = torch.arange(ref.shape[1], device=ref.device).unsqueeze(0)
        return {"mask": _causal_mask(st.config, ref, position_ids), "position_ids": position_ids,
                "position_embeddings": st.shared["rotary_emb"](ref, position_ids=position_ids)}

    def block(self, layer, h, ctx):
        return layer(h, attention_mask=ctx["mask"], position_embeddings=ctx["position_embeddings"],
                     position_ids=ctx["position_ids"], past_key_values=None, use_cache=False)

    def pre(self, st, m, h, ctx):
        residual = h
        h = m["input_layernorm"](h)
        h, _ = m["self_attn"](hidden_states=h, attention_mask=ctx["mask"],
                              position_ids=ctx["position_ids"], past_key_values=None,
                              use_cache=False, position_embeddings=ctx["position_embeddings"])
        h = residual + h
        residual = h
        x = m["post_attention_layernorm"](h)
        a = m["act"](m["gate_proj"](x)) * m["up_proj"](x)
        return a, residual

    def post(self, st, m, a, r):
        return r + m["down_proj"](a)

    def head(self, st, h, input_ids=None):
        m = st.head
        return m["lm_head"](m["norm"](h))


class _Bert(_Family):
    # A post-LN encoder classifier (BertForSequenceClassification): the embedding module
    # (word + position + token type, LayerNorm), blocks with a bidirectional padding mask, and
    # the CLS pooler + classifier as the head.  Cut after the FFN activation, the residual that
    # crosses is the attention half's output (the input of ``output``'s add + LayerNorm).
    needs_input_ids = True
    classifies = True

    def embed_modules(self, model):
        return {"embeddings": model.bert.embeddings}

    def head_modules(self, model):
        return {"pooler": model.bert.pooler, "dropout": model.dropout, "classifier": model.classifier}

    def pre_modules(self, layer):
        return {"attention": layer.attention, "intermediate": layer.intermediate}

    def post_modules(self, layer):
        return {"output": layer.output}

    def embed(self, st, ids):
        return st.embed["embeddings"](input_ids=ids)

    def context(self, st, ref, input_ids=None):
        from transformers.masking_utils import create_bidirectional_mask

        if input_ids is None:
            raise ValueError(f"stage {st.index} of a padded encoder needs the micro-batch's token ids "
                             "(input_ids=...) to build its attention mask")
        mask = input_ids.ne(st.config.pad_token_id).long()
        return {"mask": create_bidirectional_mask(config=st.config, inputs_embeds=ref, attention_mask=mask)}

    def block(self, layer, h, ctx):
        return layer(h, ctx["mask"])

    def pre(self, st, m, h, ctx):
        r, _ = m["attention"](h, ctx["mask"])
        return m["intermediate"](r), r

    def post(self, st, m, a, r):
        return m["output"](a, r)

    def head(self, st, h, input_ids=None):
        m = st.head
        return m["classifier"](m["dropout"](m["pooler"](h)))


def last_token_index(input_ids: Tensor, pad_token_id: int) -> Tensor:
    """Position of each row's last real token (rows are right-padded with ``pad_token_id``)."""
    return input_ids.ne(pad_token_id).sum(dim=1).sub(1).clamp(min=0)


class _Gemma3(_Family):
    # The prompt scorer (:func:`.weights.prompt_scorer_class`): Gemma3TextModel's layer loop, then
    # the final norm and the label words' rows of the LM head at each row's last real token
    # (every stage past the first reads the micro-batch's ids for that, like BERT's mask).
    needs_input_ids = True
    classifies = True

    def embed(self, st, ids):
        return st.embed["embed_tokens"](ids)

    def context(self, st, ref, input_ids=None):
        from transformers.masking_utils import create_sliding_window_causal_mask

        position_ids = torch.arange(ref.shape[1], device=ref.device).unsqueeze(0)
        kwargs = dict(config=st.config, inputs_embeds=ref, attention_mask=None, past_key_values=None,
                      position_ids=position_ids)
        masks = {"full_attention": _causal_mask(st.config, ref, position_ids),
                 "sliding_attention": create_sliding_window_causal_mask(**kwargs)}
        rotary = st.shared["rotary_emb"]
        return {"position_ids": position_ids, "masks": masks,
                "position_embeddings": {t: rotary(ref, position_ids, t) for t in set(st.config.layer_types)}}

    def block(self, layer, h, ctx):
        kind = layer.self_attn.layer_type
        return layer(h, attention_mask=ctx["masks"][kind], position_embeddings=ctx["position_embeddings"][kind],
                     position_ids=ctx["position_ids"], past_key_values=None)

    def pre(self, st, m, h, ctx):
        kind = m["self_attn"].layer_type
        residual = h
        h = m["input_layernorm"](h)
        h, _ = m["self_attn"](hidden_states=h, position_embeddings=ctx["position_embeddings"][kind],
                              attention_mask=ctx["masks"][kind], position_ids=ctx["position_ids"],
                              past_key_values=None)
        h = m["post_attention_layernorm"](h)
        h = residual + h
        residual = h
        x = m["pre_feedforward_layernorm"](h)
        a = m["act"](m["gate_proj"](x)) * m["up_proj"](x)
        return a, residual

    def pre_modules(self, layer):
        return {**super().pre_modules(layer), "post_attention_layernorm": layer.post_attention_layernorm}

    def post_modules(self, layer):
        return {**super().post_modules(layer), "post_feedforward_layernorm": layer.post_feedforward_layernorm}

    def post(self, st, m, a, r):
        return r + m["post_feedforward_layernorm"](m["down_proj"](a))

    def head(self, st, h, input_ids=None):
        if input_ids is None:
            raise ValueError("the prompt scorer's head needs the micro-batch's token ids (input_ids=...)")
        m = st.head
        h = m["norm"](h)
        rows = torch.arange(h.shape[0], device=h.device)
        return m["lm_head"](h[rows, last_token_index(input_ids, st.config.pad_token_id)])


_FAMILIES: dict[str, _Family] = {
    name: cls(family_spec(name))
    for name, cls in (("opt", _OPT), ("gpt2", _GPT2), ("llama", _Llama), ("bert", _Bert),
                      ("gemma3_text", _Gemma3))}
