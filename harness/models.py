"""Models: presets, deterministic construction, and pipeline splitting.

Every model is a Hugging Face ``transformers`` causal LM built from a config
(nothing is ever downloaded).  Three families are supported: OPT (ReLU FFN,
learned positions), GPT-2 (GELU FFN, learned positions) and Llama (SwiGLU FFN,
RoPE, RMSNorm).

Initialisation is a pure function of ``(seed, global parameter index)``: the
index is the parameter's position in the *unsplit* model's
``named_parameters()``.  Any rank can therefore build any pipeline stage on its
own (:func:`build_stage`) and get exactly the values that the same stage of the
full model has.  Values are drawn in float32 from a per-parameter
``torch.Generator`` and then cast, so a float64 model is the exact upcast of
the float32 one.  Scheme:

* matrices and embeddings: N(0, 0.02²); the output projection of each residual
  branch (attention out-projection and FFN down-projection) uses
  0.02 / sqrt(2 · num_blocks), the GPT-2 scaled initialisation;
* norm weights: ones; biases: zeros.

:func:`split_model` cuts a model into consecutive :class:`Stage` modules that
share its parameters.  ``cut="block"`` cuts between transformer blocks (the
hidden state crosses); ``cut="ffn_act"`` cuts inside a block right after its
FFN activation (OPT: relu(fc1 x); GPT-2: gelu(c_fc x); Llama: silu(gate x) ·
up x, the input of down_proj), and then both the FFN activation and the
residual stream cross.  Chaining the stages reproduces ``model(ids).logits``
bit for bit, and so do the parameter gradients.  Each stage recomputes the
causal mask and the positions locally from the sequence length (our batches
are never padded), so neither crosses the wire.

Bit-exactness needs the same kernels on both sides: the models use the
``"eager"`` attention implementation (the stage code calls the same attention
modules as the full model does).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from harness.seeding import keyed_seed

__all__ = [
    "PRESETS",
    "ModelPreset",
    "Stage",
    "TensorSpec",
    "build_model",
    "build_stage",
    "default_boundaries",
    "lm_loss",
    "max_stages",
    "model_info",
    "split_model",
]

FAMILIES = ("opt", "gpt2", "llama")
CUTS = ("block", "ffn_act")
ATTN_IMPLEMENTATION = "eager"
INIT_STD = 0.02

# Stop transformers from ever reaching for the hub (we only build from configs and
# load from local directories).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# --------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a model.  Validated on construction (bad values raise ValueError)."""

    family: str
    num_blocks: int
    d_model: int
    ffn_dim: int
    heads: int
    vocab_size: int
    max_positions: int
    activation: str
    synthetic_weights: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        from transformers.activations import ACT2FN

        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; choose from {', '.join(FAMILIES)}")
        for name in ("num_blocks", "d_model", "ffn_dim", "heads", "vocab_size", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"preset {name} must be a positive int, got {value!r}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        if self.family == "llama" and (self.d_model // self.heads) % 2:
            raise ValueError("llama (RoPE) needs an even head dimension")
        if self.activation not in ACT2FN:
            raise ValueError(f"unknown activation {self.activation!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def hf_config(self) -> Any:
        """The ``transformers`` config for this preset (dropout 0, untied head, no cache)."""
        # tie_word_embeddings=False everywhere: the LM head is its own parameter, so the
        # first and the last pipeline stage never share a parameter (a tied copy split
        # across two ranks would desynchronise under any update rule).
        common = dict(tie_word_embeddings=False, use_cache=False, pad_token_id=None,
                      bos_token_id=None, eos_token_id=None)
        if self.family == "opt":
            from transformers import OPTConfig

            return OPTConfig(
                vocab_size=self.vocab_size, hidden_size=self.d_model, num_hidden_layers=self.num_blocks,
                ffn_dim=self.ffn_dim, num_attention_heads=self.heads,
                max_position_embeddings=self.max_positions, word_embed_proj_dim=self.d_model,
                do_layer_norm_before=True, activation_function=self.activation, enable_bias=True,
                dropout=0.0, attention_dropout=0.0, layerdrop=0.0, **common)
        if self.family == "gpt2":
            from transformers import GPT2Config

            return GPT2Config(
                vocab_size=self.vocab_size, n_embd=self.d_model, n_layer=self.num_blocks,
                n_head=self.heads, n_inner=self.ffn_dim, n_positions=self.max_positions,
                activation_function=self.activation, resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, scale_attn_by_inverse_layer_idx=False,
                reorder_and_upcast_attn=False, **common)
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.d_model, intermediate_size=self.ffn_dim,
            num_hidden_layers=self.num_blocks, num_attention_heads=self.heads,
            num_key_value_heads=self.heads, max_position_embeddings=self.max_positions,
            hidden_act=self.activation, rms_norm_eps=1e-6, attention_bias=False, mlp_bias=False,
            attention_dropout=0.0, **common)


PRESETS: dict[str, ModelPreset] = {
    # Tiny models for checks: a train step takes milliseconds.  Byte-level vocab.
    "tiny-opt": ModelPreset("opt", 4, 32, 128, 4, 256, 512, "relu",
                            description="tiny OPT (ReLU, learned positions) for checks"),
    "tiny-gpt2": ModelPreset("gpt2", 4, 32, 128, 4, 256, 512, "gelu_new",
                             description="tiny GPT-2 (GELU tanh approximation) for checks"),
    "tiny-llama": ModelPreset("llama", 4, 32, 96, 4, 256, 512, "silu",
                              description="tiny Llama (SwiGLU, RoPE, RMSNorm) for checks"),
    # Small models: a few million parameters, for laptop-scale benchmarks.
    "small-opt": ModelPreset("opt", 6, 256, 1024, 8, 256, 1024, "relu",
                             description="small OPT, 6 blocks x 256, byte-level vocab"),
    "small-gpt2": ModelPreset("gpt2", 6, 256, 1024, 8, 256, 1024, "gelu_new",
                              description="small GPT-2, 6 blocks x 256, byte-level vocab"),
    "small-llama": ModelPreset("llama", 6, 256, 688, 8, 256, 1024, "silu",
                               description="small Llama, 6 blocks x 256, byte-level vocab"),
    # Paper-shaped models (synthetic weights unless a local directory is given).
    "opt-125m": ModelPreset("opt", 12, 768, 3072, 12, 50272, 2048, "relu",
                            description="OPT-125M shape (untied LM head)"),
    "gpt2-124m": ModelPreset("gpt2", 12, 768, 3072, 12, 50257, 1024, "gelu_new",
                             description="GPT-2 small shape (untied LM head)"),
}


def _preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(PRESETS)}") from None


