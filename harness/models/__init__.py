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

from harness.lazy import exports  # noqa: E402

# Names re-exported from the submodules, imported on first use: ``commbench list models``
# reads ``presets`` (torch-free) without building anything.
_EXPORTS = {
    "FAMILIES": "families", "FAMILY_SPECS": "families", "FamilySpec": "families", "family_spec": "families",
    "lm_loss": "loss", "PRESETS": "presets", "ModelPreset": "presets",
    "CUTS": "stages", "Stage": "stages", "TensorSpec": "stages", "build_stage": "stages",
    "default_boundaries": "stages", "max_stages": "stages", "model_info": "stages", "split_model": "stages",
    "ATTN_IMPLEMENTATION": "weights", "INIT_STD": "weights", "build_model": "weights", "init_value": "weights",
    "num_parameters": "weights", "save_weights": "weights",
}
__all__ = sorted(_EXPORTS)

__getattr__ = exports(__name__, _EXPORTS)
