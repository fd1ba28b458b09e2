"""The Comm contract: payloads arrive intact, the meter counts exactly what was
sent, collectives are bit-identical on every backend, and nothing hangs."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.comm import FRAME_HEADER_BYTES, CommError, CommTimeout, ThreadsWorld, run_threads
from harness.comm.base import read_payload
from harness.comm.progress_board import ProgressBoard
from harness.comm.torchdist import TorchDistComm, init_process_group_from_env
from harness.launcher import RankFailed

from ._gloo import run_gloo

seeds = st.integers(0, 2**32 - 1)


def _payload(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


# --------------------------------------------------------------------------- point to point
@given(seed=seeds, sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=6))
def test_send_recv_roundtrip_and_meter(seed, sizes):
    msgs = [_payload(seed + i, n) for i, n in enumerate(sizes)]

    def prog(comm):
        if comm.rank == 0:
            for i, m in enumerate(msgs):
                comm.send(m, 1, tag=f"t{i % 2}")
            got = None
        else:
            got = [comm.recv(0, tag=f"t{i % 2}") for i in range(len(msgs))]
        return got, comm.meter.snapshot()

    (_, snap0), (got, snap1) = run_threads(2, prog, timeout_s=30)
    assert all(torch.equal(a, b) for a, b in zip(msgs, got, strict=True))
    assert snap0.total("sent") == (sum(sizes), len(sizes))
    assert snap1.total("received") == (sum(sizes), len(sizes))
    assert snap0.framing_bytes == FRAME_HEADER_BYTES * len(sizes)
    t0 = sum(n for i, n in enumerate(sizes) if i % 2 == 0)
    assert snap0.by_tag().get("t0", (0, 0))[0] == t0
    # total() reads the sent direction by default and filters one tag when asked
    assert snap0.total() == snap0.total("sent")
    assert snap0.total("sent", tag="t0") == (t0, (len(sizes) + 1) // 2)
    assert snap1.total("received", tag="t1") == (sum(sizes) - t0, len(sizes) // 2)


@given(seed=seeds, before=st.lists(st.integers(0, 300), max_size=3),
       during=st.lists(st.integers(0, 300), min_size=1, max_size=3))
def test_a_window_is_the_difference_of_two_snapshots(seed, before, during):
    # A run's bytes are snapshot() - snapshot0 over its measured window
    # (harness/context.py); traffic before the window, here under tag "c", is
    # left out: by_tag() and to_rows() drop the flows with nothing in the window.
    def prog(comm):
        def burst(sizes, tag):
            for i, n in enumerate(sizes):
                if comm.rank == 0:
                    comm.send(_payload(seed + i, n), 1, tag=tag)
                else:
                    comm.recv(0, tag=tag)

        burst(before, "c")
        burst(before, "a")
        s0 = comm.meter.snapshot()
        burst(during, "a")
        burst(during[:1], "b")
        return comm.meter.snapshot() - s0

    w0, w1 = run_threads(2, prog, timeout_s=30)
    a, b, n = (sum(during), len(during)), (during[0], 1), len(during) + 1
    assert w0.total("sent") == (a[0] + b[0], n) == w1.total("received")
    assert w0.total("received") == (0, 0) == w1.total("sent")
    assert w0.framing_bytes == FRAME_HEADER_BYTES * n
    assert w0.by_tag() == {"a": a, "b": b}
    rows = sorted((r["src"], r["dst"], r["direction"], r["tag"], r["op"], r["bytes"], r["messages"])
                  for r in w1.to_rows())
    assert rows == [(0, 1, "received", "a", "recv", *a), (0, 1, "received", "b", "recv", *b)]


def test_sender_may_reuse_its_buffer():
    def prog(comm):
        if comm.rank == 0:
            buf = torch.zeros(8, dtype=torch.uint8)
            comm.send(buf, 1)
            buf += 7
            return None
        return comm.recv(0)

    _, got = run_threads(2, prog)
    assert torch.equal(got, torch.zeros(8, dtype=torch.uint8))


def test_a_comm_built_without_options_is_metered():
    # The Comm contract (harness/comm/base.py docstring): every operation is
    # metered unless metering is turned off explicitly.  Threads send() only
    # queues, so one thread can play both ranks.
    world = ThreadsWorld(2, timeout_s=5)
    c0, c1 = world.comm(0), world.comm(1)
    c0.send(torch.arange(5, dtype=torch.uint8), 1)
    assert torch.equal(c1.recv(0), torch.arange(5, dtype=torch.uint8))
    assert c0.meter.snapshot().total("sent") == (5, 1)
    assert c1.meter.snapshot().total("received") == (5, 1)


def test_tag_mismatch_is_an_error_not_a_wrong_decode():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(4, dtype=torch.uint8), 1, tag="act")
        else:
            comm.recv(0, tag="grad")

    with pytest.raises(RankFailed, match="rank 1.*another tag"):
        run_threads(2, prog, timeout_s=10)


def test_send_rejects_non_payloads_and_bad_peers():
    def prog(comm):
        with pytest.raises(TypeError):
            comm.send(torch.zeros(3), 1 - comm.rank)
        with pytest.raises(ValueError):
            comm.send(torch.zeros(3, dtype=torch.uint8), comm.rank)
        with pytest.raises(ValueError):
            comm.recv(5)
        # the in-place sends and receives name what was asked, as send and recv do
        with pytest.raises(ValueError, match=f"^send to rank {comm.rank + 2} is not a rank"):
            comm.send_written(1, _writes(torch.zeros(1, dtype=torch.uint8), []), comm.rank + 2)
        with pytest.raises(ValueError, match=f"^rank {comm.rank} cannot send to/from itself"):
            comm.send_written(1, _writes(torch.zeros(1, dtype=torch.uint8), []), comm.rank)
        with pytest.raises(ValueError, match="^recv from rank 5 is not a rank"):
            comm.recv_read(5, read_payload)
        return True

    assert run_threads(2, prog) == [True, True]


def test_recv_times_out_with_a_clear_error():
    t0 = time.monotonic()

    def prog(comm):
        if comm.rank == 1:
            comm.recv(0)  # nobody sends

    with pytest.raises(RankFailed, match=r"rank 1.*recv from rank 0 timed out"):
        run_threads(2, prog, timeout_s=0.5)
    assert time.monotonic() - t0 < 10


def test_a_raising_rank_releases_its_peers():
    t0 = time.monotonic()

    def prog(comm):
        if comm.rank == 2:
            raise ValueError("boom")
        comm.recv(2)  # would wait forever without the abort

    with pytest.raises(RankFailed, match=r"rank 2 failed: ValueError: boom"):
        run_threads(3, prog, timeout_s=60)
    assert time.monotonic() - t0 < 10  # released at once, not after the timeout


def test_a_rank_whose_comm_cannot_be_built_fails_the_run():
    # A Comm that cannot be built (here a bad option; in mutation testing, a
    # ByteMeter that raises, checks/MUTATION.md) is that rank's failure, reported
    # like any other, not a run left waiting for a rank that never ended.
    box = {}

    def call():
        try:
            run_threads(2, lambda comm: None, latency_ms=-1.0)
        except RankFailed as e:
            box["err"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout=120)  # a hang guard, not a speed bound: failing takes milliseconds
    assert not t.is_alive(), "run_threads hung on a rank whose Comm could not be built"
    assert "latency_ms must be >= 0" in str(box["err"])


# --------------------------------------------------------------------------- collectives
def _collective_body(seed: int, shape: tuple[int, ...], comm):
    g = torch.Generator().manual_seed(seed * 131 + comm.rank)
    x = torch.randn(shape, generator=g, dtype=torch.float32) * 10 ** (comm.rank - 1)
    s = comm.all_reduce(x, op="sum", tag="ar")
    mx = comm.all_reduce(x, op="max", tag="ar")
    parts = comm.all_gather(x, tag="ag")
    b = comm.broadcast(x if comm.rank == 1 else torch.zeros_like(x), src=1, tag="bc")
    comm.barrier()
    return {"x": x, "sum": s, "max": mx, "parts": parts, "b": b,
            "sent": comm.meter.snapshot().total("sent"), "received": comm.meter.snapshot().total("received"),
            "framing": comm.meter.snapshot().framing_bytes}


def _collective_program(seed: int, shape: tuple[int, ...]):
    return functools.partial(_collective_body, seed, shape)


def _check_collectives(res, world, shape):
    xs = [r["x"] for r in res]
    expected = xs[0].clone()
    for x in xs[1:]:
        expected += x  # rank order, the documented reduction order
    nbytes = xs[0].numel() * 4
    for rank, r in enumerate(res):
        assert torch.equal(r["sum"], expected)
        assert torch.equal(r["max"], torch.stack(xs).amax(0))
        assert all(torch.equal(a, b) for a, b in zip(r["parts"], xs, strict=True))
        assert torch.equal(r["b"], xs[1])
        # each rank delivers its bytes to W-1 peers per gather (2 all_reduce + 1 all_gather);
        # the broadcast source delivers to W-1 peers.
        per_peer = 3 * nbytes + (nbytes if rank == 1 else 0)
        msgs = 3 * (world - 1) + (world - 1 if rank == 1 else 0)
        assert r["sent"] == (per_peer * (world - 1), msgs)
        # each rank takes in W-1 peers' bytes per gather; every non-source rank takes in the
        # broadcast tensor once, as one message.
        got = 3 * nbytes * (world - 1) + (0 if rank == 1 else nbytes)
        assert r["received"] == (got, 3 * (world - 1) + (0 if rank == 1 else 1))
        assert r["framing"] == 0  # framing is counted for send/recv only (byte_meter docstring)
    # conservation: every byte sent is received somewhere, once
    assert sum(r["sent"][0] for r in res) == sum(r["received"][0] for r in res)


@given(seed=seeds, world=st.integers(2, 4), shape=st.sampled_from([(1,), (7,), (3, 5)]))
def test_collectives_threads(seed, world, shape):
    _check_collectives(run_threads(world, _collective_program(seed, shape), timeout_s=30), world, shape)


@pytest.mark.gloo
def test_collectives_gloo_equal_threads_bit_for_bit():
    world, shape, seed = 3, (64, 3), 12345
    th = run_threads(world, _collective_program(seed, shape), timeout_s=30)
    gl = run_gloo(world, _collective_program(seed, shape), timeout_s=60)
    _check_collectives(gl, world, shape)
    for a, b in zip(th, gl, strict=True):
        assert torch.equal(a["sum"], b["sum"]) and a["sent"] == b["sent"]


def _p2p_program(comm):
    out = []
    if comm.rank == 0:
        comm.send(torch.arange(10, dtype=torch.uint8), 1, tag="x")
        comm.send(torch.empty(0, dtype=torch.uint8), 1, tag="empty")
    else:
        out = [comm.recv(0, tag="x"), comm.recv(0, tag="empty")]
    return out, comm.meter.snapshot().total("sent"), comm.meter.snapshot().framing_bytes


@pytest.mark.gloo
def test_gloo_point_to_point_and_meter_match_threads():
    th = run_threads(2, _p2p_program)
    gl = run_gloo(2, _p2p_program, timeout_s=60)
    assert torch.equal(gl[1][0][0], torch.arange(10, dtype=torch.uint8))
    assert gl[1][0][1].numel() == 0
    assert [(r[1], r[2]) for r in th] == [(r[1], r[2]) for r in gl]


def test_a_one_rank_gloo_comm_in_this_process(tmp_path, monkeypatch):
    # The launcher's single-host rendezvous (a FileStore, harness/comm/torchdist.py
    # module docstring) and a rank's whole life, with one rank so no process is spawned.
    for k, v in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    assert init_process_group_from_env("gloo", 30, store_file=str(tmp_path / "store")) == (0, 1)
    try:
        comm = TorchDistComm("gloo", timeout_s=30, board=ProgressBoard.in_memory(1))
        assert comm.gather_bytes(b"abc") == [b"abc"]
        comm.barrier()
        comm.close()  # stops the heartbeat thread and leaves the group
        assert not dist.is_initialized()
        assert not [t for t in threading.enumerate() if t.name == "heartbeat0"]
        comm.close()  # closing again is a no-op, like closing a file twice
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_an_nccl_comm_lives_on_the_current_cuda_device(tmp_path, monkeypatch):
    # An nccl rank's buffers live on the CUDA device its process selected
    # (init_process_group_from_env sets it; TorchDistComm reads it back).  Run
    # here without a GPU: CUDA is faked as present with current device 1, the
    # group is a one-rank gloo group, and a CUDA allocation is made on "meta".
    for k, v in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    real_empty, asked = torch.empty, []

    def empty(*size, device=None, **kw):
        if device is not None and torch.device(device).type == "cuda":
            asked.append(torch.device(device))
            device = "meta"
        return real_empty(*size, device=device, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    init_process_group_from_env("gloo", 30, store_file=str(tmp_path / "store"))
    try:
        comm = TorchDistComm("nccl", timeout_s=30)
        assert comm.device == torch.device("cuda", 1)
        assert asked == [torch.device("cuda", 1)]  # the header buffer, on that device
        comm.close()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _times_out_on_a_silent_peer(fifo, waiter, silent, wait, comm, first=None):
    """Rank ``waiter`` runs ``wait(comm)``, which needs rank ``silent``; that rank (after
    ``first(comm)``, if given) stays alive and silent until the waiter gave up (a named pipe, not a
    sleep: had it exited, the wait would fail on the closed connection instead of timing out).
    The waiter returns its CommTimeout's text."""
    if comm.rank == silent:
        if first is not None:
            first(comm)
        with open(fifo, "rb") as f:
            f.read()
        return None
    if comm.rank != waiter:
        return None
    try:
        wait(comm)
    except CommTimeout as e:
        return str(e)
    finally:
        with open(fifo, "wb") as f:
            f.write(b"x")
    return "no timeout"