# --------------------------------------------------------------------------- initialisation


_RESIDUAL_OUT_SUFFIXES = (
    ".self_attn.out_proj.weight", ".fc2.weight",  # OPT
    ".attn.c_proj.weight", ".mlp.c_proj.weight",  # GPT-2
    ".self_attn.o_proj.weight", ".mlp.down_proj.weight",  # Llama
)


def _init_seed(seed: int, index: int) -> int:
    """64-bit generator seed for parameter ``index`` (domain-separated from other uses)."""
    return keyed_seed("commbench.models.init", int(seed), int(index))


def init_value(seed: int, index: int, name: str, shape: Sequence[int], num_blocks: int) -> Tensor:
    """The float32 initial value of global parameter ``index`` (a pure function)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) >= 2:
        std = INIT_STD
        if name.endswith(_RESIDUAL_OUT_SUFFIXES):
            std = INIT_STD / math.sqrt(2 * num_blocks)
        g = torch.Generator(device="cpu").manual_seed(_init_seed(seed, index))
        return torch.randn(shape, generator=g, dtype=torch.float32).mul_(std)
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=torch.float32)
    return torch.ones(shape, dtype=torch.float32)  # norm weights


def _family_of(config: Any) -> str:
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise ValueError(f"unsupported model type {mt!r}; supported: {', '.join(FAMILIES)}")
    return mt


def _meta_model(config: Any) -> Any:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)


def _materialise(root: nn.Module, entries: Sequence[tuple[int, str, str]], seed: int,
                 num_blocks: int, dtype: torch.dtype, device: torch.device | str) -> None:
    """Allocate ``root``'s (meta) tensors on ``device`` and fill every parameter.

    ``entries`` are ``(global_index, global_name, local_name)`` for the
    parameters of ``root``; the only buffers our families have are Llama's
    rotary frequencies, which are rebuilt from the config.
    """
    rotary = [n for n, m in root.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]
    unknown = [n for n, _ in root.named_buffers()
               if not any(n.startswith(r + ".") for r in rotary)]
    if unknown:  # to_empty would leave them uninitialised
        raise NotImplementedError(f"cannot materialise buffers {unknown}")
    root.to_empty(device=device)
    with torch.no_grad():
        for index, name, local in entries:
            p = root.get_parameter(local)
            p.copy_(init_value(seed, index, name, p.shape, num_blocks))
        for mod_name in rotary:
            mod = root.get_submodule(mod_name)
            _set_submodule(root, mod_name, type(mod)(config=mod.config).to(device))
    root.to(dtype=dtype)


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    if isinstance(parent, nn.ModuleDict):
        parent[attr] = new
    else:
        setattr(parent, attr, new)


def _load_pretrained(preset: ModelPreset, weights: str, dtype: torch.dtype) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    path = os.fspath(weights)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"weights directory {path!r} does not exist (weights are only loaded "
                                "from a local directory; nothing is downloaded)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"weights directory {path!r} has no config.json")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"cannot read model config in {path!r}: {exc}") from None
    family = getattr(config, "model_type", None)
    if family != preset.family:
        raise ValueError(f"weights in {path!r} are a {family!r} model, the preset is {preset.family!r}")
    if config.num_hidden_layers != preset.num_blocks or config.hidden_size != preset.d_model:
        raise ValueError(f"weights in {path!r} have {config.num_hidden_layers} blocks x "
                         f"{config.hidden_size}, the preset has {preset.num_blocks} x {preset.d_model}")
    for key in ("dropout", "attention_dropout", "layerdrop", "resid_pdrop", "embd_pdrop",
                "attn_pdrop", "activation_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    config.use_cache = False
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, local_files_only=True, dtype=torch.float32,
            attn_implementation=ATTN_IMPLEMENTATION)
    except OSError as exc:
        raise FileNotFoundError(f"cannot load weights from {path!r}: {exc}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    # Untie a tied LM head (pretrained OPT/GPT-2 tie it): the first and last pipeline
    # stages must not share a parameter.  The copy starts equal to the embedding.
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is emb.weight:
        head.weight = nn.Parameter(emb.weight.detach().clone())
    model.config.tie_word_embeddings = False
    if hasattr(model, "_tied_weights_keys"):
        model._tied_weights_keys = {}
    return model.to(dtype=dtype)


def build_model(name: str, *, seed: int, dtype: torch.dtype = torch.float32,
                weights: str | None = None, device: torch.device | str = "cpu") -> Any:
    """Build preset ``name`` with deterministic weights (or local pretrained ones).

    Parameter ``i`` of ``named_parameters()`` is ``init_value(seed, i, ...)``
    cast to ``dtype``.  ``weights`` is an optional local directory holding a
    ``save_pretrained`` checkpoint; it is loaded with ``local_files_only`` and
    its LM head is untied (``seed`` is then unused).  Unknown names raise
    ValueError; a missing directory raises FileNotFoundError.
    """
    preset = _preset(name)
    if weights is not None:
        return _load_pretrained(preset, weights, dtype).to(device)
    model = _meta_model(preset.hf_config())
    entries = [(i, n, n) for i, (n, _) in enumerate(model.named_parameters())]
    _materialise(model, entries, seed, preset.num_blocks, dtype, device)
    return model


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean token cross-entropy; ``labels`` are the next tokens (same shape as input_ids).

    Half-precision logits are upcast to float32 first; float32/float64 are used as is.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


# --------------------------------------------------------------------------- family adapters
#
# Each adapter knows where a family keeps its embedding, blocks and head, and how to run
# the two halves of a block that is cut after its FFN activation.  The halves repeat the
# ``transformers`` layer code operation for operation (same modules, same order), so the
# split computation is bit-identical to the unsplit one.


class _Family:
    name = ""

    def layers(self, model: Any) -> nn.ModuleList:
        raise NotImplementedError

    def embed_modules(self, model: Any) -> dict[str, nn.Module]:
        raise NotImplementedError

    def head_modules(self, model: Any) -> dict[str, nn.Module]:
        raise NotImplementedError

    def shared_modules(self, model: Any) -> dict[str, nn.Module]:
        """Parameter-free modules every stage needs (rotary embedding)."""
        return {}

    def pre_modules(self, layer: nn.Module) -> dict[str, nn.Module]:
        raise NotImplementedError

    def post_modules(self, layer: nn.Module) -> dict[str, nn.Module]:
        raise NotImplementedError

    @staticmethod
    def ffn_width(config: Any) -> int:
        raise NotImplementedError

    def embed(self, st: Stage, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def context(self, st: Stage, ref: Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def block(self, layer: nn.Module, h: Tensor, ctx: dict[str, Any]) -> Tensor:
        raise NotImplementedError

    def pre(self, st: Stage, m: nn.ModuleDict, h: Tensor, ctx: dict[str, Any]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def post(self, st: Stage, m: nn.ModuleDict, a: Tensor, r: Tensor) -> Tensor:
        raise NotImplementedError

    def head(self, st: Stage, h: Tensor) -> Tensor:
        raise NotImplementedError


def _causal_mask(config: Any, ref: Tensor, position_ids: Tensor | None) -> Any:
    from transformers.masking_utils import create_causal_mask

    kwargs = {} if position_ids is None else {"position_ids": position_ids}
    return create_causal_mask(config=config, inputs_embeds=ref, attention_mask=None,
                              past_key_values=None, **kwargs)


class _OPT(_Family):
    name = "opt"

    def layers(self, model):
        return model.model.decoder.layers

    def embed_modules(self, model):
        d = model.model.decoder
        out = {"embed_tokens": d.embed_tokens, "embed_positions": d.embed_positions}
        if d.project_in is not None:
            out["project_in"] = d.project_in
        return out

    def head_modules(self, model):
        d = model.model.decoder
        out: dict[str, nn.Module] = {}
        if d.final_layer_norm is not None:
            out["final_layer_norm"] = d.final_layer_norm
        if d.project_out is not None:
            out["project_out"] = d.project_out
        out["lm_head"] = model.lm_head
        return out

    def pre_modules(self, layer):
        return {"self_attn_layer_norm": layer.self_attn_layer_norm, "self_attn": layer.self_attn,
                "final_layer_norm": layer.final_layer_norm, "fc1": layer.fc1,
                "act": layer.activation_fn}

    def post_modules(self, layer):
        out = {"fc2": layer.fc2}
        if not layer.do_layer_norm_before:
            out["final_layer_norm"] = layer.final_layer_norm
        return out

    @staticmethod
    def ffn_width(config):
        return config.ffn_dim

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

    def context(self, st, ref):
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

    def head(self, st, h):
        m = st.head
        if "final_layer_norm" in m:
            h = m["final_layer_norm"](h)
        if "project_out" in m:
            h = m["project_out"](h)
        return m["lm_head"](h).contiguous()


class _GPT2(_Family):
    name = "gpt2"

    def layers(self, model):
        return model.transformer.h

    def embed_modules(self, model):
        t = model.transformer
        return {"wte": t.wte, "wpe": t.wpe, "drop": t.drop}

    def head_modules(self, model):
        return {"ln_f": model.transformer.ln_f, "lm_head": model.lm_head}

    def pre_modules(self, layer):
        return {"ln_1": layer.ln_1, "attn": layer.attn, "ln_2": layer.ln_2,
                "c_fc": layer.mlp.c_fc, "act": layer.mlp.act}

    def post_modules(self, layer):
        return {"c_proj": layer.mlp.c_proj, "dropout": layer.mlp.dropout}

    @staticmethod
    def ffn_width(config):
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

    def context(self, st, ref):
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

    def head(self, st, h):
        m = st.head
        return m["lm_head"](m["ln_f"](h))


class _Llama(_Family):
    name = "llama"

    def layers(self, model):
        return model.model.layers

    def embed_modules(self, model):
        return {"embed_tokens": model.model.embed_tokens}

    def head_modules(self, model):
        return {"norm": model.model.norm, "lm_head": model.lm_head}

    def shared_modules(self, model):
        return {"rotary_emb": model.model.rotary_emb}

    def pre_modules(self, layer):
        return {"input_layernorm": layer.input_layernorm, "self_attn": layer.self_attn,
                "post_attention_layernorm": layer.post_attention_layernorm,
                "gate_proj": layer.mlp.gate_proj, "up_proj": layer.mlp.up_proj,
                "act": layer.mlp.act_fn}

    def post_modules(self, layer):
        return {"down_proj": layer.mlp.down_proj}

    @staticmethod
    def ffn_width(config):
        return config.intermediate_size

    def embed(self, st, ids):
        return st.embed["embed_tokens"](ids)

    def context(self, st, ref):
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

    def head(self, st, h):
        m = st.head
        return m["lm_head"](m["norm"](h))


_FAMILIES: dict[str, _Family] = {"opt": _OPT(), "gpt2": _GPT2(), "llama": _Llama()}


# --------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a tensor that enters or leaves a stage."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class _Plan:
    index: int
    num_stages: int
    cut: str
    post_block: int | None
    blocks: tuple[int, ...]
    pre_block: int | None
    boundaries: tuple[int, ...] = field(default=())


class Stage(nn.Module):
    """One consecutive piece of a split model.

    ``forward(*inputs)`` takes the tensors named by ``input_names`` and returns
    a tuple of the tensors named by ``output_names``:

    * first stage input ``("input_ids",)``; last stage output ``("logits",)``;
    * ``cut="block"`` boundaries carry ``("hidden",)`` ``[B, T, d_model]``;
    * ``cut="ffn_act"`` boundaries carry ``("ffn_act", "residual")``:
      ``[B, T, ffn]`` and ``[B, T, d_model]``.

    Attributes: ``index``, ``num_stages``, ``cut``, ``boundaries``,
    ``blocks`` (whole blocks held), ``post_block`` (block whose FFN
    down-projection this stage runs first), ``pre_block`` (block whose first
    part, up to the FFN activation, this stage runs last), ``config``.
    """

    def __init__(self, model: Any, plan: _Plan, global_ids: dict[int, tuple[int, str]]):
        super().__init__()
        config = model.config
        fam = _FAMILIES[_family_of(config)]
        layers = fam.layers(model)
        self.config = config
        self.family = fam.name
        self.index = plan.index
        self.num_stages = plan.num_stages
        self.cut = plan.cut
        self.boundaries = plan.boundaries
        self.blocks = plan.blocks
        self.post_block = plan.post_block
        self.pre_block = plan.pre_block
        self._fam = fam
        first, last = plan.index == 0, plan.index == plan.num_stages - 1
        self.embed = nn.ModuleDict(fam.embed_modules(model) if first else {})
        self.head = nn.ModuleDict(fam.head_modules(model) if last else {})
        self.shared = nn.ModuleDict(fam.shared_modules(model))
        self.post_part = nn.ModuleDict(
            fam.post_modules(layers[plan.post_block]) if plan.post_block is not None else {})
        self.block_modules = nn.ModuleList([layers[i] for i in plan.blocks])
        self.pre_part = nn.ModuleDict(
            fam.pre_modules(layers[plan.pre_block]) if plan.pre_block is not None else {})
        boundary = ("hidden",) if plan.cut == "block" else ("ffn_act", "residual")
        self.input_names: tuple[str, ...] = ("input_ids",) if first else boundary
        self.output_names: tuple[str, ...] = ("logits",) if last else boundary
        entries = []
        for local, p in self.named_parameters():
            idx, name = global_ids[id(p)]
            entries.append((idx, name, local))
        self._entries: list[tuple[int, str, str]] = sorted(entries)

    # -- parameters -----------------------------------------------------------------

    def global_named_parameters(self) -> list[tuple[int, str, nn.Parameter]]:
        """``(global_index, global_name, parameter)`` sorted by global index."""
        return [(i, n, self.get_parameter(local)) for i, n, local in self._entries]

    def global_indices(self) -> list[int]:
        return [i for i, _, _ in self._entries]

    @property
    def dtype(self) -> torch.dtype:
        for p in self.parameters():
            return p.dtype
        return torch.float32

    @property
    def ops(self) -> Any:
        """The model family's ``layers`` / ``embed`` / ``context`` / ``block`` / ``head``
        functions, for engines that walk the blocks themselves (e.g. ZO2's offloading)."""
        return self._fam

    # -- shapes ---------------------------------------------------------------------

    def _spec(self, name: str, batch: int, seq_len: int) -> TensorSpec:
        c = self.config
        if name == "input_ids":
            return TensorSpec(name, (batch, seq_len), torch.int64)
        width = {"hidden": c.hidden_size, "residual": c.hidden_size,
                 "ffn_act": self._fam.ffn_width(c), "logits": c.vocab_size}[name]
        return TensorSpec(name, (batch, seq_len, width), self.dtype)

    def input_specs(self, batch: int, seq_len: int) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(n, batch, seq_len) for n in self.input_names)

    def output_specs(self, batch: int, seq_len: int) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(n, batch, seq_len) for n in self.output_names)

    def boundary_shapes(self, batch: int, seq_len: int) -> dict[str, tuple[int, ...]]:
        """Shapes of what this stage sends on (its outputs), by name."""
        return {s.name: s.shape for s in self.output_specs(batch, seq_len)}

    # -- compute --------------------------------------------------------------------

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"stage {self.index} takes {len(self.input_names)} inputs "
                             f"{self.input_names}, got {len(inputs)}")
        fam = self._fam
        if self.index == 0:
            h = fam.embed(self, inputs[0])
            ref = h
        elif self.post_block is not None:
            a, ref = inputs
            h = None
        else:
            h = ref = inputs[0]
        ctx = fam.context(self, ref) if (self.blocks or self.pre_block is not None) else {}
        if self.post_block is not None:
            h = fam.post(self, self.post_part, a, ref)
        for layer in self.block_modules:
            h = fam.block(layer, h, ctx)
        if self.pre_block is not None:
            return fam.pre(self, self.pre_part, h, ctx)
        if self.index == self.num_stages - 1:
            return (fam.head(self, h),)
        return (h,)

    def extra_repr(self) -> str:
        return (f"index={self.index}/{self.num_stages}, cut={self.cut!r}, post_block={self.post_block}, "
                f"blocks={list(self.blocks)}, pre_block={self.pre_block}")


