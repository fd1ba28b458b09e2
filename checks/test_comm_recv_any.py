"""Comm.recv_any: receive from whichever of several ranks sends first.

Every message from every sender arrives once, with its true source and bytes,
in each sender's order; the meter counts it exactly like ``recv``; a tag
mismatch is still an error; a wait with no sender times out."""

from __future__ import annotations

import functools
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.comm import CommError, run_threads
from harness.launcher import RankFailed

from ._gloo import run_gloo

seeds = st.integers(0, 2**32 - 1)


def _payload(seed: int, src: int, i: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed((seed * 1000003 + src * 101 + i) % 2**63)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def _fan_in(comm, seed: int, sizes: list[int]):
    """Ranks 1.. each send len(sizes) messages to rank 0, which takes them with recv_any."""
    if comm.rank == 0:
        srcs = list(range(1, comm.world_size))
        got = [comm.recv_any(srcs, tag="fan") for _ in range(len(sizes) * len(srcs))]
        out = [(src, data) for src, data in got]
    else:
        for i, n in enumerate(sizes):
            comm.send(_payload(seed, comm.rank, i, n), 0, tag="fan")
        out = []
    snap = comm.meter.snapshot()
    return out, snap.total("sent"), snap.total("received"), snap.framing_bytes


def _check_fan_in(results, world: int, seed: int, sizes: list[int]) -> None:
    got = results[0][0]
    for src in range(1, world):
        mine = [data for s, data in got if s == src]
        assert len(mine) == len(sizes)  # all arrive, with the right source
        for i, (data, n) in enumerate(zip(mine, sizes, strict=True)):  # in the sender's order
            assert torch.equal(data, _payload(seed, src, i, n))
    sent_bytes = sum(r[1][0] for r in results[1:])
    sent_msgs = sum(r[1][1] for r in results[1:])
    assert results[0][2] == (sent_bytes, sent_msgs) == (sum(sizes) * (world - 1), len(sizes) * (world - 1))
    assert results[0][3] == sum(r[3] for r in results[1:])  # framing counted like recv


@given(seed=seeds, world=st.integers(2, 5), sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=5))
def test_recv_any_threads_all_arrive_with_source_and_meter(seed, world, sizes):
    res = run_threads(world, functools.partial(_fan_in, seed=seed, sizes=sizes), timeout_s=30)
    _check_fan_in(res, world, seed, sizes)


def test_recv_any_threads_takes_the_earliest_arrival():
    def prog(comm):
        if comm.rank == 0:
            return [comm.recv_any([1, 2], tag="a")[0] for _ in range(2)]
        if comm.rank == 2:  # rank 2 sends first, then lets rank 1 send
            comm.send(torch.zeros(1, dtype=torch.uint8), 0, tag="a")
            comm.send(torch.zeros(1, dtype=torch.uint8), 1, tag="go")
        else:
            comm.recv(2, tag="go")
            comm.send(torch.zeros(1, dtype=torch.uint8), 0, tag="a")
        return None

    assert run_threads(3, prog, timeout_s=30)[0] == [2, 1]


def _refused(comm, sender: int = 1, tag: str = "one", asked: str = "other"):
    """Rank ``sender`` sends rank 0 an empty payload (the header alone, so the receiver leaves no
    body unread) under ``tag``; rank 0 takes it with ``recv_any([1], asked)``.  Rank 0 returns
    the CommError's text, or "no error"."""
    out = None
    if comm.rank == sender:
        comm.send(torch.empty(0, dtype=torch.uint8), 0, tag=tag)
    elif comm.rank == 0:
        try:
            comm.recv_any([1], tag=asked)
            out = "no error"
        except CommError as e:
            out = f"CommError: {e}"
    comm.barrier()
    return out


def _times_out(comm, wait_s: float):
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            comm.recv_any([1])
        except CommError as e:
            return f"CommError: {e}", time.monotonic() - t0
        return "no error", 0.0
    time.sleep(wait_s)  # alive, but never sends
    return None


def test_recv_any_threads_tag_mismatch_and_timeout():
    res = run_threads(2, _refused, timeout_s=30)
    assert res[0].startswith("CommError") and "another tag" in res[0]
    with pytest.raises(RankFailed) as info:
        run_threads(2, _times_out_or_raise, timeout_s=1)
    assert "timed out" in str(info.value)


def _times_out_or_raise(comm):
    if comm.rank == 0:
        comm.recv_any([1])
    return None


def test_recv_any_argument_errors():
    def prog(comm):
        errs = []
        peer = 1 - comm.rank
        for srcs in ([], [comm.rank], [peer, peer], [7]):
            try:
                comm.recv_any(srcs)
            except ValueError as e:
                errs.append(str(e))
        return errs

    res = run_threads(2, prog, timeout_s=5)
    assert all(len(errs) == 4 for errs in res)


@pytest.mark.gloo
def test_recv_any_gloo_all_arrive_with_source_and_meter():
    world, seed, sizes = 4, 777, [0, 5, 3000, 1, 64]
    res = run_gloo(world, functools.partial(_fan_in, seed=seed, sizes=sizes), timeout_s=60)
    _check_fan_in(res, world, seed, sizes)
    th = run_threads(world, functools.partial(_fan_in, seed=seed, sizes=sizes), timeout_s=30)
    assert [r[1:] for r in th] == [r[1:] for r in res]  # same meter on both backends


@pytest.mark.gloo
def test_recv_any_gloo_tag_mismatch_and_timeout():
    res = run_gloo(2, _refused, timeout_s=30)
    assert res[0].startswith("CommError") and "another tag" in res[0]
    res = run_gloo(2, functools.partial(_times_out, wait_s=6.0), timeout_s=3)
    msg, waited = res[0]
    assert msg.startswith("CommError") and "timed out" in msg.lower(), msg
    assert waited < 30


@pytest.mark.gloo
def test_recv_any_gloo_refuses_a_frame_from_a_rank_it_was_not_asked_for():
    # rank 2 sends, rank 1 (the one asked) does not: gloo's receive from any source takes what
    # comes from any rank, and the Comm must refuse a frame from one it was not asked for
    res = run_gloo(3, functools.partial(_refused, sender=2, tag="t", asked="t"), timeout_s=30)
    assert res[0].startswith("CommError") and "from rank 2, which is not one of them" in res[0], res[0]
