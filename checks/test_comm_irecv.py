"""Receives posted ahead of need (``Comm.irecv``): the same frames, checks, meter and
failures as a blocking ``recv``, in the order each peer sent them."""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.comm import CommError, run_threads
from harness.launcher import RankFailed

from ._gloo import run_gloo


def _payload(i: int, n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 7 + i).to(torch.uint8)


def _mixed_program(sizes, ahead, comm):
    """Rank 0 sends ``sizes`` to rank 1 under alternating tags; before taking message i, rank 1
    posts the receives up to message i + ahead[i] - 1, and takes message i through the handle
    (odd i) or ``recv`` (which takes the posted receive, or receives at once)."""
    tags = [f"t{i % 2}" for i in range(len(sizes))]
    if comm.rank == 0:
        for i, n in enumerate(sizes):
            comm.send(_payload(i, n), 1, tag=tags[i])
        return None, comm.meter.snapshot().total("sent"), comm.meter.snapshot().framing_bytes
    handles, got, nxt = {}, [], 0  # nxt: the first message not yet posted nor taken
    for i in range(len(sizes)):
        for j in range(max(nxt, i), min(len(sizes), i + ahead[i])):
            handles[j] = comm.irecv(0, tags[j])
            nxt = j + 1
        got.append(handles[i].wait() if i in handles and i % 2 else comm.recv(0, tags[i]))
    snap = comm.meter.snapshot()
    return got, snap.total("received"), snap.framing_bytes


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_posted_receives_deliver_and_meter_as_blocking_ones(data):
    sizes = data.draw(st.lists(st.integers(0, 3000), min_size=1, max_size=6))
    ahead = data.draw(st.lists(st.integers(0, 3), min_size=len(sizes), max_size=len(sizes)))
    _, (got, recv_total, framing) = run_threads(2, functools.partial(_mixed_program, sizes, ahead))
    _, (_, plain_total, plain_framing) = run_threads(2, functools.partial(_mixed_program, sizes,
                                                                          [0] * len(sizes)))
    assert all(torch.equal(g, _payload(i, n)) for i, (g, n) in enumerate(zip(got, sizes, strict=True)))
    assert (recv_total, framing) == (plain_total, plain_framing) == ((sum(sizes), len(sizes)), framing)


@pytest.mark.gloo
def test_gloo_posted_receives_match_threads():
    sizes, posted = [5000, 0, 70_000, 12, 3, 9], [3, 0, 2, 0, 1, 2]
    th = run_threads(2, functools.partial(_mixed_program, sizes, posted))
    gl = run_gloo(2, functools.partial(_mixed_program, sizes, posted), timeout_s=60)
    assert all(torch.equal(a, b) for a, b in zip(th[1][0], gl[1][0], strict=True))
    assert [r[1:] for r in th] == [r[1:] for r in gl]


def _neighbours_program(comm):
    """A middle rank posts receives from both neighbours, who send only after it sent to them."""
    r = comm.rank
    if r == 1:
        left, right = comm.irecv(0, "act"), comm.irecv(2, "grad")
        comm.send(_payload(1, 100), 2, "act")
        comm.send(_payload(2, 100), 0, "grad")
        return [right.wait().tolist(), left.wait().tolist()]
    peer_tag = ("grad", "act") if r == 0 else ("act", "grad")
    got = comm.recv(1, peer_tag[0])
    comm.send(_payload(3 + r, 50), 1, peer_tag[1])
    return got.tolist()


@pytest.mark.gloo
def test_gloo_a_rank_receives_from_both_neighbours_at_once():
    assert run_gloo(3, _neighbours_program, timeout_s=60) == run_threads(3, _neighbours_program)


def test_a_posted_receive_under_another_tag_is_an_error():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(4, dtype=torch.uint8), 1, tag="act")
        else:
            comm.irecv(0, "act")
            comm.recv(0, "grad")

    with pytest.raises(RankFailed, match="rank 1.*under 'act' was posted before it"):
        run_threads(2, prog, timeout_s=10)


def test_a_posted_receive_is_waited_on_once_in_order():
    def prog(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(4, dtype=torch.uint8), 1)
            comm.send(torch.zeros(4, dtype=torch.uint8), 1)
            return None
        first, second = comm.irecv(0), comm.irecv(0)
        with pytest.raises(CommError, match="out of order"):
            second.wait()
        first.wait()
        with pytest.raises(CommError, match="twice"):
            first.wait()
        with pytest.raises(CommError, match="is posted"):
            comm.recv_any([0])
        return second.wait().numel()

    assert run_threads(2, prog) == [None, 4]


def test_a_posted_receive_that_never_arrives_times_out_naming_the_peer():
    def prog(comm):
        if comm.rank == 1:
            comm.irecv(0, "act").wait()  # nobody sends

    with pytest.raises(RankFailed, match=r"rank 1.*recv from rank 0 timed out"):
        run_threads(2, prog, timeout_s=0.5)


def _dies_while_posted(report, fifo, comm):
    if comm.rank == 0:  # dies once rank 1 has posted its receive
        with open(fifo, "rb") as f:
            f.read()
        os._exit(7)
    t0 = time.monotonic()
    posted = comm.irecv(0, "act")
    with open(fifo, "wb") as f:
        f.write(b"x")
    try:
        posted.wait()
        msg = "no error"
    except CommError as e:
        msg = f"CommError: {e}"
    with open(report, "w") as f:
        f.write(f"{time.monotonic() - t0:.3f} {msg}")
    return msg


@pytest.mark.gloo
def test_gloo_peer_death_while_a_receive_is_posted_is_named_within_the_timeout(tmp_path):
    report, fifo = tmp_path / "rank1.txt", tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RankFailed, match="rank 0"):
        run_gloo(2, functools.partial(_dies_while_posted, str(report), str(fifo)), timeout_s=20)
    took, msg = report.read_text().split(" ", 1)
    assert msg.startswith("CommError: rank 1: recv from rank 0 failed"), msg
    assert float(took) < 20


def _buffers_program(comm):
    """Rank 1 holds a receive posted from rank 0 while it takes two longer frames from rank 2,
    one blocking and one posted; only then does rank 0 send its short frame.  A posted receive
    sharing a buffer with a blocking one or with another peer's would find the longer frame's
    bytes after the short one's end."""
    if comm.rank == 2:
        comm.send(_payload(20, 3000), 1, "b")
        comm.send(_payload(21, 2000), 1, "c")
        return None
    if comm.rank == 0:
        comm.recv(1, "go")
        comm.send(_payload(10, 100), 1, "a")
        return None
    short = comm.irecv(0, "a")
    first = comm.recv(2, "b")
    second = comm.irecv(2, "c").wait()
    comm.send(torch.zeros(1, dtype=torch.uint8), 0, "go")
    return [first.tolist(), second.tolist(), short.wait().tolist()]


@pytest.mark.gloo
def test_gloo_a_posted_receive_has_a_buffer_of_its_own():
    got = run_gloo(3, _buffers_program, timeout_s=60)
    assert got == run_threads(3, _buffers_program)
    assert got[1] == [_payload(20, 3000).tolist(), _payload(21, 2000).tolist(), _payload(10, 100).tolist()]
