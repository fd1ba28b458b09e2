"""Large frames whose size repeats travel as one gloo message, received into a buffer posted at
that size (``harness/comm/torchdist.py``: ``_SizeHistory``, ``_sized_buffer``).

Sender and receiver decide from the same history, so the receiver is never sent a message
longer than the buffer it posted; these checks count the transport messages against a model of
the rule written here, on ``recv``, posted receives and ``recv_any``, with every payload
compared byte for byte while the receiver holds all of them at once.  Forged messages where a
sized frame is due are in ``test_wire_hostile.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.comm.base import FRAME_HEADER_NBYTES, MAX_IN_FLIGHT_FRAMES
from harness.comm.torchdist import (
    FIRST_BUFFER_NBYTES,
    INLINE_MAX_PAYLOAD,
    SIZED_MIN_PAYLOAD,
    SPARE_FRAMES,
    _far_guard,
    _SizeHistory,
)

from ._gloo import run_gloo

P = SIZED_MIN_PAYLOAD  # the smallest payload a pair's history can expect


def _expected_sizes(sizes: list[int]) -> list[int | None]:
    """The rule, stated on the whole history: a frame is expected at the size of the two
    frames before it when they were equal and both at least SIZED_MIN_PAYLOAD, with no
    smaller frame after them."""
    out = []
    for i in range(len(sizes)):
        before = sizes[:i]
        ok = len(before) >= 2 and before[-1] == before[-2] and before[-1] >= SIZED_MIN_PAYLOAD
        out.append(before[-1] if ok else None)
    return out


def _messages(sizes: list[int]) -> list[int]:
    """Transport messages per frame: one when it fits the first buffer or is expected, else two."""
    return [1 if n <= INLINE_MAX_PAYLOAD or n == e else 2
            for n, e in zip(sizes, _expected_sizes(sizes), strict=True)]


_size = st.sampled_from([0, 7, INLINE_MAX_PAYLOAD, INLINE_MAX_PAYLOAD + 1, P - 1, P, P + 1, P + 9, 3 * P])


@given(sizes=st.lists(_size, max_size=12), other=st.lists(_size, max_size=6))
@example(sizes=[P, P, P, P - 1, P, P, 3 * P, 3 * P, 3 * P, P + 1], other=[P, P, P, P - 1])
@example(sizes=[P + 9, P + 9, 7, P + 9, P + 9, P + 9], other=[P + 9, P + 9, P + 9])
@example(sizes=[P, 7], other=[7])  # a small frame on a pair that never had a large one, while another has
def test_the_size_history_expects_what_the_rule_says_per_peer_and_tag(sizes, other):
    h = _SizeHistory()
    got = []
    for i, n in enumerate(sizes):
        got.append(h.expected(1, 7))
        h.record(1, 7, n)
        if i < len(other):  # another tag and another peer interleaved: their own histories
            h.record(1, 8, other[i])
            h.record(2, 7, other[i])
    assert got == _expected_sizes(sizes)
    seen = other[:len(sizes)]
    assert h.expected(1, 8) == h.expected(2, 7) == _expected_sizes(seen + [0])[len(seen)]


class _CountingPG:
    """The process group, with the payload length of each message sent counted."""

    def __init__(self, pg):
        self._pg, self.sent = pg, []

    def send(self, bufs, dst, tag):
        self.sent.append(bufs[0].numel())
        return self._pg.send(bufs, dst, tag)

    def recv(self, bufs, src, tag):
        return self._pg.recv(bufs, src, tag)

    def recv_anysource(self, bufs, tag):
        return self._pg.recv_anysource(bufs, tag)


def _payload(i: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def _stream(comm, sizes: list[int], posted: bool):
    """Rank 0 sends frames of ``sizes`` (distinct bytes each: a reused spare frame must carry the
    new ones) under one tag and a few under another; rank 1 takes them all, then compares.
    Rank 0 keeps no bytes in flight beyond the newest frame, so each older send is waited on at
    once and its frame is a spare when the next one is built, whatever the timing."""
    comm._pg = _CountingPG(comm._pg)
    if comm.rank == 0:
        comm.max_in_flight_bytes = 0
        spares = []
        for i, n in enumerate(sizes):
            comm.send(_payload(i, n), 1, "a")
            if i % 3 == 0:  # another tag between: its history is its own
                comm.send(_payload(-i, P), 1, "b")
            spares.append(len(comm._spare_frames))
        comm.barrier()
        return comm._pg.sent, (max(spares), comm._spare_frames == [])
    handles = []
    for i in range(len(sizes)):
        handles.append(comm.irecv(0, "a") if posted else comm.recv(0, "a"))
        if i % 3 == 0:
            handles.append(comm.irecv(0, "b") if posted else comm.recv(0, "b"))
    got = [h.wait() if posted else h for h in handles]
    comm.barrier()
    # a decoder views a payload as its elements (float64 at the widest): every payload starts
    # 8-byte aligned, whichever buffer it is a view of
    return got, all(g.storage_offset() % 8 == 0 and g.data_ptr() % 8 == 0 for g in got)


def _check_stream(res, sizes: list[int]) -> None:
    sent, (most_spares, spares_gone) = res[0]
    want, msgs = [], []
    b_sizes = [P] * len(range(0, len(sizes), 3))
    b_msgs = iter(_messages(b_sizes))
    for i, (n, m) in enumerate(zip(sizes, _messages(sizes), strict=True)):
        want.append(_payload(i, n))
        msgs.append(m)
        if i % 3 == 0:
            want.append(_payload(-i, P))
            msgs.append(next(b_msgs))
    assert res[1][1]
    assert len(res[1][0]) == len(want)
    for got, w in zip(res[1][0], want, strict=True):
        assert torch.equal(got, w)
    # one message of header, payload and end marker, or a 14-byte header and then the body
    framed = [n + 16 for n in (x.numel() for x in want)]
    expect = []
    for f, m in zip(framed, msgs, strict=True):
        expect += [f] if m == 1 else [14, f - 14]
    assert sent == expect
    assert most_spares == SPARE_FRAMES  # kept, and no more than that
    assert spares_gone  # a synchronisation point lets the spare frames go


_SEQUENCES = (
    [P, P, P, P, 3 * P, 3 * P, 3 * P, 5, P, P, P],
    [P + 1, P + 1, P, P, P, INLINE_MAX_PAYLOAD + 1, INLINE_MAX_PAYLOAD + 1, INLINE_MAX_PAYLOAD + 1, P, P, 0, P, P, P],
)


# a guard whose every byte tells its offset apart (mod 251, prime to the period): a wrong slice shows
_GUARD = bytes(i % 251 for i in range(FIRST_BUFFER_NBYTES))
_PERIOD = FIRST_BUFFER_NBYTES - FRAME_HEADER_NBYTES


@given(periods=st.integers(1, 40), before=st.integers(0, 40), width=st.integers(0, 40))
@example(periods=1, before=1, width=2)  # the last byte of a period, then the first of the next
def test_the_far_guard_repeats_the_first_guard_after_the_header(periods, before, width):
    # a sized buffer's guard slots far past the first buffer: the closed form, byte by byte, near
    # where the period wraps (``before`` bytes ahead of a multiple of it)
    lo = FIRST_BUFFER_NBYTES + periods * _PERIOD - before
    want = bytes(_GUARD[FRAME_HEADER_NBYTES + i % _PERIOD] for i in range(lo, lo + width))
    assert _far_guard(_GUARD, lo, lo + width) == want


@pytest.mark.gloo
@pytest.mark.parametrize("posted", [False, True], ids=["recv", "posted"])
def test_gloo_repeated_large_frames_travel_as_one_message(posted):
    for sizes in _SEQUENCES:
        _check_stream(run_gloo(2, functools.partial(_stream, sizes=sizes, posted=posted), timeout_s=60), sizes)


def _fan_in(comm, sizes: dict[int, list[int]]):
    """Ranks 1 and 2 send their sizes to rank 0, which takes everything with recv_any."""
    comm._pg = _CountingPG(comm._pg)
    if comm.rank:
        for i, n in enumerate(sizes[comm.rank]):
            comm.send(_payload(100 * comm.rank + i, n), 0, "up")
        comm.barrier()
        return comm._pg.sent
    got = [comm.recv_any([1, 2], "up") for _ in range(sum(len(s) for s in sizes.values()))]
    comm.barrier()
    return got


@pytest.mark.gloo
def test_gloo_recv_any_receives_sized_frames_of_several_senders():
    # two senders whose expected sizes differ by less than a slot and its guard (the buffer
    # guards both), and a third pattern: one sender sized, the other small and inline
    for sizes in ({1: [P] * 6, 2: [P + 3] * 6}, {1: [3 * P] * 5, 2: [5, 9, 0, 5, 7]}):
        res = run_gloo(3, functools.partial(_fan_in, sizes=sizes), timeout_s=60)
        for src in (1, 2):
            mine = [data for s, data in res[0] if s == src]
            assert len(mine) == len(sizes[src])
            for i, (data, n) in enumerate(zip(mine, sizes[src], strict=True)):
                assert torch.equal(data, _payload(100 * src + i, n))
            expect = []
            for n, m in zip(sizes[src], _messages(sizes[src]), strict=True):
                expect += [n + 16] if m == 1 else [14, n + 2]
            assert res[src] == expect



def _many_small_sends(comm, count: int):
    if comm.rank == 0:
        held = []
        for i in range(count):
            comm.send(_payload(i, 10), 1, "s")
            held.append(len(comm._sends))
        comm.barrier()
        return held
    got = [comm.recv(0, "s") for _ in range(count)]
    comm.barrier()
    return all(torch.equal(g, _payload(i, 10)) for i, g in enumerate(got))


@pytest.mark.gloo
def test_gloo_posted_sends_are_bounded_in_frames_as_well_as_bytes():
    # gloo's send work says it completed only once waited on: without the frame bound a rank
    # would hold every small frame up to the byte bound (64 MiB of them)
    count = 3 * MAX_IN_FLIGHT_FRAMES
    held, ok = run_gloo(2, functools.partial(_many_small_sends, count=count), timeout_s=60)
    assert ok
    assert held == [min(i + 1, MAX_IN_FLIGHT_FRAMES) for i in range(count)]


def _closed(comm):
    import torch.distributed as dist

    comm.close()  # leaves the process group
    return [k for k, v in vars(comm).items() if isinstance(v, dist.ProcessGroup)]


@pytest.mark.gloo
def test_gloo_a_closed_comm_holds_no_process_group():
    # A group object the Comm still held after the group was destroyed lived on until the
    # interpreter's exit, whose teardown then aborted the rank ("terminate called without an
    # active exception") after its result was written: one run in four under load.
    assert run_gloo(2, _closed, timeout_s=60) == [[], []]
