"""Spec strings -> codecs, and a decoder that needs nothing but the payload."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._core import (
    BUILTIN_IDS,
    FAMILY_NAMES,
    PARAM_SIZES,
    Codec,
    CodecError,
    Payload,
    as_payload_tensor,
    parse_header,
)
from .dense import DenseCodec
from .ids import IdsCodec
from .natural import NaturalCodec
from .quant import QChannelCodec, QStochCodec
from .sparse import RandKCodec, SparseCodec, TopKCodec
from .sparse_qstoch import SparseQStochCodec


def _dense(name: str) -> Callable[[dict[str, str]], Codec]:
    return lambda opts: DenseCodec(name)


_FACTORIES: dict[str, tuple[Callable[[dict[str, str]], Codec], tuple[str, ...]]] = {}
_FAMILY_CLASSES: dict[int, type[Codec]] = {}
_EXAMPLES: list[str] = []
_ID_CODECS: list[str] = []


def _register(name: str, codec_cls: type[Codec], param_size: int,
              factory: Callable[[dict[str, str]], Codec] | None, options: tuple[str, ...],
              ids: range) -> None:
    family = codec_cls.family
    if family not in ids:
        raise CodecError(f"register_codec: wire id {family} outside {ids.start}..{ids.stop - 1}")
    known = _FAMILY_CLASSES.get(family)
    if known is not None and known is not codec_cls:
        raise CodecError(f"register_codec: wire id {family} already used by {known.__name__}")
    if name in _FACTORIES and known is not codec_cls:
        raise CodecError(f"register_codec: codec name {name!r} already registered")
    PARAM_SIZES[family] = param_size
    FAMILY_NAMES.setdefault(family, name)
    _FAMILY_CLASSES[family] = codec_cls
    _FACTORIES[name] = (factory or (lambda opts: codec_cls()), tuple(options))


def _builtin(name: str, codec_cls: type[Codec], param_size: int,
             factory: Callable[[dict[str, str]], Codec] | None = None, options: tuple[str, ...] = (),
             examples: tuple[str, ...] = (), family: str | None = None, ids_only: bool = False) -> None:
    """One built-in codec: its name, class (wire id 1..31), parameter block size, options and
    example specs.  ``family`` names the wire id when several codecs share it (the dense ones)."""
    if family is not None:
        FAMILY_NAMES[codec_cls.family] = family
    _register(name, codec_cls, param_size, factory, options, BUILTIN_IDS)
    _EXAMPLES.extend(examples)
    if ids_only:
        _ID_CODECS.append(name)


# The built-in codecs, one registration each (parameter block layout in the comment).
for _name in ("identity", "fp32", "fp16", "bf16", "fp64"):
    _builtin(_name, DenseCodec, 1, _dense(_name), examples=(_name,), family="dense")  # transmit dtype code
_builtin("qstoch", QStochCodec, 5, QStochCodec.from_options, ("bits",),  # bits u8, delta f32
         examples=("qstoch:bits=4",))
_builtin("qchannel", QChannelCodec, 7, QChannelCodec.from_options,  # bits u8, flags u8, format u8, k u32
         ("bits", "signed", "granularity", "format", "index"),
         examples=("qchannel:bits=4", "qchannel:bits=4,signed=false,granularity=tensor",
                   "qchannel:bits=2,signed=auto", "qchannel:bits=4,granularity=token"))
_builtin("topk", TopKCodec, 7, TopKCodec.from_options, ("k", "ratio", "format", "index"),  # as sparse
         examples=("topk:k=16", "topk:ratio=0.1"))
_builtin("randk", RandKCodec, 7, RandKCodec.from_options, ("k", "ratio", "scaled", "format", "index"),  # as sparse
         examples=("randk:k=16,scaled=true", "randk:ratio=0.25,scaled=false"))
# value bits u8 (0 = raw dtype), flags u8, format u8, k u32
_builtin("sparse", SparseCodec, 7, SparseCodec.from_options, ("bits", "signed", "format", "index"),
         examples=("sparse", "sparse:bits=4"))
_builtin("sparse-qstoch", SparseQStochCodec, 9, SparseQStochCodec.from_options, ("bits",))  # bits u8, delta f32, nnz u32
_builtin("ids", IdsCodec, 4, IdsCodec.from_options, ("vocab",), ids_only=True)  # vocab - 1 u32
_builtin("natural", NaturalCodec, 1, lambda opts: NaturalCodec(), examples=("natural",))  # code width in bits u8

#: Codecs of integer token ids, not of float tensors (so not in ``CODECS``).
ID_CODECS: tuple[str, ...] = tuple(_ID_CODECS)

#: Built-in codec names for float tensors accepted by :func:`make_codec` (options
#: after ``name:``); :func:`register_codec` adds more.
CODECS: tuple[str, ...] = tuple(n for n in _FACTORIES if n not in ID_CODECS)

#: Example spec strings, one per codec.
EXAMPLE_SPECS: tuple[str, ...] = tuple(_EXAMPLES)


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


def decode(p: Payload | torch.Tensor | bytes, max_numel: int | None = None) -> torch.Tensor:
    """Decode any codec's payload from its bytes alone (the header names the codec).

    ``max_numel``: the most elements the receiver expects; a payload announcing more is
    refused before anything is allocated (see ``MAX_ELEMENTS_PER_BYTE`` for the fallback).
    """
    data = as_payload_tensor(p)
    hdr = parse_header(data, max_numel=max_numel)  # any family; it names the decoder
    cls = _FAMILY_CLASSES.get(hdr.family)
    if cls is None:
        raise CodecError(
            f"no decoder registered for codec id {hdr.family} ({FAMILY_NAMES.get(hdr.family)})"
        )
    return cls.decode_body(data, hdr)


def register_codec(
    name: str,
    codec_cls: type[Codec],
    param_size: int,
    factory: Callable[[dict[str, str]], Codec] | None = None,
    options: tuple[str, ...] = (),
) -> None:
    """Add a codec family defined outside this package, in one call, as the built-in ones are.

    ``codec_cls.family`` is its wire id (use 32..255; 1..31 are this package's) and
    ``param_size`` the fixed size of its header parameter block.  Afterwards :func:`make_codec`
    builds it from ``name[:options]`` (``factory(opts)`` gets the parsed options; default
    ``codec_cls()``) and :func:`decode` decodes its payloads.  Re-registering the same class is
    a no-op.
    """
    _register(name, codec_cls, param_size, factory, options, range(32, 256))
