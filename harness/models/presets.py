"""Model presets: the shape of each named model and its ``transformers`` config.

Every model is a Hugging Face ``transformers`` model built from a config
(nothing is ever downloaded).  Causal LMs of three families: OPT (ReLU FFN,
learned positions), GPT-2 (GELU FFN, learned positions) and Llama (SwiGLU FFN,
RoPE, RMSNorm); a BERT encoder classifier (``task="classify"``), and Gemma-3, a
causal LM that classifies by scoring label words after a prompt (:mod:`.prompt`);
the last two load pretrained weights from installed packages (:mod:`.pretrained`).  Where
each family keeps its parts is described in :mod:`.families`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .families import FAMILIES
from .prompt import PromptTemplate

__all__ = ["PRESETS", "TASKS", "ModelPreset"]

TASKS = ("lm", "classify")
# transformers resolves its names lazily and not thread-safely: two threads ranks asking for the
# same class at once can see a half-initialised module ("cannot import name 'OPTConfig'")
TRANSFORMERS_IMPORTS = threading.RLock()
# The activations a preset may name: keys of transformers' ACT2FN, listed here so that reading a
# preset needs neither transformers nor torch (checks/test_models.py holds the list to ACT2FN).
ACTIVATIONS = ("relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu")

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
    # "lm": next-token logits [B, T, vocab]; "classify": class logits [B, num_labels] from a
    # sequence classifier (labels [B]); the loss and the accuracy read either shape
    task: str = "lm"
    num_labels: int = 2
    # the installed package the weights come from (:data:`.pretrained.SOURCES`); None: synthetic
    pretrained: str | None = None
    # a causal LM that classifies: the prompt and label words it scores (MeZO's prompt-based
    # fine-tuning); None for an encoder with a classifier head
    prompt: PromptTemplate | None = None

    def __post_init__(self) -> None:
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
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}")
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose from {', '.join(TASKS)}")
        if self.task == "classify" and self.family not in ("bert", "gemma3_text"):
            raise ValueError("sequence classifiers are the encoder 'bert' and the prompt-scoring "
                             "'gemma3_text'")
        if self.family == "bert" and self.task != "classify":
            raise ValueError("the encoder family 'bert' has no LM head; its task is 'classify'")
        if (self.family == "gemma3_text") != (self.prompt is not None) or \
                (self.prompt is not None and len(self.prompt.words) != self.num_labels):
            raise ValueError("a gemma3_text preset scores a prompt: one label word per class")
        if self.synthetic_weights == (self.pretrained is not None):
            raise ValueError("a preset has synthetic weights or names its pretrained source, not both")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def hf_config(self) -> Any:
        """The ``transformers`` config for this preset (dropout 0, untied head, no cache)."""
        with TRANSFORMERS_IMPORTS:
            return self._hf_config()

    def _hf_config(self) -> Any:
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
        if self.family == "bert":
            from transformers import BertConfig

            # dropout 0: a ZO step compares losses of the same forward at nearby points
            return BertConfig(
                vocab_size=self.vocab_size, hidden_size=self.d_model, num_hidden_layers=self.num_blocks,
                num_attention_heads=self.heads, intermediate_size=self.ffn_dim,
                hidden_act=self.activation, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                classifier_dropout=0.0, max_position_embeddings=self.max_positions, type_vocab_size=2,
                layer_norm_eps=1e-12, pad_token_id=0, num_labels=self.num_labels, use_cache=False,
                tie_word_embeddings=False)  # no LM head to tie; stated like every other family
        if self.family == "gemma3_text":
            from transformers import Gemma3TextConfig

            # Gemma-3-270M's layout (its checkpoint's config.json): 5 sliding-window layers
            # per full-attention layer, one KV head of width 256, two RoPE bases
            return Gemma3TextConfig(
                vocab_size=self.vocab_size, hidden_size=self.d_model, intermediate_size=self.ffn_dim,
                num_hidden_layers=self.num_blocks, num_attention_heads=self.heads, num_key_value_heads=1,
                head_dim=256, query_pre_attn_scalar=256, hidden_activation=self.activation,
                max_position_embeddings=self.max_positions, sliding_window=512,
                layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                             for i in range(self.num_blocks)],
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                rms_norm_eps=1e-6, attention_dropout=0.0, num_labels=self.num_labels, use_cache=False,
                pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=False)
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
    # Protocol Models' layout (one block per pipeline stage, §8.1) on 2 stages, wide enough that k
    # keeps tens of trainable dimensions at the paper's kind of compression (k / d of a few %).
    "llama-2x128": ModelPreset("llama", 2, 128, 344, 4, 256, 1024, "silu",
                               description="Llama, 2 blocks x 128 (one block per stage on 2 stages), byte-level vocab"),
    "llama-2x256": ModelPreset("llama", 2, 256, 688, 4, 256, 1024, "silu",
                               description="Llama, 2 blocks x 256 (one block per stage on 2 stages), byte-level vocab"),
    # Two blocks, split at the midpoint as Clapping's Table 3 splits LLaMA-2 7B (§5), wide enough
    # that Top-5 % keeps 12.8 values per token (the paper: about 205 of 4096).  OPT (LayerNorm,
    # learned positions), the family of the earlier tiny-opt comparison.
    "mini-opt": ModelPreset("opt", 2, 256, 1024, 4, 256, 512, "relu",
                            description="mini OPT, 2 blocks x 256, byte-level vocab (Clapping fine-tuning)"),
    # Paper-shaped models (synthetic weights unless a local directory is given).
    "opt-125m": ModelPreset("opt", 12, 768, 3072, 12, 50272, 2048, "relu",
                            description="OPT-125M shape (untied LM head)"),
    "opt-1.3b": ModelPreset("opt", 24, 2048, 8192, 32, 50272, 2048, "relu",
                            description="OPT-1.3B shape (untied LM head); for GPU memory runs"),
    "gpt2-124m": ModelPreset("gpt2", 12, 768, 3072, 12, 50257, 1024, "gelu_new",
                             description="GPT-2 small shape (untied LM head)"),
    # Real pretrained weights, installed from a package (nothing is downloaded at run time).
    "minilm-l6": ModelPreset("bert", 6, 384, 1536, 12, 30522, 512, "gelu", synthetic_weights=False,
                             task="classify", pretrained="minilm-l6",
                             description="all-MiniLM-L6-v2, pretrained BERT encoder (GELU FFN), CLS "
                                         "pooler + a fresh 2-class head"),
    # Opt-in (Gemma Terms of Use): the only real causal LM installable offline.  Classifies as
    # MeZO fine-tunes OPT: the template "<S> It was" and the label words terrible / great.
    "gemma3-270m": ModelPreset("gemma3_text", 18, 640, 2048, 4, 262144, 32768, "gelu_pytorch_tanh",
                               synthetic_weights=False, task="classify", pretrained="gemma3-270m",
                               prompt=PromptTemplate(" It was", (" terrible", " great")),
                               description="Gemma-3-270M (GeGLU FFN, Q4_K_M dequantised), prompt-based: "
                                           "'<tweet> It was' scored on ' terrible' / ' great' by the LM "
                                           "head's rows"),
}


def _preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(PRESETS)}") from None