def _barrier(comm):
    comm.barrier()


def _recv_from_rank_1(comm):
    comm.recv(1)


@pytest.mark.gloo
def test_gloo_barrier_times_out_with_a_clear_error(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = run_gloo(2, functools.partial(_times_out_on_a_silent_peer, str(fifo), 0, 1, _barrier), timeout_s=1)
    assert out[0] == "rank 0: barrier timed out after 1 s"


@pytest.mark.gloo
def test_gloo_blocking_receive_timeout_names_the_peer_it_waited_for(tmp_path):
    """Rank 2 waits for rank 1 (not rank 0, where a wrong name could hide): its error says so."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # 3 s: the group's rendezvous of 3 spawned ranks on 2 busy cores has that long too
    out = run_gloo(3, functools.partial(_times_out_on_a_silent_peer, str(fifo), 2, 1, _recv_from_rank_1),
                   timeout_s=3)
    assert out[2] == "rank 2: recv from rank 1 timed out after 3 s"


def _header_of_a_large_frame_to_rank_2(comm):
    # past the Comm: a frame's header announcing a body (two messages), and no body
    import torch.distributed as dist

    from harness.comm.base import pack_frame_header, tag_hash
    from harness.comm.torchdist import INLINE_MAX_PAYLOAD

    header = pack_frame_header(INLINE_MAX_PAYLOAD + 1, tag_hash(""))
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8), 2)


@pytest.mark.gloo
def test_gloo_timeout_waiting_for_a_body_names_the_peer_it_waited_for(tmp_path):
    """Rank 1 sends rank 2 a large frame's header and no body: rank 2's wait for the body times
    out, naming rank 1."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = run_gloo(3, functools.partial(_times_out_on_a_silent_peer, str(fifo), 2, 1, _recv_from_rank_1,
                                        first=_header_of_a_large_frame_to_rank_2), timeout_s=3)
    assert out[2] == "rank 2: recv from rank 1 timed out after 3 s"


