"""Spec strings -> codecs, and a decoder that needs nothing but the payload."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._core import (
    FAMILY_DENSE,
    FAMILY_IDS,
    FAMILY_NAMES,
    FAMILY_NATURAL,
    FAMILY_QCHANNEL,
    FAMILY_QSTOCH,
    FAMILY_RANDK,
    FAMILY_SPARSE,
    FAMILY_SPARSE_QSTOCH,
    FAMILY_TOPK,
    PARAM_SIZES,
    Codec,
    CodecError,
    Payload,
    as_payload_tensor,
    parse_header,
    peek_family,
)
from .dense import DenseCodec
from .ids import IdsCodec
from .natural import NaturalCodec
from .quant import QChannelCodec, QStochCodec
from .sparse import RandKCodec, SparseCodec, TopKCodec
from .sparse_qstoch import SparseQStochCodec


def _dense(name: str) -> Callable[[dict[str, str]], Codec]:
    return lambda opts: DenseCodec(name)


_FACTORIES: dict[str, tuple[Callable[[dict[str, str]], Codec], tuple[str, ...]]] = {
    "identity": (_dense("identity"), ()),
    "fp32": (_dense("fp32"), ()),
    "fp16": (_dense("fp16"), ()),
    "bf16": (_dense("bf16"), ()),
    "fp64": (_dense("fp64"), ()),
    "qstoch": (QStochCodec.from_options, ("bits",)),
    "qchannel": (QChannelCodec.from_options, ("bits", "signed", "granularity", "format", "index")),
    "topk": (TopKCodec.from_options, ("k", "ratio", "format", "index")),
    "randk": (RandKCodec.from_options, ("k", "ratio", "scaled", "format", "index")),
    "sparse": (SparseCodec.from_options, ("bits", "signed", "format", "index")),
    "sparse-qstoch": (SparseQStochCodec.from_options, ("bits",)),
    "ids": (IdsCodec.from_options, ("vocab",)),
    "natural": (lambda opts: NaturalCodec(), ()),
}

#: Codecs of integer token ids, not of float tensors (so not in ``CODECS``).
ID_CODECS: tuple[str, ...] = ("ids",)

#: Built-in codec names for float tensors accepted by :func:`make_codec` (options
#: after ``name:``); :func:`register_codec` adds more.
CODECS: tuple[str, ...] = tuple(n for n in _FACTORIES if n not in ID_CODECS)

#: Example spec strings, one per codec.
EXAMPLE_SPECS: tuple[str, ...] = (
    "identity",
    "fp32",
    "fp16",
    "bf16",
    "fp64",
    "qstoch:bits=4",
    "qchannel:bits=4",
    "qchannel:bits=4,signed=false,granularity=tensor",
    "qchannel:bits=2,signed=auto",
    "qchannel:bits=4,granularity=token",
    "topk:k=16",
    "topk:ratio=0.1",
    "randk:k=16,scaled=true",
    "randk:ratio=0.25,scaled=false",
    "sparse",
    "sparse:bits=4",
    "natural",
)

_FAMILY_CLASSES: dict[int, type[Codec]] = {
    FAMILY_DENSE: DenseCodec,
    FAMILY_QSTOCH: QStochCodec,
    FAMILY_QCHANNEL: QChannelCodec,
    FAMILY_SPARSE: SparseCodec,
    FAMILY_TOPK: TopKCodec,
    FAMILY_RANDK: RandKCodec,
    FAMILY_IDS: IdsCodec,
    FAMILY_SPARSE_QSTOCH: SparseQStochCodec,
    FAMILY_NATURAL: NaturalCodec,
}


def make_codec(spec: str | Codec) -> Codec:
    """Build a codec from ``"name"`` or ``"name:key=value,key=value"``.

    Names: identity, fp32, fp16, bf16, fp64, qstoch, qchannel, topk, randk,
    sparse, natural, sparse-qstoch, ids.  Unknown names, unknown options and bad values raise
    :class:`CodecError` naming the valid choices.
    """
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise CodecError(f"codec spec must be a string, got {type(spec).__name__}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in _FACTORIES:
        raise CodecError(f"unknown codec {name!r}; valid codecs: {', '.join(_FACTORIES)}")
    factory, valid = _FACTORIES[name]
    opts: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().lower()
            if not eq or not key or not value.strip():
                raise CodecError(f"{name}: option {item.strip()!r} is not key=value")
            if key in opts:
                raise CodecError(f"{name}: option {key!r} given twice")
            if key not in valid:
                allowed = ", ".join(valid) if valid else "none"
                raise CodecError(f"{name}: unknown option {key!r}; valid options: {allowed}")
            opts[key] = value.strip()
    codec = factory(opts)
    if opts:  # pragma: no cover - every valid option is consumed by the factories
        raise CodecError(f"{name}: unused options {sorted(opts)}")
    return codec


def decode(p: Payload | torch.Tensor | bytes) -> torch.Tensor:
    """Decode any codec's payload from its bytes alone (the header names the codec)."""
    data = as_payload_tensor(p)
    family = peek_family(data)
    hdr = parse_header(data, expect_family=family)
    cls = _FAMILY_CLASSES.get(family)
    if cls is None:
        raise CodecError(
            f"no decoder registered for codec id {family} ({FAMILY_NAMES.get(family)})"
        )
    return cls.decode_body(data, hdr)


def register_codec(
    name: str,
    codec_cls: type[Codec],
    param_size: int,
    factory: Callable[[dict[str, str]], Codec] | None = None,
    options: tuple[str, ...] = (),
) -> None:
    """Add a codec family defined outside this package.

    ``codec_cls.family`` is its wire id (use 33..255; 1..31 and 32, natural
    compression's, are this package's) and ``param_size`` the fixed size of its header parameter
    block.  Afterwards :func:`make_codec` builds it from ``name[:options]``
    (``factory(opts)`` gets the parsed options; default ``codec_cls()``) and
    :func:`decode` decodes its payloads.  Re-registering the same class is a no-op.
    """
    family = codec_cls.family
    if not 32 <= family <= 255:
        raise CodecError(f"register_codec: wire id {family} outside 32..255")
    known = _FAMILY_CLASSES.get(family)
    if known is not None and known is not codec_cls:
        raise CodecError(f"register_codec: wire id {family} already used by {known.__name__}")
    if name in _FACTORIES and known is not codec_cls:
        raise CodecError(f"register_codec: codec name {name!r} already registered")
    PARAM_SIZES[family] = param_size
    FAMILY_NAMES[family] = name
    _FAMILY_CLASSES[family] = codec_cls
    _FACTORIES[name] = (factory or (lambda opts: codec_cls()), tuple(options))
