"""AQ-SGD's per-sample error feedback against a dictionary reference keyed by sample id.

AQ-SGD (Wang et al. 2022, Algorithm 1) keeps one buffer ã(ξ) per training sample ξ
and boundary tensor; a visit of ξ sends m = C(a(ξ) − ã(ξ)) and both link ends set
ã(ξ) ← ã(ξ) + m.  With ``raw_first_visit`` the first visit of ξ sends a(ξ) itself
and sets ã(ξ) = a(ξ).

The algorithm's own data stream keeps every sample in one batch and one row
(``lazy.LazyData``: sample ``j*B + b`` is row ``b`` of batch ``j``), so it cannot
exercise a sample moving between rows, micro-batches or batch compositions.  This
check therefore drives the channels ``aq-sgd`` really builds
(``compressed.build_links``: ``EFChannel`` over ``SampleMemory``) with crafted
steps: each step draws a random subset of the samples in a random order, split
into micro-batches, two boundary tensors per micro-batch.  The reference below is
a plain dict ``(tensor, sample id) -> buffer row``, written from the algorithm's
definition, not from the project's buffers.  After every step every sample's
buffer on both link ends must equal the reference's, bit for bit.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.pipeline.compressed import AQParams, build_links
from algorithms.pipeline.links import SampleMemory, StepRows
from harness.comm.base import read_payload, written_payload
from harness.seeding import keyed_generator

TENSORS = 2  # boundary tensors per micro-batch (keys (mb, 0) and (mb, 1))
SHAPE = (3, 4)  # (seq, width) of one sample's row


class Loopback:
    """A FIFO transport between the two ends of one link (what a Comm does for one tag)."""

    def __init__(self):
        self.queue: deque = deque()
        self.sent = 0

    def send(self, data, dst, tag):
        self.queue.append(data.clone())
        self.sent += 1

    def recv(self, src, tag):
        return self.queue.popleft()

    def send_written(self, nbytes, write, dst, tag):  # a channel's lossless messages (Codec.writer)
        self.send(written_payload(nbytes, write), dst, tag)

    def recv_read(self, src, read, tag):  # and their receiving end (Codec.reader)
        return read_payload(self.recv(src, tag), read)


class Reference:
    """ã per (tensor, sample id) in a dict, zero until first written."""

    def __init__(self, codec, exact: bool, raw_first_visit: bool, generator):
        self.codec, self.exact, self.raw_first = codec, exact, raw_first_visit
        self.gen = generator  # the sender's codec stream: the only randomness of the link
        self.buf: dict[tuple[int, int], torch.Tensor] = {}
        self.seen: set[tuple[int, int]] = set()

    def get(self, i: int, sid: int, like: torch.Tensor) -> torch.Tensor:
        return self.buf.get((i, sid), torch.zeros_like(like))

    def message(self, i: int, sids: list[int], x: torch.Tensor) -> torch.Tensor:
        """Apply one message of tensor ``i`` for the rows ``sids``; return what the receiver holds."""
        raw = [self.raw_first and (i, s) not in self.seen for s in sids]
        kept = [r for r, is_raw in enumerate(raw) if not is_raw]
        out = torch.stack([self.get(i, s, x[0]) for s in sids])
        for r, is_raw in enumerate(raw):
            if is_raw:
                out[r] = x[r]
        if kept:
            target = x[kept]
            if self.exact:  # a lossless codec: ã + (a − ã) = a
                out[kept] = target
            else:
                residual = target - out[kept]
                m = self.codec.decode(self.codec.encode(residual, generator=self.gen))
                out[kept] = out[kept] + m
        for r, s in enumerate(sids):
            self.buf[(i, s)] = out[r].clone()
            self.seen.add((i, s))
        return out


def _steps(seed: int, n: int, batch: int, steps: int):
    """Sample ids per step: a random subset of the n samples in a random order."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randperm(n, generator=g)[:batch]


CASES = [
    ("qchannel:bits=2", torch.float32, False),
    ("qchannel:bits=3,granularity=tensor", torch.float64, True),
    ("qstoch:bits=3", torch.float32, True),
    ("topk:ratio=0.25", torch.float32, True),
    ("fp64", torch.float64, True),  # lossless: the buffer is the activation itself
]


@settings(max_examples=3)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.integers(2, 5))
@pytest.mark.parametrize("fwd,dtype,raw_first_visit", CASES)
def test_every_sample_buffer_equals_the_dictionary_reference(fwd, dtype, raw_first_visit, seed,
                                                             micro_batches, rows):
    n, steps, run_seed = 12, 8, seed % 1000
    batch = micro_batches * rows
    if batch > n:
        rows = n // micro_batches
        batch = micro_batches * rows
    p = AQParams(fwd=fwd, bwd="fp32", dataset_size=n, raw_first_visit=raw_first_visit)
    sender = build_links("aq-sgd", 0, 2, p, dtype, run_seed).fwd_out
    receiver = build_links("aq-sgd", 1, 2, p, dtype, run_seed).fwd_in
    ref = Reference(sender.codec, sender.exact, raw_first_visit,
                    keyed_generator(run_seed, "codec", "act", 0))  # the sender's stream (build_links)
    comm = Loopback()
    g = torch.Generator().manual_seed(seed + 1)
    for sids in _steps(seed, n, batch, steps):
        rows_ = StepRows(torch.ones(batch, dtype=torch.bool), sids, micro_batches)
        sender.begin_step(rows_)
        receiver.begin_step(rows_)
        for mb in range(micro_batches):
            part = sids[rows_.slice(mb)].tolist()
            for i in range(TENSORS):
                x = (torch.randn((rows, *SHAPE), generator=g, dtype=torch.float64) * (1 + i)).to(dtype)
                sender.send(comm, x, 1, "act", (mb, i))
                got = receiver.recv(comm, 0, "act", (mb, i), None)
                want = ref.message(i, part, x)
                assert torch.equal(got, want), f"received activation, sample ids {part}, tensor {i}"
        assert not comm.queue, "every payload sent was consumed"
        # after every step: every sample's buffer, on both ends, equals the reference
        for end in (sender, receiver):
            for i in range(TENSORS):
                buf = end.memory.buffers[i]
                for s in range(n):
                    want = ref.buf.get((i, s), torch.zeros(SHAPE, dtype=dtype))
                    assert torch.equal(buf[s], want), f"tensor {i} sample {s}"
    assert comm.sent >= steps * micro_batches * TENSORS


@given(st.integers(0, 2**32 - 1), st.sampled_from([torch.float32, torch.float64]))
def test_sample_memory_put_on_a_fresh_memory_stores_the_rows_at_their_sample_ids(seed, dtype):
    # The memory's contract apart from EFChannel's order of calls: a put needs no earlier get;
    # the buffer takes the value's dtype and row shape, every other sample stays zero.
    n, micro_batches = 7, 2
    g = torch.Generator().manual_seed(seed)
    sids = torch.randperm(n, generator=g)[:4]
    rows = StepRows(torch.ones(4, dtype=torch.bool), sids, micro_batches)
    memory = SampleMemory(n)
    value = torch.randn((2, *SHAPE), generator=g, dtype=torch.float64).to(dtype)
    memory.put((1, 0), rows, 1, value)
    want = torch.zeros((n, *SHAPE), dtype=dtype)
    want[sids[2:]] = value
    assert torch.equal(memory.buffers[0], want)
    assert torch.equal(memory.get((0, 0), rows, 1, value), value)
