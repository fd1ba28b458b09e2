"""One training step of a pipeline stage over the Comm, in one of two schedules.

``gpipe`` (the default): all micro-batches go forward, then all go backward in
the same order.  ``1f1b``: stage r runs ``S - 1 - r`` forwards ahead, then
alternates one forward and one backward, then drains the backwards; it holds
fewer micro-batches' activations.  In both, the backwards run in micro-batch
order 0, 1, ..., so the gradient accumulates exactly as the single-process
reference does (which makes all three bit-identical), and every link direction
carries the same messages in the same order.

In GPipe, while a stage computes micro-batch i it has already posted the
receive of i + 1's first messages (``Comm.irecv``; forward: activations from
r-1, backward: gradients from r+1), so their transfer overlaps the compute.
1F1B posts only the gradients' receives ahead.  With the activations' too, on gloo its
step was 1.17-1.24x ``Schedule1F1B``'s against 1.03-1.10x with none (an older Comm; 3.8 %
slower than the gradients' alone since), the extra CPU in
gloo's own threads, whose event loop then spins: 2.48M ``epoll_wait`` calls in 3 s against
8.5k reads, 394k with none (2 cores; ``benchmarks/results/netns-and-gloo-loop/``).  That
fits gloo's loop skipping a ready socket while the rank's main thread holds the pair's lock
to send, which a 1F1B stage does while its next input arrives (a GPipe stage receives, then
sends).  A gradient's receive, posted once the one before it arrived, is in place before
the next stage sends that gradient (a forward and a backward pass later), so the sender's
main thread writes it at once.  A gradient whose receive is not posted yet waits for the
receive's notice and leaves from the sender's transport thread, a round trip later: 160 of
1200 did when none was posted ahead, 8 of 1200 with the gradients' posted (``strace``, 300
steps).  That cut gloo's threads' CPU from 3.2-3.4 to 2.6-2.7 ms per step, and the engine's
1F1B read 0.982-0.993 of ``Schedule1F1B``'s step back to back in four runs, each interval
below 1.0, against 0.984-1.003 posting none (below 1.0 in three runs of seven); within one run,
0.989-1.007 of posting none (2 cores; ``benchmarks/results/grad-ahead/``).  The
channels take the posted receives in order (``Comm.recv`` takes a peer's
oldest posted receive first), so they do not change.  Each boundary tensor
crosses its link through a :class:`~.links.Channel`: forward under tag
"act", backward under tag "grad".  A channel may compress, keep
error-feedback state, or (lossless dense codec) be the uncompressed pipeline.

The link is straight-through for autograd: the next stage's input is the
*reconstructed* activation as a leaf, and its gradient (as reconstructed on
this side) is fed to ``backward`` of this stage's outputs (spec §2.4).

What a stage hands to the next is a :class:`Boundary` map.  The default sends
the stage's output tensors as they are; an algorithm whose boundary is a
function of them (Protocol Models: the k-dim coefficients plus the token ids,
``algorithms.protocol.pipeline``) supplies its own, and the schedule stays here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from algorithms.codecs import Codec
from harness.models import Stage, lm_loss

from .links import Channel


@dataclass
class LinkCodecs:
    forward: Codec  # activations, stage r -> r+1
    backward: Codec  # activation gradients, stage r+1 -> r


@dataclass
class StageLinks:
    """The four channel ends a stage can touch (None at the pipeline's ends)."""

    fwd_in: Channel | None = None  # activations from r-1 (link r-1)
    bwd_out: Channel | None = None  # gradients to r-1 (link r-1)
    fwd_out: Channel | None = None  # activations to r+1 (link r)
    bwd_in: Channel | None = None  # gradients from r+1 (link r)

    @classmethod
    def direct(cls, rank: int, world: int, codecs: LinkCodecs) -> StageLinks:
        first, last = rank == 0, rank == world - 1
        return cls(fwd_in=None if first else Channel(codecs.forward),
                   bwd_out=None if first else Channel(codecs.backward),
                   fwd_out=None if last else Channel(codecs.forward),
                   bwd_in=None if last else Channel(codecs.backward))

    def all(self) -> list[Channel]:
        return [c for c in (self.fwd_in, self.bwd_out, self.fwd_out, self.bwd_in) if c is not None]

    def expect(self, stage: Stage, input_ids: torch.Tensor) -> None:
        """Set the receiving ends' expectations for one micro-batch of ``input_ids``' shape:
        at most the largest tensor the stage takes in (forward) or hands on (backward)."""
        if self.fwd_in is not None:
            self.fwd_in.max_numel = stage.largest_numel(*input_ids.shape, side="input")
        if self.bwd_in is not None:
            self.bwd_in.max_numel = stage.largest_numel(*input_ids.shape, side="output")


@dataclass
class Arrival:
    """One micro-batch as a stage receives it."""

    leaves: tuple[torch.Tensor, ...]  # the received tensors; their gradients go back
    inputs: tuple[torch.Tensor, ...]  # what the stage is called with
    tokens: torch.Tensor | None = None  # the micro-batch's token ids, where the boundary carries them


#: The tags whose receives of micro-batch i + 1 a schedule posts while it computes i (module
#: docstring: 1F1B, the gradients' only).  Data, so a benchmark can time the other choices.
POSTS_AHEAD = {"gpipe": ("act", "grad"), "1f1b": ("grad",)}


def schedule_ops(schedule: str, rank: int, world: int, micro_batches: int) -> Iterator[tuple[str, int]]:
    """The stage's ops in order: ``("F", mb)`` forward, ``("B", mb)`` backward (``schedule`` one
    of :data:`.params.SCHEDULES`, validated with the run's parameters)."""
    ahead = {"gpipe": micro_batches, "1f1b": min(world - 1 - rank, micro_batches)}[schedule]
    yield from (("F", mb) for mb in range(ahead))
    for mb in range(micro_batches - ahead):
        yield "F", ahead + mb
        yield "B", mb
    yield from (("B", mb) for mb in range(micro_batches - ahead, micro_batches))


class Boundary:
    """The boundary map of a link: the stage's outputs cross as they are, one message each
    under key ``(micro-batch, tensor index)`` (pipeline-sgd and the compressed pipelines)."""

    def first_messages(self, stage: Stage) -> int:
        """How many messages a micro-batch's arrival takes at least (each tensor one at least,
        error feedback may add a raw one): the receives the engine posts ahead."""
        return len(stage.input_names)

    def send(self, comm, channel: Channel, outputs: tuple[torch.Tensor, ...], dst: int, mb: int,
             tokens: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Send one micro-batch forward; returns the sent tensors the returned gradients are for."""
        for i, t in enumerate(outputs):
            channel.send(comm, t, dst, "act", (mb, i))
        return outputs

    def recv(self, comm, channel: Channel, src: int, mb: int, stage: Stage, device) -> Arrival:
        leaves = tuple(channel.recv(comm, src, "act", (mb, i), device).requires_grad_()
                       for i in range(len(stage.input_names)))
        return Arrival(leaves, leaves)


def run_step(comm, stage: Stage, input_ids: torch.Tensor, labels: torch.Tensor,
             micro_batches: int, links: StageLinks, boundary: Boundary | None = None,
             schedule: str = "gpipe") -> float | None:
    """Forward and backward of one batch on this stage; returns the loss on the last stage."""
    rank, last = comm.rank, comm.world_size - 1
    boundary = boundary or Boundary()
    device = input_ids.device
    ids = input_ids.chunk(micro_batches)
    labs = labels.chunk(micro_batches)
    links.expect(stage, ids[0])  # the first chunk is the largest
    saved = {}
    loss_total = 0.0

    def post_ahead(mb: int, src: int, tag: str, count: int) -> None:
        # no more than the micro-batch surely takes: a receive posted for a message that is
        # not sent would take the next step's (the channels take posted receives in order)
        if mb < micro_batches and tag in POSTS_AHEAD[schedule]:
            for _ in range(count):
                comm.irecv(src, tag)

    for op, mb in schedule_ops(schedule, rank, comm.world_size, micro_batches):
        if op == "F":
            if rank == 0:
                got = Arrival((), (ids[mb],), ids[mb])
            else:
                got = boundary.recv(comm, links.fwd_in, rank - 1, mb, stage, device)
                post_ahead(mb + 1, rank - 1, "act", boundary.first_messages(stage))
            outputs = stage(*got.inputs, input_ids=ids[mb])
            if rank == last:
                loss = lm_loss(outputs[0], labs[mb]) / micro_batches
                loss_total += loss.item()
                saved[mb] = (got.leaves, (loss,))
            else:
                sent = boundary.send(comm, links.fwd_out, outputs, rank + 1, mb, got.tokens)
                saved[mb] = (got.leaves, sent)
            continue
        leaves, outputs = saved.pop(mb)
        if rank == last:
            outputs[0].backward()
        else:
            grads = tuple(links.bwd_in.recv(comm, rank + 1, "grad", (mb, i), device)
                          for i in range(len(outputs)))
            post_ahead(mb + 1, rank + 1, "grad", len(outputs))
            torch.autograd.backward(outputs, grads)
        if rank > 0:
            for i, t in enumerate(leaves):
                links.bwd_out.send(comm, t.grad, rank - 1, "grad", (mb, i))
    return loss_total if rank == last else None


def pipeline_step(comm, stage: Stage, input_ids: torch.Tensor, labels: torch.Tensor,
                  micro_batches: int, codecs: LinkCodecs, schedule: str = "gpipe") -> float | None:
    """The stateless case: every link direction carries ``C(x)`` with a fixed codec."""
    links = StageLinks.direct(comm.rank, comm.world_size, codecs)
    return run_step(comm, stage, input_ids, labels, micro_batches, links, schedule=schedule)


@torch.no_grad()
def evaluate(comm, stage: Stage, input_ids: torch.Tensor, labels: torch.Tensor,
             wire: Codec, tag: str = "eval") -> tuple[float, float] | None:
    """Uncompressed forward of one batch; (mean loss, accuracy) on the last stage (next-token
    accuracy for a causal LM, class accuracy for a classifier)."""
    rank, last = comm.rank, comm.world_size - 1
    link = Channel(wire, max_numel=stage.largest_numel(*input_ids.shape))
    if rank == 0:
        inputs = (input_ids,)
    else:
        inputs = tuple(link.recv(comm, rank - 1, tag, (0, i), input_ids.device)
                       for i in range(len(stage.input_names)))
    outputs = stage(*inputs, input_ids=input_ids)
    if rank != last:
        for i, t in enumerate(outputs):
            link.send(comm, t, rank + 1, tag, (0, i))
        return None
    logits = outputs[0]
    acc = (logits.argmax(-1) == labels).double().mean().item()
    return lm_loss(logits, labels).item(), acc
