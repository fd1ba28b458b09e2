"""Models: presets, deterministic construction, and pipeline splitting.

Every model is a Hugging Face ``transformers`` causal LM built from a config
(nothing is ever downloaded).  The package is split by concern:

* :mod:`.families`: where each family (OPT, GPT-2, Llama) keeps its parts, one
  :class:`FamilySpec` per family, read by the zoo and by the algorithms;
* :mod:`.presets`: the named model shapes (:data:`PRESETS`);
* :mod:`.weights`: initialisation as a pure function of (seed, global
  parameter index), :func:`build_model`, local pretrained loading;
* :mod:`.adapters`: how each family's parts run, stage by stage;
* :mod:`.stages`: :func:`split_model` / :func:`build_stage`, cuts and
  boundaries, :func:`model_info`;
* :mod:`.loss`: :func:`lm_loss`.
"""

import os

# Stop transformers from ever reaching for the hub (we only build from configs and
# load from local directories).  Set before any submodule can import transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from .families import FAMILIES, FAMILY_SPECS, FamilySpec, family_spec  # noqa: E402
from .loss import lm_loss  # noqa: E402
from .presets import PRESETS, ModelPreset  # noqa: E402
from .stages import (  # noqa: E402
    CUTS,
    Stage,
    TensorSpec,
    build_stage,
    default_boundaries,
    max_stages,
    model_info,
    split_model,
)
from .weights import (  # noqa: E402
    ATTN_IMPLEMENTATION,
    INIT_STD,
    build_model,
    init_value,
    num_parameters,
    save_weights,
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "CUTS",
    "FAMILIES",
    "FAMILY_SPECS",
    "INIT_STD",
    "PRESETS",
    "FamilySpec",
    "ModelPreset",
    "Stage",
    "TensorSpec",
    "build_model",
    "build_stage",
    "default_boundaries",
    "family_spec",
    "init_value",
    "lm_loss",
    "max_stages",
    "model_info",
    "num_parameters",
    "save_weights",
    "split_model",
]
