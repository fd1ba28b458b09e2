"""The user-space pacer (``net="pacer"``): token buckets per link direction.

Anchors are closed forms written here: the time n bytes take at r bit/s
(8 n / r), tbf's bucket (one 250 Hz tick, at least 4 MTUs) and TCP/IP's
per-segment headers at MTU 1500.  No wall-clock time is asserted: the buckets
run on a fake clock, and the live run checks the waits the pacer computed.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.comm import run_threads
from harness.comm.pacer import LinkPacer, TokenBucket, tbf_burst_bytes, wire_bytes
from harness.config import ConfigError
from harness.registry import make_config


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _wire(payload: int, framing: int = 0) -> int:
    # 1448 data bytes per full TCP segment (MTU 1500, timestamps), 66 header bytes each
    data = payload + framing
    return data + 66 * max(1, -(-data // 1448))


@given(st.integers(0, 10**7), st.integers(0, 64))
def test_wire_bytes_closed_form(payload, framing):
    assert wire_bytes(payload, framing) == _wire(payload, framing)


@given(st.floats(1e5, 1e10), st.integers(1, 10**7))
def test_uplink_charges_rate_minus_bucket(rate, nbytes):
    clock = FakeClock()
    p = LinkPacer(rate, clock=clock, sleep=clock.sleep)
    burst = max(int(rate) // 8 // 250, 6000)
    assert tbf_burst_bytes(rate) == burst
    p.outgoing(nbytes)
    expect = max(0.0, (8 * nbytes - 8 * burst) / rate)
    assert math.isclose(p.waited_s, expect, rel_tol=1e-9, abs_tol=1e-12)
    # a second message right after queues behind the first: all of it is paid
    before = p.waited_s
    p.outgoing(nbytes)
    assert math.isclose(p.waited_s - before, 8 * nbytes / rate if expect > 0 else
                        max(0.0, (16 * nbytes - 8 * burst) / rate), rel_tol=1e-9, abs_tol=1e-12)


def test_downlink_is_free_when_idle_and_queues_on_fan_in():
    clock = FakeClock()
    rate, n = 8e6, 1_000_000  # 1 MB/s: n bytes take 1 s
    p = LinkPacer(rate, burst_bytes=0, clock=clock, sleep=clock.sleep)
    p.incoming(n)  # streamed through the sender's uplink in the last second: no extra wait
    assert p.waited_s == 0.0
    p.incoming(n)  # a second sender's message arriving at the same instant waits 1 s
    assert math.isclose(p.waited_s, 1.0)


@pytest.mark.parametrize("rate,burst,msg", [(0.0, 0, "rate_bps must be > 0"),
                                             (8e6, -1, "burst_bytes must be >= 0")])
def test_bucket_rejects_bad_rate_and_burst_with_exact_bounds(rate, burst, msg):
    # rate must be positive; an empty bucket (burst 0, every byte paid) is allowed
    with pytest.raises(ValueError, match=f"^{msg}$"):
        TokenBucket(rate, burst)
    assert TokenBucket(8e6, 0, FakeClock()).reserve(1_000_000) == 1.0  # 1 MB at 1 MB/s


def test_bucket_refills_while_idle():
    clock = FakeClock()
    b = TokenBucket(8e6, 500_000, clock)  # 1 MB/s, half a second of burst
    assert b.reserve(400_000) == 0.0
    clock.t += 10
    assert b.reserve(400_000) == 0.0
    assert math.isclose(b.reserve(400_000), 0.3)  # 0.8 MB queued, 0.5 MB of it covered by the bucket


def test_config_bandwidth_alone_means_pacer():
    cfg = make_config("pipeline-sgd", world_size=2, bandwidth="80mbit")
    assert cfg.net == "pacer" and cfg.paced_bps == 80e6
    assert make_config("pipeline-sgd", world_size=2, backend="gloo", net="netns",
                       bandwidth="80mbit").paced_bps is None  # the kernel shapes it
    with pytest.raises(ConfigError, match="--net pacer needs --bandwidth"):
        make_config("pipeline-sgd", world_size=2, net="pacer")


def test_paced_send_waits_what_the_closed_form_says():
    rate, n = 1e6, 50_000

    def body(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(n, dtype=torch.uint8), 1)
        else:
            comm.recv(0)
        return comm.pacer.waited_s

    w0, w1 = run_threads(2, body, bandwidth_bps=rate)
    assert math.isclose(w0, (8 * _wire(n, 16) - 8 * 6000) / rate, rel_tol=1e-9)
    assert w1 == 0.0  # the idle downlink carried the message while the uplink did: no second n / rate


def test_pacing_changes_time_only():
    kw = dict(world_size=2, model="tiny-llama", steps=2, batch_size=2, seq_len=8, micro_batches=1)
    from harness.launcher import run

    plain, paced = run(make_config("pipeline-sgd", **kw)), run(make_config("pipeline-sgd", bandwidth="1gbit", **kw))
    assert paced.config["net"] == "pacer"
    assert paced.metrics["payload_bytes_per_step"].value == plain.metrics["payload_bytes_per_step"].value
    assert paced.metrics["params_sha256"].value == plain.metrics["params_sha256"].value


def test_the_link_delays_the_bytes_not_the_sender():
    """A paced send returns at once: the message waits for its link in the sender thread, not in the
    caller.  Its release is seconds after the send returned (bytes over the rate, beyond the
    bucket), and the peer's mailbox is still empty then; it arrives whole, and the bucket's
    closed-form wait is what the link delayed it by."""
    rate, n = 1e6, 250_000  # 2 s of link time, 48 ms of it covered by the bucket

    def body(comm):
        if comm.rank == 0:
            payload = torch.arange(n, dtype=torch.int64).to(torch.uint8)
            comm.send(payload, 1)
            pending = comm.pacer.up.free_at - comm.pacer.up.burst_s - comm.pacer.clock()
            queued = len(comm.world.mail.get((0, 1), ()))
            payload.zero_()  # the caller may reuse its buffer at once
            comm.barrier()  # a synchronisation point: the message has left before it
            return pending, queued, comm.pacer.waited_s
        got = comm.recv(0)
        comm.barrier()
        return torch.equal(got, torch.arange(n, dtype=torch.int64).to(torch.uint8))

    (pending, queued, waited), ok = run_threads(2, body, bandwidth_bps=rate)
    assert pending > 1.0 and queued == 0
    assert math.isclose(waited, (8 * _wire(n, 16) - 8 * 6000) / rate, rel_tol=1e-9)
    assert ok


def test_a_message_the_bucket_covers_leaves_from_the_caller():
    """Through tbf, a message the bucket covers leaves at once: the caller posts it itself (it is in
    the peer's mailbox when ``send`` returns), and no sender thread is started for it."""
    import threading

    looked = threading.Event()

    def body(comm):
        if comm.rank == 0:
            comm.send(torch.ones(1000, dtype=torch.uint8), 1)  # 1,082 wire bytes, bucket 6,000
            queued, sender = len(comm.world.mail.get((0, 1), ())), comm._sender
            looked.set()
            return queued, sender, comm.pacer.waited_s
        assert looked.wait(comm.timeout_s)  # the peer receives only after rank 0 has looked into its mailbox
        return torch.equal(comm.recv(0), torch.ones(1000, dtype=torch.uint8))

    (queued, sender, waited), ok = run_threads(2, body, bandwidth_bps=1e6)
    assert (queued, sender, waited) == (1, None, 0.0) and ok


def test_a_released_message_never_overtakes_one_the_sender_thread_is_posting():
    """A message the bucket covers goes from the caller only behind an idle sender thread: while the
    thread is posting an earlier one (held here until the later one was sent), the later one queues
    behind it, and the peer receives both in order (tags checked).  The pacer runs on a fake clock."""
    import threading

    posting, go = threading.Event(), threading.Event()

    def body(comm):
        if comm.rank == 1:
            first, second = comm.recv(0, "first"), comm.recv(0, "second")
            comm.barrier()
            return first.numel(), second.numel()
        clock = FakeClock()
        comm.pacer = LinkPacer(1e6, clock=clock, sleep=clock.sleep)
        post = comm._send_frame

        def held(data, dst, taghash):
            if threading.current_thread().name.endswith("paced-send") and not go.is_set():
                posting.set()
                assert go.wait(60)
            post(data, dst, taghash)

        comm._send_frame = held
        comm.send(torch.zeros(56_000, dtype=torch.uint8), 1, "first")  # 0.4 s past the bucket: queued
        clock.t += 10.0  # the link has carried it: the sender thread posts it (within 0.4 s), held there
        assert posting.wait(60)
        comm.send(torch.zeros(100, dtype=torch.uint8), 1, "second")  # released at once
        go.set()
        comm.barrier()
        return None

    _, sizes = run_threads(2, body, bandwidth_bps=1e6)
    assert sizes == (56_000, 100)


def test_the_paced_benchmark_meters_a_steps_wire_bytes_and_ends_where_the_engine_does():
    """``benchmarks.paced_interleaved`` divides a shaped step by bounds computed from the bytes its
    shaped Comm metered over a step: those must be the step's wire bytes per direction (the
    closed form over the launcher run's payload per message), and every contestant on the whole
    batch must end where a launcher run of the engine does (pacing changes only time)."""
    from benchmarks.paced_interleaved import WARMUP, measure
    from benchmarks.pipelining_ratio import engine_config
    from harness.launcher import run

    kw = dict(steps=WARMUP + 2, seq_len=16, batch_size=8, micro_batches=4, seed=3)
    step, wire, idle, threads, shas = measure(engine_config("gpipe", **kw), {"80mbit": 80e6})
    rec = run(engine_config("gpipe", **kw))
    assert shas.keys() == {"unshaped", "shaped 80mbit"}
    assert set(shas.values()) == {rec.metrics["params_sha256"].value}
    per_message = rec.metrics["payload_bytes_per_step"].value / 8  # 4 micro-batches, each way
    assert per_message == int(per_message)
    assert wire["shaped 80mbit"] == (4 * _wire(int(per_message), 16),) * 2
    assert all(len(s) == 2 for s in step.values()) and threads.keys() == step.keys()
    assert idle.keys() == {"shaped 80mbit"} and idle["shaped 80mbit"] > 0  # probed between the rounds


def test_a_paced_receive_charges_the_downlink_a_frames_wire_bytes():
    # Two frames arriving at once: the second waits while the downlink carries the first, for
    # exactly its wire bytes (payload, framing, per-segment headers: the closed form of
    # pacer.wire_bytes) at the rate.  A fake clock, so no time passes between them.
    from harness.comm import FRAME_HEADER_BYTES, ThreadsWorld

    comm = ThreadsWorld(2, timeout_s=5.0).comm(0)
    slept = []
    comm.pacer = LinkPacer(8e6, burst_bytes=0, clock=lambda: 100.0, sleep=slept.append)
    n = 5000
    for _ in range(2):
        comm._received(1, "t", torch.zeros(n, dtype=torch.uint8))
    segments = math.ceil((n + FRAME_HEADER_BYTES) / 1448)
    assert slept == [pytest.approx((n + FRAME_HEADER_BYTES + 66 * segments) / 1e6, rel=1e-12)]
