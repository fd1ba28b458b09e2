"""Memory meters measure the rank: the tensor counter against closed-form storage
sizes, its per-thread attribution, identical peaks from two runs of a config, a
gloo rank's RSS peak that is its own (not the launcher's), and data loading
kept out of the measured window."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness import data as data_mod
from harness.launcher import run
from harness.rank_meters import TensorMemoryMeter, _status_kib
from harness.registry import make_config

TINY = dict(model="tiny-opt", data="synthetic-markov", steps=2, seed=3, batch_size=4, seq_len=16,
            micro_batches=2)


def test_counter_against_closed_form():
    m = TensorMemoryMeter()
    with m:
        a = torch.empty(1000, dtype=torch.float32)
        assert m.current == 4000
        v = a[::2].view(-1)  # a view shares the storage
        a.add_(1.0)  # in place: nothing new
        assert m.current == 4000
        b = a.to(torch.float64) * 2  # a temporary of 8000 bytes, then the result
        assert m.current == 4000 + 8000
        assert m.peak == 4000 + 8000 + 8000
        del b
        assert m.current == 4000
        assert m.reset_peak() == 4000 and m.peak == 4000
        del a
        assert m.current == 4000  # the view keeps the storage alive
        del v
        assert m.current == 0
        c = torch.empty(10, dtype=torch.float32)
        c.resize_(100)  # grown in place: recounted
        assert m.current == 400
    assert m.peak == 4000


@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=20), data=st.data())
def test_counter_tracks_any_allocation_order(sizes, data):
    m = TensorMemoryMeter()
    with m:
        held = [torch.empty(n, dtype=torch.int16) for n in sizes]
        assert m.current == m.peak == 2 * sum(sizes)
        order = data.draw(st.permutations(range(len(sizes))))
        for k, i in enumerate(order):
            held[i] = None
            assert m.current == 2 * sum(sizes[j] for j in order[k + 1:])
    assert m.peak == 2 * sum(sizes)


def test_counter_is_per_thread():
    meters = [TensorMemoryMeter(), TensorMemoryMeter()]
    sizes = [3000, 7000]
    barrier = threading.Barrier(2)
    keep = [None, None]

    def body(i):
        with meters[i]:
            barrier.wait()
            keep[i] = torch.empty(sizes[i], dtype=torch.uint8)
            barrier.wait()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [m.peak for m in meters] == sizes
    keep[0] = None  # freed outside the thread that made it: still subtracted from its meter
    assert meters[0].current == 0 and meters[1].current == sizes[1]


@pytest.mark.parametrize("algo, backend", [
    ("pipeline-sgd", "threads"),
    pytest.param("aq-sgd", "threads", marks=pytest.mark.slow),
    pytest.param("pipeline-sgd", "gloo", marks=pytest.mark.slow),
    pytest.param("aq-sgd", "gloo", marks=pytest.mark.slow),
    ("sparq", "threads"),  # the SparQ memory claims rest on these peaks (harness/experiments/sparq.py)
    pytest.param("sparq", "gloo", marks=pytest.mark.slow),
])
def test_same_config_same_peak_tensor_bytes(algo, backend):
    def peaks():
        rec = run(make_config(algo, world_size=2, backend=backend, memory="tensor", **TINY))
        return ([r["metrics"]["peak_tensor_bytes"].value for r in rec.per_rank],
                rec.metrics["peak_tensor_bytes"].value)

    first, second = peaks(), peaks()
    assert first == second
    per_rank, top = first
    assert top == max(per_rank) > 0
    # the stage holds at least its parameters (float32) for the whole window
    assert min(per_rank) > 4 * 10_000


def _meter_one_message(comm, nbytes: int, unread=None, settled: bool = False) -> int:
    """Rank 0 sends ``nbytes`` and returns what its meter holds over its payload afterwards;
    rank 1 returns what its meter gained by receiving.  With ``unread`` (a threading.Event, for
    the threads backend, whose send returns at once) rank 0 reads its meter while the message
    still waits unread, and sets it; rank 1 receives only then.  With ``settled`` rank 0 reads
    it after a barrier, a synchronisation point (a gloo send is posted and its frame held until
    the send completes: at the latest there)."""
    m = TensorMemoryMeter()
    with m:
        if comm.rank == 0:
            payload = torch.ones(nbytes, dtype=torch.uint8)
            base = m.current
            comm.send(payload, 1)
            if settled:
                comm.barrier()
            held = m.current - base  # unread: the message is in rank 1's mailbox, not yet received
            if unread is not None:
                unread.set()
            return held
        if unread is not None:
            assert unread.wait(comm.timeout_s)
        base = m.current
        got = comm.recv(0)
        gained = m.current - base
        assert got.numel() == nbytes
        if settled:
            comm.barrier()
        return gained


def test_threads_message_in_flight_is_counted_by_the_receiver_only():
    # On the threads backend a queued message counted by the sender would leave the sender's peak
    # to the scheduling of the receiving thread (harness/comm/threads.py: _in_flight).
    from harness.comm.threads import run_threads

    nbytes = 1_000_000
    held, gained = run_threads(2, partial(_meter_one_message, nbytes=nbytes, unread=threading.Event()))
    assert held == 0
    assert nbytes <= gained <= nbytes + 64  # the frame: payload and its end marker


def test_threads_a_received_payload_let_go_leaves_the_receivers_meter_while_the_sender_still_sends(monkeypatch):
    # The sender is held inside its send (where it waits at the in-flight bound, the world's lock
    # released) until the receiver has taken the payload and let it go: the receiver's meter must
    # be back where it was.  A reference the sender kept to the queued frame kept the storage the
    # receiver counted alive until the sender returned, so a run's peak depended on the threads.
    from harness.comm.threads import ThreadsComm, run_threads

    let_go = threading.Event()
    at_bound = ThreadsComm._wait_to_the_bound

    def held(self, wait_oldest):
        if self.rank == 1:
            assert self.world.cond.wait_for(let_go.is_set, timeout=self.timeout_s)
        at_bound(self, wait_oldest)

    monkeypatch.setattr(ThreadsComm, "_wait_to_the_bound", held)

    def body(comm):
        if comm.rank == 1:
            comm.send(torch.ones(10_000, dtype=torch.uint8), 0)
            return None
        m = TensorMemoryMeter()
        with m:
            base = m.current
            got = comm.recv(1)
            held_bytes = m.current - base
            del got
            left = m.current - base
        with comm.world.cond:
            let_go.set()
            comm.world.cond.notify_all()
        return held_bytes, left

    (held_bytes, left), _ = run_threads(2, body)
    assert held_bytes >= 10_000 and left == 0


@pytest.mark.gloo
def test_gloo_receive_scratch_is_not_a_ranks_tensor():
    # A gloo receiver's buffer is sized by the announced frame, never by max_frame_bytes (1 GiB):
    # a buffer of that size, counted, sat in every receiving rank's peak tensor bytes
    # (harness/comm/torchdist.py, module docstring).
    from ._gloo import run_gloo

    nbytes = 1_000_000
    held, gained = run_gloo(2, partial(_meter_one_message, nbytes=nbytes, settled=True))
    assert held == 0  # the sender's frame is gone once the send completed (by the barrier)
    # the payload's buffer (with its end marker and slack) and at most the buffer a frame's first
    # message lands in (the rank's receive scratch, counted once gloo writes into it): kilobytes,
    # not max_frame_bytes
    from harness.comm.torchdist import FIRST_BUFFER_NBYTES

    assert nbytes <= gained <= nbytes + FIRST_BUFFER_NBYTES + 1024


@pytest.mark.gloo
def test_gloo_an_inline_frame_counts_its_payload_not_the_receive_scratch():
    # A small frame arrives in the reused first buffer with its header; the payload is copied
    # out, and no tensor op touches the buffer itself: one such op (a slice of it, say) would
    # count its 64 KiB in the receiving rank's peak tensor bytes.
    from ._gloo import run_gloo

    nbytes = 1000
    held, gained = run_gloo(2, partial(_meter_one_message, nbytes=nbytes, settled=True))
    assert held == 0
    assert nbytes <= gained <= nbytes + 1024


def test_memory_pass_keeps_times_and_takes_tensor_peak():
    cfg = make_config("pipeline-sgd", world_size=2, memory="pass", **TINY)
    rec = run(cfg)
    same = run(make_config("pipeline-sgd", world_size=2, memory="tensor", **TINY))
    assert rec.metrics["peak_tensor_bytes"] == same.metrics["peak_tensor_bytes"]
    assert "separate memory pass" in rec.env["peak_tensor_source"]
    plain = run(make_config("pipeline-sgd", world_size=2, **TINY))
    assert "peak_tensor_bytes" not in plain.metrics
    assert plain.metrics["params_sha256"] == rec.metrics["params_sha256"]


def test_gloo_rank_rss_peak_is_its_own():
    # Inflate this (launching) process's high-water mark far above a rank's own
    # size; a rank reading a peak inherited through fork+exec reports at least it.
    ballast = torch.ones(768 * 2**20, dtype=torch.uint8)
    parent_hwm = _status_kib("VmHWM")
    if parent_hwm is None:
        pytest.skip("no /proc/self/status here")
    rec = run(make_config("pipeline-sgd", world_size=2, backend="gloo", **{**TINY, "steps": 1}))
    del ballast
    assert rec.env["peak_memory_source"].startswith("VmHWM after clear_refs")
    for r in rec.per_rank:
        assert 0 < r["metrics"]["peak_memory_bytes"].value < parent_hwm * 1024


def test_data_is_loaded_before_the_window():
    try:
        data_mod.get_dataset("wiki-en")
    except data_mod.DataUnavailableError as e:
        pytest.skip(str(e))
    cfg = make_config("fo-sgd", world_size=1, memory="tensor", **{**TINY, "data": "wiki-en"})
    data_mod._load_wiki_corpus.cache_clear()  # the run's first batch would decode the corpus
    cold = run(cfg).metrics["peak_tensor_bytes"].value
    warm = run(cfg).metrics["peak_tensor_bytes"].value
    assert cold == warm
