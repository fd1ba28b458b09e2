"""The Fig. 2 study's pieces that need no model: its counts are the codec's, its clipped
scales are the documented ones, and its paper ratios come from the reference table (the
Gemma checkpoint's own checks are in ``test_gemma.py``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.codecs import fixpoint_quantize, make_codec, resolve_signed
from harness.experiments import SUPPORTING, get_experiment
from harness.experiments.registry import ORDER
from harness.experiments.sparq_activations import (
    CHOSEN,
    QUANTISERS,
    Quantiser,
    _scales,
    nonzero_codes,
    table1_relative,
)

seeds = st.integers(0, 2**32 - 1)


def gelu_batch(seed: int, rows: int = 40, cols: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 10.0 ** (2 * torch.rand(cols, generator=g) - 1)
    return torch.nn.functional.gelu(x)


@given(seeds, st.sampled_from([1, 2, 4, 8]), st.sampled_from([q for q in QUANTISERS if q.clip is None]))
def test_absmax_counts_are_the_codecs(seed, bits, q):
    x = gelu_batch(seed)
    codec = make_codec(f"qchannel:bits={bits},signed=auto,granularity={q.granularity}")
    assert nonzero_codes(x, bits, q) == int(torch.count_nonzero(codec.decode(codec.encode(x))))


@given(seeds, st.sampled_from([1, 2, 4, 8]), st.sampled_from(["tensor", "token", "channel"]))
def test_a_clip_at_the_100th_percentile_is_the_absmax(seed, bits, granularity):
    x = gelu_batch(seed)
    q = Quantiser("p100", granularity, "p100")
    want = fixpoint_quantize(x, bits, resolve_signed(x, None), granularity).nnz
    assert nonzero_codes(x, bits, q, _scales(x, q)) == want


def test_rms_clip_is_k_times_the_group_rms():
    x = torch.tensor([[3.0, -4.0], [0.0, 0.0]])
    assert float(_scales(x, Quantiser("t", "tensor", "2rms"))) == pytest.approx(2 * (25 / 4) ** 0.5, rel=1e-3)
    tok = _scales(x, Quantiser("t", "token", "1rms")).flatten().tolist()
    assert tok == pytest.approx([(25 / 2) ** 0.5, 0.0], rel=1e-3)


def test_table1_ratios_come_from_the_reference():
    assert table1_relative("OPT-1.3B") == pytest.approx({1: 0.31 / 1.2, 2: 0.58 / 1.2, 4: 1.0, 8: 2.32 / 1.2})


def test_registered_as_supporting_with_the_sparq_default():
    assert "sparq-activations" in SUPPORTING and "sparq-activations" not in ORDER
    assert not get_experiment("sparq-activations").paper
    from algorithms.zo import wire
    from algorithms.zo.sparq import SparQParams

    assert SparQParams().granularity == wire.GRANULARITY == CHOSEN.granularity and CHOSEN.clip is None