def _dies_program(comm):
    import os

    if comm.rank == 1:
        os._exit(7)  # a crash: the peer must not hang on its recv
    try:
        comm.recv(1)
    except CommError as e:
        return f"CommError: {e}"
    return "no error"


@pytest.mark.gloo
def test_gloo_peer_death_is_an_error_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_gloo(2, _dies_program, timeout_s=20)
    assert "rank 1" in str(info.value)
    assert time.monotonic() - t0 < 60


def _dies_with_sends_in_flight(report, fifo, comm):
    import os

    if comm.rank == 1:  # never receives; dies once rank 0 has posted its sends
        with open(fifo, "rb") as f:
            f.read()
        os._exit(7)
    t0 = time.monotonic()
    try:
        for _ in range(3):  # more than the sockets buffer: posted, in flight when the peer dies
            comm.send(torch.zeros(16 << 20, dtype=torch.uint8), 1)
        with open(fifo, "wb") as f:
            f.write(b"x")
        comm.barrier()  # a synchronisation point: waits for them
        msg = "no error"
    except CommError as e:
        msg = f"CommError: {e}"
    with open(report, "w") as f:
        f.write(f"{time.monotonic() - t0:.3f} {msg}")
    return msg


@pytest.mark.gloo
def test_gloo_peer_death_with_sends_in_flight_is_named_within_the_timeout(tmp_path):
    # The sends return before the peer took them (a blocking send would wait for it here
    # until the timeout); the barrier's wait for them names the dead peer.
    report, fifo = tmp_path / "rank0.txt", tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RankFailed, match="rank 1"):
        run_gloo(2, functools.partial(_dies_with_sends_in_flight, str(report), str(fifo)), timeout_s=20)
    took, msg = report.read_text().split(" ", 1)
    assert msg.startswith("CommError: rank 0: send to rank 1 failed"), msg
    assert float(took) < 20


