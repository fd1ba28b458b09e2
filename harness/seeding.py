"""Keyed seeds: a 64-bit seed, or a CPU ``torch.Generator``, from a run seed plus a key.

Every random stream of the harness and the algorithms that must not depend on
the order of draws (a parameter's initial value, a dataset's batch, a
perturbation, a codec's coin) gets its own generator, seeded by a hash of a
text naming it.  Conventions, which the existing streams fix (changing one
changes committed results, so each caller states its own):

* text: by default the parts joined by ``/`` after ``str()``; callers
  domain-separate their streams with a first part naming the owner
  (``"commbench.zo"``, ``"commbench.protocol"``, ``"commbench.models.init"``,
  ``"commbench.data.<dataset>"``; the pipeline's streams start with the seed);
  ``text=repr`` hashes ``repr(parts)``, the tuple's repr (data-parallel PS);
* digest: ``"sha256"``, the first 8 bytes of the digest, or ``"blake2b"`` with an
  8-byte digest (blake2b's digest size is a parameter of the hash, so this is not
  a truncation of the 64-byte one);
* the 8 bytes are read little-endian; ``bits=63`` drops the lowest bit
  (``>> 1``), keeping the seed below ``2**63``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch


def slash_text(parts: tuple) -> str:
    """The default key text: ``"/".join(str(p) for p in parts)``."""
    return "/".join(str(p) for p in parts)


_DIGESTS: dict[str, Callable[[bytes], bytes]] = {
    "sha256": lambda data: hashlib.sha256(data).digest()[:8],
    "blake2b": lambda data: hashlib.blake2b(data, digest_size=8).digest(),
}


def keyed_seed(*parts: object, text: Callable[[tuple], str] = slash_text, digest: str = "sha256",
               bits: int = 64) -> int:
    """A ``bits``-bit seed (64 or 63) from ``digest(text(parts))``, read little-endian."""
    if bits not in (63, 64):
        raise ValueError(f"bits must be 63 or 64, got {bits}")
    h = _DIGESTS[digest](text(parts).encode())
    return int.from_bytes(h, "little") >> (64 - bits)


def keyed_generator(*parts: object, text: Callable[[tuple], str] = slash_text,
                    digest: str = "sha256", bits: int = 64) -> torch.Generator:
    """A CPU generator seeded with :func:`keyed_seed` of the same arguments."""
    seed = keyed_seed(*parts, text=text, digest=digest, bits=bits)
    return torch.Generator(device="cpu").manual_seed(seed)