def max_stages(num_blocks: int, cut: str = "block") -> int:
    """Most stages a model with ``num_blocks`` blocks can be cut into."""
    _check_cut(cut)
    return num_blocks if cut == "block" else num_blocks + 1


def _check_cut(cut: str) -> None:
    if cut not in CUTS:
        raise ValueError(f"unknown cut {cut!r}; choose from {', '.join(CUTS)}")


def _cut_range(num_blocks: int, cut: str) -> tuple[int, int]:
    """Allowed boundary values: a block cut c sits before block c; an ffn_act cut inside block c."""
    return (1, num_blocks - 1) if cut == "block" else (0, num_blocks - 1)


def default_boundaries(num_blocks: int, num_stages: int, cut: str = "block") -> list[int]:
    """Cuts as even as possible: near the quantiles num_blocks · m / num_stages.

    An ffn_act cut in block j leaves about j + 2/3 blocks before it (attention
    and the first FFN matrix), so its targets are shifted by 2/3 (for 12 blocks
    and 2 stages this gives block 5, the sixth block, as in the SparQ paper).
    """
    _check_stages(num_blocks, num_stages, cut)
    lo, hi = _cut_range(num_blocks, cut)
    shift = 0.0 if cut == "block" else 2.0 / 3.0
    k = num_stages - 1
    cuts = [math.floor(num_blocks * m / num_stages - shift + 0.5) for m in range(1, num_stages)]
    for i in range(k):  # clamp so that strictly increasing cuts fit in [lo, hi]
        cuts[i] = min(max(cuts[i], lo + i, cuts[i - 1] + 1 if i else lo), hi - (k - 1 - i))
    return cuts