def _exchange(frames: int, comm, ahead: int = 0, barrier: bool = False, max_bytes: int | None = None,
              device: torch.device | None = None):
    """Both ranks send ``frames`` frames of 116 bytes to the other, then receive as many: the
    in-flight bound lowered to 2 frames, or to ``max_bytes``.  ``ahead``: each first posts the
    receives of that many frames; ``barrier``: a barrier between the sends and the receives;
    ``device``: the payloads sent from there (checks/test_gpu.py)."""
    if max_bytes is not None:
        comm.max_in_flight_bytes = max_bytes
    else:
        comm.max_in_flight_frames = 2
    other = 1 - comm.rank
    sent = [_payload(10 * comm.rank + i, 100).to(device or "cpu") for i in range(frames)]
    try:
        posted = [comm.irecv(other, "x") for _ in range(ahead)]
        for t in sent:
            comm.send(t, other, "x")
        if barrier:
            comm.barrier()
        got = [p.wait() for p in posted] + [comm.recv(other, "x") for _ in range(frames - len(posted))]
    except CommError as e:
        return str(e)
    return [g.tolist() for g in got] == [_payload(10 * other + i, 100).tolist() for i in range(frames)]


def _on(backend: str, prog, timeout_s: float) -> list:
    return (run_gloo(2, prog, timeout_s=timeout_s) if backend == "gloo"
            else run_threads(2, prog, timeout_s=timeout_s))


