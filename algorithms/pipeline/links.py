"""What crosses one direction of one pipeline link, seen from one end.

GRACE-style split: a *compressor* (a :class:`Codec`), an error-feedback
*memory* (:class:`SlotMemory` for Clapping, :class:`SampleMemory` for AQ-SGD)
and the *communication* (the channel's send / recv over the Comm; the plain
:class:`~algorithms.codecs.channel.Channel` is shared with the other
families).  Both ends of a link build the same channel; the sender compresses
once (its generator is the only randomness) and both ends apply the same
decoded message to their copy of the state, so the replicas stay identical
(spec §1.3, A5).

Channels know the current step through :meth:`Channel.begin_step`: which rows
of the batch are *fresh* (newly sampled) and which training samples they are.
A message is keyed by ``(micro-batch, tensor index)``; its rows are that
micro-batch's slice of the batch.
"""

from __future__ import annotations

import hashlib

import torch

from algorithms.codecs import Codec, DenseCodec, make_codec
from algorithms.codecs.channel import Channel, recv_decoded, send_encoded
from algorithms.codecs.dense import CAST_NAMES


def make_link_codec(spec: str | Codec) -> Codec:
    """A codec from its spec string (any of the library's, ``"natural"`` included)."""
    return make_codec(spec)


def lossless_for(codec: Codec, dtype: torch.dtype) -> bool:
    """True when the codec reproduces every tensor of ``dtype`` bit for bit."""
    if not isinstance(codec, DenseCodec):
        return False
    return codec.name == "identity" or CAST_NAMES[codec.name] in (dtype, torch.float64)


class StepRows:
    """Which rows of this step's batch are fresh, and their sample ids."""

    def __init__(self, fresh: torch.Tensor, sample_ids: torch.Tensor, micro_batches: int):
        self.fresh = fresh
        self.sample_ids = sample_ids
        self.rows = len(fresh) // micro_batches

    def slice(self, mb: int) -> slice:
        return slice(mb * self.rows, (mb + 1) * self.rows)


class SlotMemory:
    """Clapping: one state per (micro-batch slot, boundary tensor), whatever the dataset size.

    ``reset_fresh`` (Clapping-FU) makes fresh rows travel raw and reset the
    state to the exact value; FC never resets (spec Algorithm 2).
    """

    def __init__(self, reset_fresh: bool):
        self.reset_fresh = reset_fresh
        self.states: dict[tuple[int, int], torch.Tensor] = {}

    def get(self, key, rows: StepRows, mb: int, like: torch.Tensor) -> torch.Tensor:
        if key not in self.states:
            self.states[key] = torch.zeros_like(like)
        return self.states[key]

    def put(self, key, rows: StepRows, mb: int, value: torch.Tensor) -> None:
        self.states[key] = value

    def raw_rows(self, key, rows: StepRows, mb: int) -> torch.Tensor:
        fresh = rows.fresh[rows.slice(mb)]
        return fresh if self.reset_fresh else torch.zeros_like(fresh)

    def tensors(self) -> list[torch.Tensor]:
        return [self.states[k] for k in sorted(self.states)]


class SampleMemory:
    """AQ-SGD: one state per training sample (``N`` rows per boundary tensor), zero at start.

    With ``raw_first_visit`` a sample's first visit travels raw (the original
    AQ-SGD); by default its buffer starts at zero (spec A27).  Visits are
    counted per boundary tensor, so every tensor of a first visit travels raw.
    """

    def __init__(self, num_samples: int, raw_first_visit: bool = False):
        self.num_samples = num_samples
        self.raw_first_visit = raw_first_visit
        self.buffers: dict[int, torch.Tensor] = {}  # tensor index -> [N, ...]
        self.visited: dict[int, torch.Tensor] = {}  # tensor index -> [N] bool

    def _buffer(self, i: int, like: torch.Tensor) -> torch.Tensor:
        if i not in self.buffers:  # real memory: N samples' boundary tensors
            self.buffers[i] = torch.zeros((self.num_samples, *like.shape[1:]), dtype=like.dtype,
                                          device=like.device)
        return self.buffers[i]

    def get(self, key, rows: StepRows, mb: int, like: torch.Tensor) -> torch.Tensor:
        ids = rows.sample_ids[rows.slice(mb)]
        return self._buffer(key[1], like)[ids.to(like.device)]

    def put(self, key, rows: StepRows, mb: int, value: torch.Tensor) -> None:
        ids = rows.sample_ids[rows.slice(mb)]
        self._buffer(key[1], value)[ids.to(value.device)] = value
        self._visited(key[1])[ids] = True

    def _visited(self, i: int) -> torch.Tensor:
        if i not in self.visited:
            self.visited[i] = torch.zeros(self.num_samples, dtype=torch.bool)
        return self.visited[i]

    def raw_rows(self, key, rows: StepRows, mb: int) -> torch.Tensor:
        ids = rows.sample_ids[rows.slice(mb)]
        if self.raw_first_visit:
            return ~self._visited(key[1])[ids]
        return torch.zeros(len(ids), dtype=torch.bool)

    def tensors(self) -> list[torch.Tensor]:
        return [self.buffers[k] for k in sorted(self.buffers)]


