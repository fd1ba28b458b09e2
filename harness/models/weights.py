"""Deterministic weights: initialisation, model construction, local pretrained loading.

Initialisation is a pure function of ``(seed, global parameter index)``: the
index is the parameter's position in the *unsplit* model's
``named_parameters()``.  Any rank can therefore build any pipeline stage on its
own (:func:`~.stages.build_stage`) and get exactly the values that the same
stage of the full model has.  Values are drawn in float32 from a per-parameter
``torch.Generator`` and then cast, so a float64 model is the exact upcast of
the float32 one.  Scheme:

* matrices and embeddings: N(0, 0.02²); the output projection of each residual
  branch (attention out-projection and FFN down-projection,
  :attr:`.families.FamilySpec.residual_out`) uses 0.02 / sqrt(2 · num_blocks),
  the GPT-2 scaled initialisation;
* norm weights: ones; biases: zeros.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from harness.seeding import keyed_seed

from .families import FAMILY_SPECS
from .presets import ModelPreset, _preset

__all__ = ["build_model", "init_value", "save_weights"]

ATTN_IMPLEMENTATION = "eager"
INIT_STD = 0.02

# The residual-branch output projections of every family, by parameter-name suffix.
_RESIDUAL_OUT_SUFFIXES = tuple(
    f".{path}.weight" for spec in FAMILY_SPECS.values() for path in spec.residual_out)


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


@functools.cache
def encoder_classifier_class() -> type:
    """``BertForSequenceClassification`` that builds its padding mask from the token ids.

    Tokenised text is padded to the batch's length with ``pad_token_id``; a bare
    ``model(ids)`` (every training loop's call) must not attend to the padding, so
    the mask is derived here exactly as a caller would pass it."""
    from transformers import BertForSequenceClassification

    class EncoderClassifier(BertForSequenceClassification):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            if attention_mask is None and input_ids is not None:
                attention_mask = input_ids.ne(self.config.pad_token_id).long()
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    return EncoderClassifier


@functools.cache
def prompt_scorer_class() -> type:
    """``Gemma3ForCausalLM`` as a prompt-based classifier (:mod:`.prompt`): ``lm_head`` holds
    the label words' rows only (``[num_labels, d]``, set from the embedding when loaded), and
    ``model(ids).logits`` are their scores at each row's last real token, ``[B, num_labels]``."""
    from transformers import Gemma3ForCausalLM
    from transformers.modeling_outputs import SequenceClassifierOutput

    from .adapters import last_token_index

    class PromptScorer(Gemma3ForCausalLM):
        _tied_weights_keys: dict[str, str] = {}  # the label rows are a copy, never tied

        def __init__(self, config):
            super().__init__(config)
            self.lm_head = nn.Linear(config.hidden_size, config.num_labels, bias=False)

        def forward(self, input_ids=None, **kwargs):
            h = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
            last = last_token_index(input_ids, self.config.pad_token_id)
            return SequenceClassifierOutput(logits=self.lm_head(h[torch.arange(h.shape[0]), last]))

    return PromptScorer


def _model_class(config: Any) -> Any:
    from .presets import TRANSFORMERS_IMPORTS

    with TRANSFORMERS_IMPORTS:
        return _resolve_model_class(config)


def _resolve_model_class(config: Any) -> Any:
    if getattr(config, "model_type", None) == "bert":
        return encoder_classifier_class()
    if getattr(config, "model_type", None) == "gemma3_text":
        return prompt_scorer_class()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def _meta_model(config: Any) -> Any:
    cls = _model_class(config)
    with torch.device("meta"):
        if hasattr(cls, "from_config"):
            return cls.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
        return cls._from_config(config, attn_implementation=ATTN_IMPLEMENTATION)


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
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    config.use_cache = False
    try:
        with _quiet_loading(errors_only=False):
            model = AutoModelForCausalLM.from_pretrained(
                path, config=config, local_files_only=True, dtype=torch.float32,
                attn_implementation=ATTN_IMPLEMENTATION)
    except OSError as exc:
        raise FileNotFoundError(f"cannot load weights from {path!r}: {exc}") from None
    # Untie a tied LM head (pretrained OPT/GPT-2 tie it): the first and last pipeline
    # stages must not share a parameter.  The copy starts equal to the embedding.
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is emb.weight:
        head.weight = nn.Parameter(emb.weight.detach().clone())
    model.config.tie_word_embeddings = False
    if hasattr(model, "_tied_weights_keys"):
        model._tied_weights_keys = {}
    return model.to(dtype=dtype)


_HF_LOGGING = threading.Lock()


@contextlib.contextmanager
def _quiet_loading(errors_only: bool):
    """No progress bars (and, with ``errors_only``, no warnings) from ``transformers`` while a
    checkpoint loads; threads ranks load at once, so one holds the global switches at a time."""
    from transformers.utils import logging as hf_logging

    with _HF_LOGGING:
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        if errors_only:
            hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
_DROPOUT_KEYS = ("dropout", "attention_dropout", "layerdrop", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                 "activation_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
                 "classifier_dropout")


def _load_packaged(preset: ModelPreset, seed: int, dtype: torch.dtype) -> Any:
    """A preset's installed pretrained checkpoint (hash-checked), dropout off; the parameters the
    checkpoint lacks (a fresh classifier head) are drawn like synthetic ones, as a pure function
    of ``(seed, global index)``, not from the global RNG ``transformers`` would use."""
    from transformers import AutoConfig

    from .pretrained import checkpoint_dir

    path = checkpoint_dir(preset.pretrained)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type != preset.family or config.num_hidden_layers != preset.num_blocks \
            or config.hidden_size != preset.d_model or config.vocab_size != preset.vocab_size:
        raise ValueError(f"the checkpoint in {path} ({config.model_type}, {config.num_hidden_layers} blocks "
                         f"x {config.hidden_size}) does not match preset shape {preset}")
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    config.use_cache = False
    if preset.task == "classify":
        config.num_labels = preset.num_labels
    if preset.prompt is not None:
        config.tie_word_embeddings = False  # the head becomes the label words' rows, a copy
    # "some weights were newly initialised": the head, redrawn below
    with _quiet_loading(errors_only=True):
        model, info = _model_class(config).from_pretrained(
            path, config=config, local_files_only=True, dtype=torch.float32,
            attn_implementation=ATTN_IMPLEMENTATION, output_loading_info=True)
    fresh = set(info["missing_keys"])
    with torch.no_grad():
        if preset.prompt is not None:  # the LM head restricted to the label words (tied: embedding rows)
            from .pretrained import tokenizer
            from .prompt import label_token_ids

            rows = label_token_ids(tokenizer(preset.pretrained), preset.prompt)
            model.lm_head.weight.copy_(model.get_input_embeddings().weight[rows])
            fresh.discard("lm_head.weight")
        for index, (name, p) in enumerate(model.named_parameters()):
            if name in fresh:
                p.copy_(init_value(seed, index, name, p.shape, preset.num_blocks))
    return model.to(dtype=dtype)


def save_weights(model: Any, path: str) -> None:
    """Write ``model`` as a local ``save_pretrained`` directory that ``weights=`` loads back."""
    with _quiet_loading(errors_only=False):
        model.save_pretrained(os.fspath(path))


def num_parameters(name: str) -> int:
    """Parameters of preset ``name``, counted on the meta device (nothing is allocated)."""
    return sum(p.numel() for p in _meta_model(_preset(name).hf_config()).parameters())


def build_model(name: str, *, seed: int, dtype: torch.dtype = torch.float32,
                weights: str | None = None, device: torch.device | str = "cpu") -> Any:
    """Build preset ``name`` with deterministic weights (or pretrained ones).

    Parameter ``i`` of ``named_parameters()`` is ``init_value(seed, i, ...)``
    cast to ``dtype``; a preset with a pretrained source loads its installed,
    hash-checked checkpoint instead (:func:`_load_packaged`).  ``weights`` is an optional local directory holding a
    ``save_pretrained`` checkpoint; it is loaded with ``local_files_only`` and
    its LM head is untied (``seed`` is then unused).  Unknown names raise
    ValueError; a missing directory raises FileNotFoundError.
    """
    preset = _preset(name)
    if weights is not None:
        return _load_pretrained(preset, weights, dtype).to(device)
    if preset.pretrained is not None:
        return _load_packaged(preset, seed, dtype).to(device)
    model = _meta_model(preset.hf_config())
    entries = [(i, n, n) for i, (n, _) in enumerate(model.named_parameters())]
    _materialise(model, entries, seed, preset.num_blocks, dtype, device)
    return model

