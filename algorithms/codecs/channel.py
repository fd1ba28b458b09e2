"""What crosses one direction of a link: a codec over a Comm's send / recv.

Every family sends its messages the same way: the sender encodes once with the
channel's codec (its generator is the only randomness), the Comm carries the
payload's bytes (what is counted is what is sent), and the receiver decodes
from those bytes alone.  Stateful variants (error feedback, the compressed
pipelines' ``EFChannel``) subclass :class:`Channel` and keep their memory
apart from the codec and the sending (GRACE-style split).
"""

from __future__ import annotations

import torch

from ._core import Codec, Payload

_HOST = (torch.device("cpu"), "cpu")


def send_encoded(comm, codec: Codec, x: torch.Tensor, dst: int, tag: str,
                 generator: torch.Generator | None = None) -> None:
    """``comm.send`` of ``codec.encode(x)``: written into the Comm's frame where the codec has
    a writer for ``x`` (``Codec.writer``), the same bytes either way."""
    written = codec.writer(x, generator)
    if written is None:
        comm.send(codec.encode(x, generator=generator).data, dst, tag=tag)
    else:
        comm.send_written(*written, dst, tag=tag)


def recv_decoded(comm, codec: Codec, src: int, tag: str, max_numel: int | None = None) -> torch.Tensor:
    """``codec.decode`` of ``comm.recv``'s payload: read where the Comm received it where the
    codec has a reader (``Codec.reader``), the same values and errors either way."""
    read = codec.reader(max_numel)
    if read is None:
        return codec.decode(Payload(comm.recv(src, tag=tag)), max_numel=max_numel)
    return comm.recv_read(src, read, tag=tag)


class Channel:
    """Direct transmission: the receiver uses ``C(x)``; no state (also the uncompressed case).

    ``key`` names the message within a step (the compressed pipelines use
    ``(micro-batch, tensor index)`` to find their memory); this channel ignores it.
    ``max_numel`` is the receiving end's expectation: the most elements a message on this
    channel may have (a stage knows its boundary shapes).  A payload announcing more is
    refused before its tensor is allocated, so a peer's header cannot make the receiver
    allocate beyond what it was waiting for; None falls back to the codecs' per-byte cap.
    """

    memory = None

    def __init__(self, codec: Codec, generator: torch.Generator | None = None,
                 max_numel: int | None = None):
        self.codec = codec
        self.generator = generator
        self.step = None
        self.max_numel = max_numel

    def begin_step(self, step) -> None:
        """The step's context for stateful channels (the pipelines' ``StepRows``)."""
        self.step = step

    def send(self, comm, x: torch.Tensor, dst: int, tag: str, key: tuple[int, int] | None = None) -> None:
        x = x.detach() if x.requires_grad else x  # not a no-op call per message: each is a dispatch
        x = x if x.is_cpu else x.cpu()
        send_encoded(comm, self.codec, x, dst, tag, self.generator)

    def recv(self, comm, src: int, tag: str, key: tuple[int, int] | None = None, device=None) -> torch.Tensor:
        x = recv_decoded(comm, self.codec, src, tag, self.max_numel)
        # not ``x.to(device)`` when it is already there: a no-op call per message is still a dispatch
        return x if device is None or (x.is_cpu and device in _HOST) else x.to(device)