class EFChannel(Channel):
    """Error feedback: send ``C(x - x̃)``, both ends set ``x̃ <- x̃ + C(x - x̃)``.

    Rows the memory marks raw (FU's fresh rows, AQ-SGD's first visits) go
    first, uncompressed in the lossless ``wire`` codec, and set ``x̃ = x``.
    With a lossless codec ``x̃ + (x - x̃) = x`` in exact arithmetic, so ``x``
    itself travels (same bytes) and float rounding cannot leak into the
    identity-compressor equivalence with ``pipeline-sgd``.
    """

    def __init__(self, codec: Codec, wire: Codec, memory, dtype: torch.dtype,
                 generator: torch.Generator | None = None):
        super().__init__(codec, generator)
        self.wire = wire
        self.memory = memory
        self.exact = lossless_for(codec, dtype)

    def send(self, comm, x, dst, tag, key) -> None:
        mb, rows = key[0], self.step
        x = x.detach()
        state = self.memory.get(key, rows, mb, x).clone()
        raw = self.memory.raw_rows(key, rows, mb).to(x.device)
        if bool(raw.any()):
            send_encoded(comm, self.wire, x[raw].cpu(), dst, tag)
            state[raw] = x[raw]
        kept = ~raw
        if bool(kept.any()):
            target = x[kept]
            if self.exact:
                send_encoded(comm, self.codec, target.cpu(), dst, tag)
                state[kept] = target
            else:
                payload = self.codec.encode((target - state[kept]).cpu(), generator=self.generator)
                comm.send(payload.data, dst, tag=tag)
                # the sender applies the decoded message, exactly as the receiver does
                state[kept] = state[kept] + self.codec.decode(payload).to(x.device)
        self.memory.put(key, rows, mb, state)

    def recv(self, comm, src, tag, key, device) -> torch.Tensor:
        mb, rows = key[0], self.step
        raw = self.memory.raw_rows(key, rows, mb)
        parts = {}
        if bool(raw.any()):
            parts["raw"] = recv_decoded(comm, self.wire, src, tag, self.max_numel).to(device)
        if bool((~raw).any()):
            parts["msg"] = recv_decoded(comm, self.codec, src, tag, self.max_numel).to(device)
        like = next(iter(parts.values()))
        state = self.memory.get(key, rows, mb, like.new_zeros((len(raw), *like.shape[1:]))).clone()
        raw = raw.to(device)
        if "raw" in parts:
            state[raw] = parts["raw"]
        if "msg" in parts:
            state[~raw] = parts["msg"] if self.exact else state[~raw] + parts["msg"]
        self.memory.put(key, rows, mb, state)
        return state.clone()


def state_digest(channel: Channel) -> float:
    """48 bits of the SHA-256 of a channel's EF state, as an exact float (for per-step logs)."""
    h = hashlib.sha256()
    for t in channel.memory.tensors():
        h.update(t.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
    return float(int(h.hexdigest()[:12], 16))


def state_nbytes(channel: Channel | None) -> int:
    if channel is None or channel.memory is None:
        return 0
    return sum(t.numel() * t.element_size() for t in channel.memory.tensors())
