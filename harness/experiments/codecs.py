"""``commbench reproduce codecs``: each codec's real payload size beside its declared floor.

Every built-in codec encodes the same float32 tensors (a dense gaussian and a
ReLU'd gaussian, about half zeros, shaped ``(n / 256, 256)`` like a batch of
activations) at several sizes.  The payload size is the length of the
serialized bytes that would travel, never a formula; the floor is the codec's
own ``floor_bits`` (an information-theoretic lower bound for its message).
"""

from __future__ import annotations

from pathlib import Path

import torch

from algorithms.codecs import CODECS, make_codec
from harness.reporting import Column, Table
from harness.reporting.plots import note, plot_codec_sizes

from .registry import experiment

SIZES = (1024, 16_384, 262_144)
KINDS = ("gaussian", "relu")
WIDTH = 256  # the channel (last) dimension: qchannel keeps one scale per channel
# One representative setting for the codecs that take options; the rest use their name.
SPECS = {"qstoch": "qstoch:bits=4", "qchannel": "qchannel:bits=4", "topk": "topk:ratio=0.1",
         "randk": "randk:ratio=0.1,scaled=true"}


def codec_specs() -> list[str]:
    return [SPECS.get(name, name) for name in CODECS]


def make_tensor(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    """The experiment's input: ``n`` float32 values (a multiple of 256), seeded."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n // WIDTH, WIDTH, generator=g)
    return torch.relu(x) if kind == "relu" else x


def measure(spec: str, x: torch.Tensor, seed: int = 0) -> dict:
    codec = make_codec(spec)
    payload = codec.encode(x, generator=torch.Generator().manual_seed(seed))
    return {"payload": len(payload.tobytes()), "floor": codec.floor_bits(x) / 8,
            "lossless": codec.is_lossless_on(x)}


# Not a paper's table (no paper column), so not part of ``reproduce all``.
@experiment("codecs")
def codecs_experiment(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    rows = []
    for spec in codec_specs():
        for kind in KINDS:
            for n in SIZES:
                m = measure(spec, make_tensor(kind, n))
                rows.append(dict(codec=spec, tensor=kind, elements=n, payload=m["payload"], floor=m["floor"],
                                 ratio=m["payload"] / m["floor"], bpe=8 * m["payload"] / n,
                                 lossless="yes" if m["lossless"] else "no"))
    png = plot_codec_sizes(rows, out_dir / "codecs.png")
    table = Table(
        title=f"codecs: serialized payload vs declared floor, float32 ({WIDTH} channels), "
              f"{', '.join(f'{n:,}' for n in SIZES)} elements",
        columns=[Column("codec", "codec"), Column("tensor", "tensor"), Column("elements", "elements"),
                 Column("payload", "payload bytes", "bytes", False, "d"),
                 Column("floor", "floor bytes", "bytes", False, ".1f"),
                 Column("ratio", "payload/floor", "ratio", False, ".3f"),
                 Column("bpe", "bits per element", "bits", False, ".3f"),
                 Column("lossless", "lossless on it")],
        rows=rows,
        caption="payload: length of the encoded bytes (header, CRC and body); floor: the codec's "
                "floor_bits / 8 for this tensor; relu = max(0, gaussian), about half zeros; "
                "bits per element = 8 x payload / elements",
        notes=[note(png)])
    return [table]
