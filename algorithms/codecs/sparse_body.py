"""Sparse body layout (dense / bitmap / index list), shared by the sparse codecs and ``qchannel``.

A body carries ``k`` selected entries of a flat tensor of ``n`` elements, each
value ``vb`` bits wide, in one of three formats (its code is in the header; sparse-qstoch
also writes its positions in a fourth, Elias–Fano, ``FMT_EF``):

========  ====  =========================================  ===============================
format    code  positions section                          values section
========  ====  =========================================  ===============================
dense     0     none (all ``n`` values are sent)           ``ceil(n*vb/8)``
bitmap    1     ``ceil(n/8)`` (1 bit per element, MSB-1st)  ``ceil(k*vb/8)``
coo       2     ``ceil(k*w/8)`` (sorted, ``w``-bit indices) ``ceil(k*vb/8)``
========  ====  =========================================  ===============================

The index width is ``w = max(1, ceil(log2 n))`` bits (``index=packed``, the
default: the ``ceil(log2 d)`` of the double-quantisation paper) or ``w = 32``
(``index=int32``, the SparQ spec's COO).  With ``format=auto`` the encoder sends
the cheapest of the three for this message, ties resolved in the order
dense, bitmap, coo, and records the choice in the header.  Index lists must be
strictly increasing and below ``n``, bitmaps must have exactly ``k`` set bits,
and padding bits must be zero; anything else is a :class:`CodecError`.

Values are either raw (``vb = 8*itemsize``, the little-endian bytes of the
tensor's own dtype) or ``b``-bit integer codes packed MSB-first.
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from . import elias_fano
from ._core import (
    INT_DTYPES,
    CodecError,
    Header,
    Payload,
    build_header,
    check_body_length,
    from_raw_bytes,
    make_payload,
    raw_bytes,
)
from .bitpack import pack_bits, packed_nbytes, unpack_bits

FMT_DENSE, FMT_BITMAP, FMT_COO = 0, 1, 2
#: Elias–Fano positions (:mod:`.elias_fano`): a positions section of sparse-qstoch's layouts;
#: ``sparse`` does not offer it (not a format of its options or headers).
FMT_EF = 3
FORMATS = {"dense": FMT_DENSE, "bitmap": FMT_BITMAP, "coo": FMT_COO}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
FORMAT_CHOICES = ("auto", "dense", "bitmap", "coo")
INDEX_CHOICES = ("packed", "int32")

FLAG_INDEX32 = 1
FLAG_SIGNED = 2  # sparse: packed values are two's complement; qchannel: signed quantiser


def _np(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a contiguous CPU tensor (bfloat16 as its int16 bits)."""
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def masked_select(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``t.reshape(-1)[mask]`` via numpy (several times faster than torch's bool indexing)."""
    flat = t.reshape(-1)
    sel = _np(flat)[mask.numpy()]
    if sel.size == 0:
        return torch.empty(0, dtype=t.dtype)
    vals = torch.from_numpy(sel)
    return vals.view(torch.bfloat16) if t.dtype == torch.bfloat16 else vals


def count_true(mask: torch.Tensor) -> int:
    return int(np.count_nonzero(mask.numpy()))


def mask_indices(mask: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.flatnonzero(mask.numpy()))


# --------------------------------------------------------------------------- layout
def index_width(n: int, int32: bool = False) -> int:
    """Bits per index: 32 for ``index=int32``, else ``max(1, ceil(log2 n))``."""
    return 32 if int32 else max(1, (n - 1).bit_length())


def section_nbytes(n: int, k: int, vbits: int, fmt: int, iw: int) -> tuple[int, int]:
    """(positions bytes, values bytes) of a sparse body, from the table above."""
    if fmt == FMT_DENSE:
        return 0, packed_nbytes(n, vbits)
    if fmt == FMT_BITMAP:
        return packed_nbytes(n, 1), packed_nbytes(k, vbits)
    if fmt == FMT_COO:
        return packed_nbytes(k, iw), packed_nbytes(k, vbits)
    if fmt == FMT_EF:
        return sum(elias_fano.sections(n, k)), packed_nbytes(k, vbits)
    raise CodecError(f"unknown sparse format code {fmt}")


def body_nbytes(n: int, k: int, vbits: int, fmt: int, iw: int) -> int:
    return sum(section_nbytes(n, k, vbits, fmt, iw))


def choose_format(n: int, k: int, vbits: int, iw: int, forced: int | None = None) -> int:
    """The cheapest format (ties: dense, bitmap, coo), unless one is forced."""
    if forced is not None:
        return forced
    costs = [body_nbytes(n, k, vbits, f, iw) for f in (FMT_DENSE, FMT_BITMAP, FMT_COO)]
    return costs.index(min(costs))


def parse_format_options(opts: dict[str, str], codec: str) -> tuple[int | None, bool]:
    fmt = opts.pop("format", "auto").strip().lower()
    if fmt not in FORMAT_CHOICES:
        raise CodecError(f"{codec}: format={fmt!r} is not one of {', '.join(FORMAT_CHOICES)}")
    index = opts.pop("index", "packed").strip().lower()
    if index not in INDEX_CHOICES:
        raise CodecError(f"{codec}: index={index!r} is not one of {', '.join(INDEX_CHOICES)}")
    return (None if fmt == "auto" else FORMATS[fmt]), index == "int32"


def format_options_spec(forced: int | None, int32: bool) -> list[str]:
    out = []
    if forced is not None:
        out.append(f"format={FORMAT_NAMES[forced]}")
    if int32:
        out.append("index=int32")
    return out


def encode_positions(
    fmt: int,
    n: int,
    iw: int,
    mask: torch.Tensor | None,
    idx: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """Write the positions section; give the selection as a bool mask or sorted indices."""
    if fmt == FMT_BITMAP:
        if mask is None:
            mask = torch.zeros(n, dtype=torch.bool)
            mask[idx] = True
        pack_bits(mask.view(torch.uint8), 1, out)
    elif fmt == FMT_COO:
        pack_bits(mask_indices(mask) if idx is None else idx, iw, out)
    elif fmt == FMT_EF:
        elias_fano.encode(mask_indices(mask) if idx is None else idx, n, out)


def decode_positions(fmt: int, n: int, k: int, iw: int, buf: torch.Tensor) -> torch.Tensor | None:
    """Sorted int64 indices of the ``k`` entries (None for the dense format)."""
    if fmt == FMT_DENSE:
        return None
    if fmt == FMT_BITMAP:
        bits = unpack_bits(buf, 1, n)
        idx = torch.from_numpy(np.flatnonzero(bits.numpy()))
        if idx.numel() != k:
            raise CodecError(f"corrupted body: bitmap has {idx.numel()} set bits, header says {k}")
        return idx
    if fmt == FMT_EF:
        return elias_fano.decode(buf, n, k)
    idx = unpack_bits(buf, iw, k).to(torch.int64)
    if k and (int(idx[-1]) >= n or int(idx[0]) < 0):
        raise CodecError(f"corrupted body: index out of range for {n} elements")
    if k > 1 and not bool((idx[1:] > idx[:-1]).all()):
        raise CodecError("corrupted body: index list is not strictly increasing")
    return idx


def pack_sparse_params(vbits: int, flags: int, fmt: int, k: int) -> bytes:
    return struct.pack("<BBBI", vbits, flags, fmt, k)


def check_format_code(fmt: int) -> None:
    """CodecError unless a header's format code is one ``sparse`` and ``qchannel`` offer (not
    sparse-qstoch's Elias–Fano, ``FMT_EF``)."""
    if fmt not in FORMAT_NAMES:
        raise CodecError(f"corrupted header: unknown sparse format code {fmt}")


def unpack_sparse_params(hdr: Header, allowed_flags: int) -> tuple[int, int, int, int]:
    vbits, flags, fmt, k = struct.unpack("<BBBI", hdr.params)
    if flags & ~allowed_flags:
        raise CodecError(f"corrupted header: unknown flag bits {flags:#x}")
    check_format_code(fmt)
    if k > hdr.numel:
        raise CodecError(f"corrupted header: {k} entries for {hdr.numel} elements")
    return vbits, flags, fmt, k


def write_raw_sparse(
    family: int,
    x: torch.Tensor,
    fmt: int,
    iw: int,
    flags: int,
    k: int,
    mask: torch.Tensor | None,
    idx: torch.Tensor | None,
    values: torch.Tensor | None,
) -> Payload:
    """Sparse payload with raw values; ``values`` are the k selected values in order."""
    n = x.numel()
    vbits = 8 * x.element_size()
    pos_n, val_n = section_nbytes(n, k, vbits, fmt, iw)
    header = build_header(family, x.dtype, tuple(x.shape), pack_sparse_params(0, flags, fmt, k))
    out, body = make_payload(header, pos_n + val_n)
    encode_positions(fmt, n, iw, mask, idx, body[:pos_n])
    if fmt == FMT_DENSE:
        dense = x.reshape(-1)
        if values is not None:  # the dense body carries only the selection, zeros elsewhere
            dense = torch.zeros_like(dense)
            if idx is None:
                idx = mask_indices(mask)
            dense[idx] = values
        body[pos_n:].copy_(raw_bytes(dense))
    else:
        if values is None:
            values = masked_select(x, mask) if mask is not None else x.reshape(-1)[idx]
        body[pos_n:].copy_(raw_bytes(values.contiguous()))
    return Payload(out)


def read_sparse(data: torch.Tensor, hdr: Header, allowed_flags: int) -> torch.Tensor:
    """Decode a sparse / top-k / rand-k payload (raw or packed integer values)."""
    vbits, flags, fmt, k = unpack_sparse_params(hdr, allowed_flags)
    n = hdr.numel
    dtype = hdr.dtype
    if vbits == 0:
        width = 8 * torch.empty((), dtype=dtype).element_size()
    else:
        if dtype not in INT_DTYPES or vbits > 8 * torch.empty((), dtype=dtype).element_size():
            raise CodecError(f"corrupted header: {vbits}-bit packed values for dtype {dtype}")
        width = vbits
    iw = index_width(n, bool(flags & FLAG_INDEX32))
    pos_n, val_n = section_nbytes(n, k, width, fmt, iw)
    check_body_length(data, hdr, pos_n + val_n)
    body = data[hdr.nbytes :]
    idx = decode_positions(fmt, n, k, iw, body[:pos_n])
    count = n if fmt == FMT_DENSE else k
    vbuf = body[pos_n:]
    if vbits == 0:
        vals = from_raw_bytes(vbuf, dtype, count)
    else:
        codes = unpack_bits(vbuf, vbits, count).to(torch.int64)
        if flags & FLAG_SIGNED:
            codes = codes - ((codes >> (vbits - 1)) << vbits)
        vals = codes.to(dtype)
    if idx is None:
        return vals.reshape(hdr.shape)
    out = torch.zeros(n, dtype=dtype)
    out[idx] = vals
    return out.reshape(hdr.shape)