def _check_stages(num_blocks: int, num_stages: int, cut: str) -> None:
    _check_cut(cut)
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    most = max_stages(num_blocks, cut)
    if num_stages > most:
        raise ValueError(f"cannot cut {num_blocks} blocks into {num_stages} stages with cut={cut!r} "
                         f"(at most {most})")


def _plans(num_blocks: int, num_stages: int, cut: str,
           boundaries: Sequence[int] | None) -> list[_Plan]:
    _check_stages(num_blocks, num_stages, cut)
    if boundaries is None:
        cuts = default_boundaries(num_blocks, num_stages, cut)
    else:
        cuts = list(boundaries)
        if len(cuts) != num_stages - 1:
            raise ValueError(f"{num_stages} stages need {num_stages - 1} boundaries, got {len(cuts)}")
        lo, hi = _cut_range(num_blocks, cut)
        for c in cuts:
            if not isinstance(c, int) or isinstance(c, bool) or not lo <= c <= hi:
                raise ValueError(f"boundary {c!r} out of range: {cut} cuts must be ints in [{lo}, {hi}]")
        if any(b <= a for a, b in itertools.pairwise(cuts)):
            raise ValueError(f"boundaries {cuts} must be strictly increasing")
    bounds = tuple(cuts)
    plans = []
    for m in range(num_stages):
        if cut == "block":
            start = 0 if m == 0 else cuts[m - 1]
            end = num_blocks if m == num_stages - 1 else cuts[m]
            plans.append(_Plan(m, num_stages, cut, None, tuple(range(start, end)), None, bounds))
        else:
            post = None if m == 0 else cuts[m - 1]
            pre = None if m == num_stages - 1 else cuts[m]
            start = 0 if post is None else post + 1
            end = num_blocks if pre is None else pre
            plans.append(_Plan(m, num_stages, cut, post, tuple(range(start, end)), pre, bounds))
    return plans


