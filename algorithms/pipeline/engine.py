"""One training step of a pipeline stage over the Comm (GPipe-style schedule).

All micro-batches go forward, then all go backward in the same order, so the
gradient accumulates micro-batch 0, 1, ... exactly as the single-process
reference does (which makes the two bit-identical).  Each boundary tensor
crosses the link as a codec payload: forward under tag "act", backward
under tag "grad".  With a lossless dense codec this is the uncompressed
pipeline; later issues put lossy codecs on the links.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.codecs import Codec, Payload
from harness.models import Stage, lm_loss


@dataclass
class LinkCodecs:
    forward: Codec  # activations, stage r -> r+1
    backward: Codec  # activation gradients, stage r+1 -> r


def _send(comm, t: torch.Tensor, dst: int, codec: Codec, tag: str) -> None:
    comm.send(codec.encode(t.detach().cpu()).data, dst, tag=tag)


def _recv(comm, src: int, codec: Codec, tag: str, device: torch.device) -> torch.Tensor:
    return codec.decode(Payload(comm.recv(src, tag=tag))).to(device)


def pipeline_step(comm, stage: Stage, input_ids: torch.Tensor, labels: torch.Tensor,
                  micro_batches: int, codecs: LinkCodecs) -> float | None:
    """Forward and backward of one batch on this stage; returns the loss on the last stage."""
    rank, last = comm.rank, comm.world_size - 1
    device = input_ids.device
    ids = input_ids.chunk(micro_batches)
    labs = labels.chunk(micro_batches)
    saved = []
    loss_total = 0.0
    for mb in range(micro_batches):
        if rank == 0:
            inputs = (ids[mb],)
        else:
            inputs = tuple(_recv(comm, rank - 1, codecs.forward, "act", device).requires_grad_()
                           for _ in stage.input_names)
        outputs = stage(*inputs)
        if rank == last:
            loss = lm_loss(outputs[0], labs[mb]) / micro_batches
            loss_total += loss.item()
            saved.append((inputs, (loss,)))
        else:
            for t in outputs:
                _send(comm, t, rank + 1, codecs.forward, "act")
            saved.append((inputs, outputs))
    for inputs, outputs in saved:
        if rank == last:
            outputs[0].backward()
        else:
            grads = tuple(_recv(comm, rank + 1, codecs.backward, "grad", device) for _ in outputs)
            torch.autograd.backward(outputs, grads)
        if rank > 0:
            for t in inputs:
                _send(comm, t.grad, rank - 1, codecs.backward, "grad")
    return loss_total if rank == last else None
