"""Elias–Fano code of a strictly increasing list of ``k`` indices below ``n``.

Each index splits into its low ``l = floor(log2(n / k))`` bits, written as
``k`` fixed-width fields, and its high part ``h = index >> l``, written in
unary: the upper stream sets bit ``h_i + i`` for the ``i``-th index, so it
holds ``k`` ones among ``k + ((n - 1) >> l)`` bits.  The total is at most
``k * (2 + ceil(log2(n / k)))`` bits, within about two bits per index of
``log2 C(n, k)``, the information floor of a set of positions, at every
density; a bitmap (``n`` bits) and an index list (``k * ceil(log2 n)``) each
come near that floor only at one end of the density range (Elias 1974,
"Efficient storage and retrieval by content and address of static files";
Fano 1971).

Layout: the low fields, then the upper stream, each MSB-first
(:mod:`.bitpack`) and padded with zero bits to whole bytes.  The code of a
given index set is unique, so a decoder that also checks the count of ones,
the order and the range accepts exactly the encoder's outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from ._core import CodecError
from .bitpack import pack_bits, packed_nbytes, unpack_bits


def low_bits(n: int, k: int) -> int:
    """``l = floor(log2(n / k))`` for ``1 <= k <= n``; ``n // k`` has the same floor of log2."""
    return (n // k).bit_length() - 1


def sections(n: int, k: int) -> tuple[int, int]:
    """(low fields bytes, upper stream bytes) of ``k`` indices below ``n``."""
    if k == 0:
        return 0, 0
    lo = low_bits(n, k)
    return packed_nbytes(k, lo), packed_nbytes(k + ((n - 1) >> lo), 1)


def encode(idx: torch.Tensor, n: int, out: torch.Tensor) -> None:
    """Write the strictly increasing int64 indices ``idx`` (all below ``n``) into ``out``."""
    k = idx.numel()
    if k == 0:
        return
    lo = low_bits(n, k)
    lo_nbytes, _ = sections(n, k)
    if lo:
        pack_bits(idx, lo, out[:lo_nbytes])  # keeps the low ``lo`` bits of each index
    upper = np.zeros(k + ((n - 1) >> lo), dtype=np.uint8)
    upper[(idx.numpy() >> lo) + np.arange(k)] = 1
    pack_bits(torch.from_numpy(upper), 1, out[lo_nbytes:])


def decode(buf: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The ``k`` indices of an Elias–Fano section of exactly ``sum(sections(n, k))`` bytes."""
    if k == 0:
        return torch.empty(0, dtype=torch.int64)
    lo = low_bits(n, k)
    lo_nbytes, _ = sections(n, k)
    upper = unpack_bits(buf[lo_nbytes:], 1, k + ((n - 1) >> lo))
    ones = np.flatnonzero(upper.numpy())
    if ones.size != k:
        raise CodecError(f"corrupted body: Elias–Fano upper stream has {ones.size} ones, header says {k}")
    idx = torch.from_numpy((ones - np.arange(k)).astype(np.int64, copy=False) << lo)
    if lo:
        idx |= unpack_bits(buf[:lo_nbytes], lo, k)
    if int(idx[-1]) >= n:
        raise CodecError(f"corrupted body: Elias–Fano index {int(idx[-1])} out of range for {n} elements")
    if not bool((idx[1:] > idx[:-1]).all()):
        raise CodecError("corrupted body: Elias–Fano index list is not strictly increasing")
    return idx