def _global_ids(model: nn.Module) -> dict[int, tuple[int, str]]:
    return {id(p): (i, n) for i, (n, p) in enumerate(model.named_parameters())}


def split_model(model: Any, num_stages: int, cut: str = "block",
                boundaries: Sequence[int] | None = None) -> list[Stage]:
    """Split ``model`` into ``num_stages`` consecutive stages that share its parameters.

    ``boundaries`` gives the block index of each cut (``num_stages - 1`` of
    them, strictly increasing): for ``cut="block"`` a cut ``c`` in
    ``[1, N-1]`` sits between blocks ``c-1`` and ``c``; for ``cut="ffn_act"`` a
    cut ``c`` in ``[0, N-1]`` sits in block ``c`` right after its FFN
    activation.  Default: :func:`default_boundaries`.
    """
    fam = _FAMILIES[_family_of(model.config)]
    num_blocks = len(fam.layers(model))
    ids = _global_ids(model)
    return [Stage(model, plan, ids) for plan in _plans(num_blocks, num_stages, cut, boundaries)]


def build_stage(name: str, *, seed: int, num_stages: int, stage_index: int, cut: str = "block",
                boundaries: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                weights: str | None = None, device: torch.device | str = "cpu") -> Stage:
    """Build only stage ``stage_index`` of preset ``name`` split into ``num_stages``.

    The model skeleton is created on the meta device and only this stage's
    parameters are allocated, so a rank never holds more than its stage.  The
    values equal those of the same stage of ``build_model`` + ``split_model``.
    """
    preset = _preset(name)
    _check_stages(preset.num_blocks, num_stages, cut)
    if not isinstance(stage_index, int) or isinstance(stage_index, bool) \
            or not 0 <= stage_index < num_stages:
        raise ValueError(f"stage_index must be in [0, {num_stages - 1}], got {stage_index!r}")
    if weights is not None:
        model = build_model(name, seed=seed, dtype=dtype, weights=weights, device=device)
        return split_model(model, num_stages, cut, boundaries)[stage_index]
    model = _meta_model(preset.hf_config())
    stage = split_model(model, num_stages, cut, boundaries)[stage_index]
    del model
    _materialise(stage, stage._entries, seed, preset.num_blocks, dtype, device)
    return stage


# --------------------------------------------------------------------------- info


def model_info(name: str) -> dict[str, Any]:
    """Parameter counts of preset ``name`` (computed on the meta device, nothing allocated)."""
    preset = _preset(name)
    model = _meta_model(preset.hf_config())
    fam = _FAMILIES[preset.family]
    total = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in layer.parameters()) for layer in fam.layers(model)]
    embed = sum(p.numel() for m in fam.embed_modules(model).values() for p in m.parameters())
    head = sum(p.numel() for m in fam.head_modules(model).values() for p in m.parameters())
    layer0 = fam.layers(model)[0]
    pre = sum(p.numel() for m in fam.pre_modules(layer0).values() for p in m.parameters())
    return {
        "name": name,
        **asdict(preset),
        "num_parameters": total,
        "num_tensors": len(list(model.parameters())),
        "embedding_parameters": embed,
        "head_parameters": head,
        "block_parameters": blocks,
        "block_pre_ffn_act_parameters": pre,
        "ffn_act_width": fam.ffn_width(model.config),
        "fp32_bytes": 4 * total,
    }
