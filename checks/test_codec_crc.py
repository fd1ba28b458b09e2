"""The body CRC-32 (zlib-ng's, split across the codec pool when large) is zlib's CRC of the
whole body, and a flipped bit of a body large enough to be split is caught."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import CodecError, decode, make_codec
from algorithms.codecs._crc import PARALLEL_MIN_BYTES, crc32, crc32_combine


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_gives_the_crc_of_the_concatenation(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize(
    "n", [0, 1, 4097, PARALLEL_MIN_BYTES - 1, PARALLEL_MIN_BYTES, PARALLEL_MIN_BYTES + 1, 3 * PARALLEL_MIN_BYTES + 7]
)
def test_body_crc_is_zlibs(n, two_threads):
    buf = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert crc32(buf) == zlib.crc32(buf)


@pytest.mark.parametrize("spec", ["qstoch:bits=4", "fp32"])
def test_a_flipped_bit_of_a_split_body_is_caught(spec, two_threads):
    x = torch.randn(1 << 23, generator=torch.Generator().manual_seed(1))
    p = make_codec(spec).encode(x, torch.Generator().manual_seed(2))
    assert p.nbytes > PARALLEL_MIN_BYTES
    decode(p)
    for pos in (p.nbytes - 1, p.nbytes // 2 + 3, p.nbytes // 4):
        bad = p.data.clone()
        bad[pos] ^= 4
        with pytest.raises(CodecError, match="CRC"):
            decode(type(p)(bad))
