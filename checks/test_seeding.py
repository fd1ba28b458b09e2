"""Keyed seeds (harness/seeding.py): each documented convention, written out with hashlib."""

import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.seeding import keyed_generator, keyed_seed

PARTS = st.lists(st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=8), st.floats(),
                           st.booleans(), st.none()), min_size=1, max_size=5).map(tuple)


@given(PARTS)
def test_default_is_sha256_of_the_slash_joined_parts(parts):
    text = "/".join(str(p) for p in parts)
    want = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    assert keyed_seed(*parts) == want


@given(PARTS)
def test_repr_blake2b_63_bits(parts):
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    assert keyed_seed(*parts, text=repr, digest="blake2b", bits=63) == int.from_bytes(h, "little") >> 1


@given(PARTS)
def test_generator_is_seeded_with_the_seed(parts):
    g = keyed_generator(*parts, text=repr, digest="blake2b", bits=63)
    assert g.initial_seed() == keyed_seed(*parts, text=repr, digest="blake2b", bits=63)
    assert torch.equal(torch.rand(4, generator=g),
                       torch.rand(4, generator=torch.Generator().manual_seed(g.initial_seed())))


def test_pinned_values_of_the_streams_in_use():
    """Values the model init, ZO, protocol and PS streams had before the helper existed."""
    assert keyed_seed("commbench.models.init", 7, 3) == 18250609511350054684
    assert keyed_seed("commbench.zo", "step", 9, 4, 1) == 5124223733586805775
    assert keyed_seed(12345, "x", 3, 7, text=repr, digest="blake2b", bits=63) == 4764668475141692280


def test_bad_conventions_raise():
    with pytest.raises(ValueError):
        keyed_seed(1, bits=32)
    with pytest.raises(KeyError):
        keyed_seed(1, digest="md5")
