"""Shaped runs in network namespaces: the kernel's byte count agrees with the
payload count, the step-by-step benchmark shapes and counts over them, and
nothing is left behind.  Needs root, ip and tc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.comm.pacer import tbf_burst_bytes
from harness.launcher import RankFailed, run
from harness.netns import NetnsTopology, leftover_namespaces, shape, unavailable_reason
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


def _qdisc(topo: NetnsTopology, rank: int) -> str:
    return subprocess.run(["ip", "netns", "exec", topo.ns(rank), "tc", "qdisc", "show", "dev",
                           topo.ifname(rank)], capture_output=True, text=True, check=True).stdout


def test_shape_puts_tbf_with_the_pacers_bucket_on_an_egress_and_takes_it_off():
    with NetnsTopology(2) as topo:
        assert "tbf" not in _qdisc(topo, 0)
        for rate, mtu, burst in ((10e6, 1500, 6000), (80e6, 1500, 40000), (10e6, 9000, 36000)):
            # 4 MTUs above one tick (5000 bytes at 10 Mbit/s), one tick above 4 MTUs at 80 Mbit/s
            assert tbf_burst_bytes(rate, mtu) == burst
            shape(topo.ifname(0), rate, **({} if mtu == 1500 else {"mtu": mtu}), ns=topo.ns(0))  # 1500: the default
            shown = _qdisc(topo, 0)
            assert "tbf" in shown and f"rate {int(rate / 1e6)}Mbit" in shown, shown
            assert f"burst {burst}b" in shown, shown
        assert "tbf" not in _qdisc(topo, 1)  # the other rank's egress is its own
        shape(topo.ifname(0), None, ns=topo.ns(0))
        assert "tbf" not in _qdisc(topo, 0)
        shape(topo.ifname(0), None, ns=topo.ns(0))  # nothing to take off is not an error
        # from inside the namespace (a benchmark's rank), with no namespace named
        subprocess.run(topo.exec_prefix(1) + [sys.executable, "-c", "from harness.netns import shape; "
                                              f"shape({topo.ifname(1)!r}, 2e6)"], check=True, cwd=os.getcwd())
        assert "rate 2Mbit" in _qdisc(topo, 1)
    assert _ours() == []


def test_the_benchmark_over_namespaces_counts_a_steps_bytes_on_the_veths_and_ends_where_the_engine_does():
    """``paced_interleaved --net netns``: its ranks enter their namespaces, the kernel shapes, and
    a direction's bytes are the receiving veth's counter over a step.  Those must cover the
    step's frames as TCP carries them (the closed form over the launcher run's payload per
    message) plus no more than what TCP's acknowledgements and gloo's rendezvous messages add;
    every contestant on the whole batch ends where a launcher run of the engine does."""
    from benchmarks.paced_interleaved import WARMUP, measure
    from benchmarks.pipelining_ratio import engine_config

    kw = dict(steps=WARMUP + 2, seq_len=16, batch_size=8, micro_batches=4, seed=3)
    with NetnsTopology(2) as topo:
        net = {"ns": [topo.ns(r) for r in range(2)], "ifname": [topo.ifname(r) for r in range(2)],
               "master": topo.addr(0)}
        step, wire, idle, threads, shas = measure(engine_config("gpipe", **kw), {"80mbit": 80e6}, net)
    assert _ours() == []
    rec = run(engine_config("gpipe", **kw))
    assert shas.keys() == {"unshaped", "shaped 80mbit"}
    assert set(shas.values()) == {rec.metrics["params_sha256"].value}
    per_message = rec.metrics["payload_bytes_per_step"].value / 8  # 4 micro-batches, each way
    data = int(per_message) + 16  # payload and framing, in full segments of 1448 data bytes
    frames = 4 * (data + 66 * -(-data // 1448))
    for direction in wire["shaped 80mbit"]:
        assert frames <= direction <= 1.25 * frames, (direction, frames)
    assert all(len(s) == 2 for s in step.values()) and threads.keys() == step.keys()
    assert idle.keys() == {"shaped 80mbit"} and idle["shaped 80mbit"] > 0  # probed between the rounds
