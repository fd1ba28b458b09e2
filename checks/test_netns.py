"""Shaped runs in network namespaces: the kernel's byte count agrees with the
payload count, and nothing is left behind.  Needs root, ip and tc."""

from __future__ import annotations

import os

import pytest

from harness.launcher import RankFailed, run
from harness.netns import leftover_namespaces, unavailable_reason
from harness.registry import make_config

pytestmark = [pytest.mark.netns, pytest.mark.gloo,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=str(unavailable_reason()))]

COMMON = dict(model="tiny-opt", data="wiki-en", seed=3, batch_size=8, seq_len=64, micro_batches=2)


def _ours() -> list[str]:
    # namespaces created by this process's runs (other processes may be running their own)
    return [n for n in leftover_namespaces() if n.startswith(f"cb-{os.getpid()}-")]


def test_wire_bytes_match_payload_at_80mbit():
    cfg = make_config("pipeline-sgd", world_size=2, backend="gloo", net="netns", bandwidth="80mbit",
                      steps=4, **COMMON)
    rec = run(cfg)
    m = rec.metrics
    payload, wire = m["payload_bytes_per_step"].value, m["wire_bytes_per_step"].value
    assert payload > 100_000  # large enough that headers are a small share
    assert abs(wire - payload) <= 0.10 * payload, (wire, payload)
    assert _ours() == []


def test_namespaces_are_removed_after_a_failure():
    cfg = make_config("pipeline-sgd", world_size=2, backend="gloo", net="netns", steps=3,
                      inject_fault="1@1", timeout_s=20, **COMMON)
    with pytest.raises(RankFailed, match="rank 1"):
        run(cfg)
    assert _ours() == []