def _stopped(backend: str, prog, *told: str) -> str:
    """Run ``prog``, whose ranks both stop at a wait, on ``backend`` (a timeout of 1 s on
    threads, 3 s on gloo, whose ranks start apart); the message of the rank that timed out
    saying all of ``told``.  Both ranks say it on threads; on gloo the rank whose wait runs out
    first closes the pair, and its peer's wait may end on that closed connection first (a
    CommError naming the peer), not on its own timeout."""
    timeout_s = 1 if backend == "threads" else 3
    msgs = _on(backend, prog, timeout_s)
    told = (f"timed out after {timeout_s} s", *told)
    full = [m for m in msgs if isinstance(m, str) and all(t in m for t in told)]
    assert (len(full) == 2) if backend == "threads" else (len(full) >= 1), msgs
    for m in msgs:
        assert m in full or (isinstance(m, str) and "send to rank" in m and "failed" in m), msgs
    return full[0]


@pytest.mark.parametrize("backend", ["threads", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_an_exchange_past_the_in_flight_bound_times_out_saying_why_on_every_backend(backend):
    # Up to the bound, sends are posted and both ranks reach their receives; one frame more
    # and each waits for a send the other has not received (gloo completes a send only once
    # its receive is posted, and the threads backend keeps the same bound, so that a program
    # that stops on gloo stops in the checks too).
    assert _on(backend, functools.partial(_exchange, 2), 20) == [True, True]
    msg = _stopped(backend, functools.partial(_exchange, 3), "send to rank",
                   "3 frames (348 bytes) were in flight", "max_in_flight_frames=2")
    assert ("a send completes only once its receive is posted (on every backend): a peer that sends to "
            "this rank past the bound before receiving waits for it in turn (receive between the "
            "sends, or raise the bound)") in msg, msg
    # a receive posted ahead completes the peer's oldest send: 3 frames pass; but receives from
    # a peer are posted to the transport one at a time, so 3 posted ahead do not let 4 pass
    assert _on(backend, functools.partial(_exchange, 3, ahead=1), 20) == [True, True]
    _stopped(backend, functools.partial(_exchange, 4, ahead=3), "3 frames (348 bytes) were in flight")
    # the byte bound likewise: up to it (2 frames, 232 bytes) the exchange passes, past it not,
    # by a frame or by a byte; one frame alone is never waited on, whatever its size
    assert _on(backend, functools.partial(_exchange, 2, max_bytes=232), 20) == [True, True]
    _stopped(backend, functools.partial(_exchange, 3, max_bytes=232), "3 frames (348 bytes) were in flight",
             "max_in_flight_bytes=232")
    _stopped(backend, functools.partial(_exchange, 2, max_bytes=231), "2 frames (232 bytes) were in flight",
             "max_in_flight_bytes=231")
    assert _on(backend, functools.partial(_exchange, 1, max_bytes=1), 20) == [True, True]


def test_the_in_flight_bound_is_at_least_one_frame_and_one_byte():
    world = ThreadsWorld(2)
    for kw in ({"max_in_flight_frames": 0}, {"max_in_flight_bytes": 0}):
        with pytest.raises(ValueError, match="max_in_flight_frames and max_in_flight_bytes must be >= 1"):
            world.comm(0, **kw)


def test_a_threads_send_waits_for_exactly_its_own_receive():
    # one thread drives both ends, the bound at 1 frame: each send waits for the frame before it,
    # which has completed once its receive (whichever way it was posted) was posted, and not before
    world = ThreadsWorld(2, timeout_s=0.2)
    a, b = world.comm(0, max_in_flight_frames=1), world.comm(1)
    f = [_payload(i, 10) for i in range(4)]
    posted = b.irecv(0)  # receive 0 posted before its frame was sent
    a.send(f[0], 1)
    a.send(f[1], 1)  # waits for frame 0: its receive is posted
    assert torch.equal(posted.wait(), f[0]) and torch.equal(b.recv(0), f[1])
    a.send(f[2], 1)  # waits for frame 1: received
    with pytest.raises(CommTimeout, match=r"2 frames \(52 bytes\) were in flight"):
        a.send(f[3], 1)  # waits for frame 2, whose receive nobody posted


def _fan_out(comm):
    """Rank 0, the bound at 3 frames, sends 1 frame to rank 1 and 3 to rank 2, then one more to
    rank 1; rank 2 receives one, then waits for rank 1, which waits for that last frame.  Only a
    count of frames per peer lets it through: the wait at the last send is for rank 2's first
    frame, whose receive is posted."""
    comm.max_in_flight_frames = 3
    x = torch.zeros(1, dtype=torch.uint8)
    try:
        if comm.rank == 0:
            for dst in (1, 2, 2, 2, 1):
                comm.send(x, dst)
        elif comm.rank == 1:
            comm.recv(0)
            comm.recv(0)
            comm.send(x, 2, "go")
        else:
            comm.recv(0)
            comm.recv(1, "go")
            comm.recv(0)
            comm.recv(0)
    except CommTimeout as e:
        return str(e)
    return True


@pytest.mark.parametrize("backend", ["threads", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_the_bound_counts_each_peer_s_frames_apart_on_every_backend(backend):
    prog = _fan_out
    assert (run_gloo(3, prog, timeout_s=20) if backend == "gloo" else run_threads(3, prog, timeout_s=20)) \
        == [True] * 3


def test_a_threads_send_after_a_peer_failed_says_why_it_was_aborted():
    world = ThreadsWorld(2)
    comm = world.comm(0)
    world.fail("rank 1 failed: boom")
    with pytest.raises(CommError, match=r"^rank 0: send aborted because rank 1 failed: boom$"):
        comm.send(torch.zeros(1, dtype=torch.uint8), 1)
    assert not world.mail  # nothing was queued


def _stream(frames: int, how: str, comm):
    """Rank 0 sends ``frames`` frames to rank 1, the bound lowered to 2 frames; rank 1 receives
    them ``how``: one blocking receive at a time, from any source, or all posted ahead first."""
    comm.max_in_flight_frames = 2
    sent = [_payload(i, 100) for i in range(frames)]
    try:
        if comm.rank == 0:
            for t in sent:
                comm.send(t, 1, "x")
            return True
        if how == "ahead":
            got = [p.wait() for p in [comm.irecv(0, "x") for _ in sent]]
        elif how == "any":
            got = [comm.recv_any([0], "x")[1] for _ in sent]
        else:
            got = [comm.recv(0, "x") for _ in sent]
    except CommTimeout as e:
        return str(e)
    return [g.tolist() for g in got] == [t.tolist() for t in sent]


@pytest.mark.parametrize("backend", ["threads", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_a_stream_past_the_bound_flows_as_its_receives_are_posted_on_every_backend(backend):
    # each receive posted, however it is posted, completes the oldest send: the sender passes
    # the bound as the receiver takes its frames
    for how in ("recv", "any", "ahead"):
        assert _on(backend, functools.partial(_stream, 6, how), 20) == [True, True], how


@pytest.mark.parametrize("backend", ["threads", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_a_collective_waits_for_the_sends_before_it_on_every_backend(backend):
    # a synchronisation point waits for every send posted before it: a barrier between sends
    # and their receives stops both ranks, on threads as on gloo
    msg = _stopped(backend, functools.partial(_exchange, 1, barrier=True))
    rank = int(msg.split(":")[0].split()[1])
    assert msg.startswith(f"rank {rank}: send to rank {1 - rank} timed out after"), msg
    assert "in flight" not in msg, msg  # the collective's wait, not the bound's


@settings(max_examples=5)
@given(latency=st.sampled_from([5.0, 20.0]))
def test_latency_is_injected_per_message(latency):
    def prog(comm):
        t0 = time.perf_counter()
        for _ in range(3):
            if comm.rank == 0:
                comm.send(torch.zeros(1, dtype=torch.uint8), 1)
            else:
                comm.recv(0)
        return time.perf_counter() - t0

    sender, _ = run_threads(2, prog, latency_ms=latency)
    assert sender >= 3 * latency / 1000  # a lower bound only: sleeping never ends early


def test_collective_slots_are_freed_once_every_rank_has_read_them():
    # Each collective parks the ranks' parts in a slot of the shared world until
    # all have read it; a slot that outlives its collective is a leak that grows
    # with every step of a long run (and would hand stale parts to a reused seq).
    def prog(comm):
        for i in range(5):
            comm.all_gather(torch.full((3,), float(comm.rank + i)))
            comm.broadcast(torch.arange(4.0), src=i % comm.world_size)
            comm.barrier()
        return comm.world

    worlds = run_threads(3, prog, timeout_s=30)
    assert worlds[0] is worlds[1] is worlds[2]
    assert worlds[0].slots == {}


def test_a_broadcast_is_metered_as_sent_to_the_peers_as_a_whole():
    # Flow.dst = -1 names a collective's peers as a whole (byte_meter.Flow): the
    # source records one flow to -1, each receiver one flow from the source to itself.
    def prog(comm):
        comm.broadcast(torch.arange(6.0), src=2)
        return comm.meter.snapshot().to_rows()

    rows = run_threads(3, prog, timeout_s=30)
    keys = [{(r["src"], r["dst"], r["direction"], r["op"]) for r in rs} for rs in rows]
    assert keys[2] == {(2, -1, "sent", "broadcast")}
    assert keys[0] == {(2, 0, "received", "broadcast")}
    assert keys[1] == {(2, 1, "received", "broadcast")}


def test_point_to_point_is_metered_per_peer_and_tag():
    # rank 0 sends to both peers under one tag and receives from both under another: each peer
    # is its own flow, with its own bytes (the Comm keeps one flow object per peer and tag)
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(3, dtype=torch.uint8), 1, "t")
            comm.send(torch.zeros(5, dtype=torch.uint8), 2, "t")
            comm.recv(1, "u")
            comm.recv(2, "u")
        else:
            comm.recv(0, "t")
            comm.send(torch.zeros(7 * comm.rank, dtype=torch.uint8), 0, "u")
        snap = comm.meter.snapshot()
        return snap.to_rows(), snap.framing_bytes

    (rows, framing), *_ = run_threads(3, prog, timeout_s=30)
    assert framing == 4 * FRAME_HEADER_BYTES  # two frames sent, two received
    flows = {(r["src"], r["dst"], r["direction"], r["tag"], r["op"]): (r["bytes"], r["messages"]) for r in rows}
    assert flows == {(0, 1, "sent", "t", "send"): (3, 1), (0, 2, "sent", "t", "send"): (5, 1),
                     (1, 0, "received", "u", "recv"): (7, 1), (2, 0, "received", "u", "recv"): (14, 1)}


def test_injected_latency_is_paid_once_per_message_by_the_sender(monkeypatch):
    import harness.comm.base as base

    slept = []
    monkeypatch.setattr(base.time, "sleep", slept.append)
    world = ThreadsWorld(2, timeout_s=5.0)
    comm = world.comm(0, latency_ms=7.0)
    comm.send(torch.zeros(3, dtype=torch.uint8), 1)
    comm.send(torch.zeros(3, dtype=torch.uint8), 1)
    comm.send_written(3, _writes(torch.zeros(3, dtype=torch.uint8), []), 1)  # a written one too
    assert slept == [0.007, 0.007, 0.007]


def _sends_to_a_peer_that_left(comm):
    comm.barrier()
    if comm.rank == 1:
        return []  # its Comm closes and its process ends
    errors, payload = [], torch.zeros(16, dtype=torch.uint8)
    deadline = time.monotonic() + 30
    while len(errors) < 2 and time.monotonic() < deadline:  # until the transport sees it gone
        try:
            comm.send(payload, 1, "x")
        except Exception as e:  # noqa: BLE001 - what is raised is what is checked
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_a_send_to_a_peer_that_left_is_a_comm_error_naming_it_at_posting_and_at_waiting():
    """Sends are posted and waited on later: the first send after the peer's process ended fails
    at a wait or at its posting, and every later one at its posting (the transport's pair holds
    the error).  Both must be a CommError naming the peer, not the backend's own exception."""
    errors = run_gloo(2, _sends_to_a_peer_that_left, timeout_s=60)[0]
    assert len(errors) == 2, errors
    for e in errors:
        assert e.startswith("CommError: rank 0: send to rank 1 failed"), e


# --------------------------------------------------------------------------- payloads written in place
#: inline, empty, one byte, past the first buffer (header then body), and a size repeated until
#: it travels as one message into a buffer posted at that size (harness/comm/torchdist.py)
_WRITTEN_SIZES = (0, 1, 5000, 70_000, 70_000, 70_000, 70_000, 200_000)


def _writes(m: torch.Tensor, calls: list):
    """A writer of ``m``'s bytes (not the codecs' writer): the first half through the view, the
    rest by address; recording the view's length."""
    def write(view: memoryview, address: int) -> None:
        calls.append(len(view))
        data, half = m.numpy().tobytes(), len(view) // 2
        view[:half] = data[:half]
        ctypes.memmove(address + half, data[half:], len(data) - half)
    return write


def _written_program(seed: int, comm):
    msgs = [_payload(seed + i, n) for i, n in enumerate(_WRITTEN_SIZES)]
    if comm.rank == 0:
        calls, paced = [], []
        if comm.pacer is not None:  # every paced message passes through the link's bucket
            release = comm.pacer.outgoing_release
            comm.pacer.outgoing_release = lambda n: paced.append(n) or release(n)
        for i, m in enumerate(msgs):  # every other one through send: the two mix in one stream
            if i % 2:
                comm.send(m, 1, tag=f"t{i % 3}")
            else:
                comm.send_written(m.numel(), _writes(m, calls), 1, tag=f"t{i % 3}")
        with pytest.raises(CommError, match="exceeds the maximum frame size"):  # refused unwritten
            comm.send_written(comm.max_frame_bytes + 1, _writes(msgs[0], calls), 1)
        comm.send_written(msgs[1].numel(), _writes(msgs[1], calls), 1)  # nothing of the refused one
        ok = calls == [m.numel() for m in [*msgs[::2], msgs[1]]]         # was posted; the default tag
        ok = ok and (comm.pacer is None or len(paced) == len(msgs) + 1)
    else:
        got = [comm.recv(0, tag=f"t{i % 3}") for i in range(len(msgs))] + [comm.recv(0)]
        ok = all(torch.equal(a, b) for a, b in zip([*msgs, msgs[1]], got, strict=True))
    snap = comm.meter.snapshot()
    ok = ok and {(f.src, f.dst) for f in snap.bytes} == {(0, 1)}  # metered between its two ranks
    return ok, snap.by_tag("sent" if comm.rank == 0 else "received"), snap.framing_bytes


@pytest.mark.parametrize("backend", ["threads", "threads paced", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_a_payload_written_in_place_arrives_and_is_metered_as_its_send_on_every_backend(backend):
    """``send_written`` carries the bytes its writer writes, into a view of exactly the payload's
    length, metered as ``send`` of them; one above the maximum frame size is refused before it is
    written or posted.  The meter's record per rank is that of the same payloads all sent with
    ``send``, anchored by the payloads the receiver compares."""
    prog = functools.partial(_written_program, 7)
    if backend == "threads paced":  # the paced sender holds a payload of its own
        got = run_threads(2, prog, timeout_s=60, bandwidth_bps=1e9)
    else:
        got = _on(backend, prog, timeout_s=60)
    assert [ok for ok, _, _ in got] == [True, True]
    sizes = [*_WRITTEN_SIZES, _WRITTEN_SIZES[1]]
    tags = [f"t{i % 3}" for i in range(len(_WRITTEN_SIZES))] + [""]
    expect = {t: (sum(n for n, u in zip(sizes, tags, strict=True) if u == t), tags.count(t)) for t in set(tags)}
    for _, by_tag, framing in got:
        assert by_tag == expect
        assert framing == FRAME_HEADER_BYTES * len(sizes)


class _ReaderFailed(Exception):
    pass


def _read_program(seed: int, comm):
    """Rank 0 sends; rank 1 takes every other payload with ``recv_read`` (the reader copies the
    view's bytes out itself), one of them behind a receive posted ahead, and one reader raises."""
    msgs = [_payload(seed + i, n) for i, n in enumerate(_WRITTEN_SIZES)]
    if comm.rank == 0:
        for i, m in enumerate(msgs):
            comm.send(m, 1, tag=f"t{i % 3}")
        comm.send(msgs[2], 1, tag="posted")
        comm.send(msgs[1], 1, tag="posted")
        comm.send(msgs[2], 1, tag="raises")
        comm.send(msgs[1], 1)
        return True, comm.meter.snapshot().bytes

    def read(view: memoryview, address: int) -> torch.Tensor:
        if ctypes.string_at(address, len(view)) != bytes(view):  # the address is the view's first byte
            raise AssertionError("the address and the view hold different bytes")
        return torch.from_numpy(np.frombuffer(bytes(view), dtype=np.uint8).copy())

    def fails(view: memoryview, address: int):
        raise _ReaderFailed(len(view))

    got = [comm.recv_read(0, read, tag=f"t{i % 3}") if i % 2 == 0 else comm.recv(0, tag=f"t{i % 3}")
           for i in range(len(msgs))]
    ahead = comm.irecv(0, tag="posted")
    got.append(comm.recv_read(0, read, tag="posted"))  # takes the posted receive
    with pytest.raises(CommError, match="waited on twice"):
        ahead.wait()
    got.append(comm.recv_read(0, read, tag="posted"))
    try:
        comm.recv_read(0, fails, tag="raises")
        raised = None
    except _ReaderFailed as e:
        raised = e.args[0]
    got.append(comm.recv_read(0, read))  # the stream goes on after it; the default tag
    ok = all(torch.equal(a, b) for a, b in zip([*msgs, msgs[2], msgs[1], msgs[1]], got, strict=True))
    return ok and raised == msgs[2].numel(), comm.meter.snapshot().bytes


@pytest.mark.parametrize("backend", ["threads", "threads paced", pytest.param("gloo", marks=pytest.mark.gloo)])
def test_a_payload_read_in_place_is_recv_s_payload_on_every_backend(backend):
    """``recv_read`` hands its reader a view of exactly the payload ``recv`` would return (an
    inline frame, one after its header, one into a buffer posted at its size, the empty one, one
    behind a receive posted ahead), metered as ``recv``; a reader's error is the caller's, and
    the next receive takes the next frame."""
    prog = functools.partial(_read_program, 11)
    if backend == "threads paced":
        got = run_threads(2, prog, timeout_s=60, bandwidth_bps=1e9)
    else:
        got = _on(backend, prog, timeout_s=60)
    assert [ok for ok, _ in got] == [True, True]
    sent, received = got[0][1], got[1][1]  # per flow: both ranks, direction and tag
    assert {f._replace(direction="received", op="recv"): n for f, n in sent.items()} == received
    assert {(f.src, f.dst) for f in sent} == {(0, 1)}
