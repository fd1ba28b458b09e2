"""A new algorithm and a new codec from outside the project, each in one declaration, run
through the command line as a user runs a built-in one; and the declarations themselves
(torch-free, one paper key)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from algorithms.codecs import make_codec, register_codec
from algorithms.codecs.channel import Channel
from algorithms.codecs.dense import DenseCodec
from harness.cli import main
from harness.registry import ALGORITHMS, AlgorithmSpec, declare, param
from harness.results import read_result

TOY_ID = 249  # a wire id of the external range


class HalfCodec(DenseCodec):
    """fp16 on the wire under a name and id of its own."""

    family = TOY_ID

    def __init__(self):
        super().__init__("fp16")
        self.name = "toy-half"

    def spec(self):
        return "toy-half"


@dataclass(frozen=True)
class RelayParams:
    width: int = param(24, "values rank 0 sends rank 1 per step")


def relay(ctx):
    """Rank 0 sends ``width`` values a step through the toy codec; rank 1 logs their sum."""
    channel, x = Channel(make_codec("toy-half")), torch.linspace(0.0, 1.0, ctx.params.width)
    for _ in ctx.steps():
        if ctx.rank == 0:
            channel.send(ctx.comm, x, 1, "values")
        else:
            ctx.log(loss=float(channel.recv(ctx.comm, 0, "values").sum()))
    return ctx.finish([(0, x)] if ctx.rank == 0 else [])


@pytest.fixture
def toys(monkeypatch):
    from algorithms.codecs import _core, registry

    register_codec("toy-half", HalfCodec, param_size=1)  # the codec: one declaration
    declare(AlgorithmSpec(  # the algorithm: one declaration
        "toy-relay", family="toy", summary="rank 0 relays a tensor to rank 1 through toy-half",
        params=RelayParams, min_world=2, max_world=2, models=("none",), default_data="synthetic-uniform",
        entry=f"{__name__}:relay"))
    yield
    ALGORITHMS.pop("toy-relay", None)
    registry._FACTORIES.pop("toy-half", None)
    registry._FAMILY_CLASSES.pop(TOY_ID, None)
    _core.PARAM_SIZES.pop(TOY_ID, None)
    _core.FAMILY_NAMES.pop(TOY_ID, None)


def test_a_toy_algorithm_and_codec_run_through_the_command_line(toys, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["describe", "toy-relay"]) == 0
    assert "values rank 0 sends rank 1 per step" in capsys.readouterr().out
    assert main(["run", "toy-relay", "--steps", "3", "--set", "width=40", "--quiet", "--out", str(out)]) == 0
    rec = read_result(out)
    x = torch.linspace(0.0, 1.0, 40)
    # what crossed is the toy codec's payload (fp16 values), counted from its bytes
    assert rec.metrics["payload_bytes_per_step"].value == HalfCodec().encoded_nbytes(x)
    assert rec.history["loss"] == [float(x.half().float().sum())] * 3


def test_a_built_in_codec_takes_an_id_of_the_built_in_range():
    from algorithms.codecs import CODECS, _core, registry

    ids = {cls.family for cls in registry._FAMILY_CLASSES.values()}
    assert ids <= set(_core.BUILTIN_IDS)  # 32..255 are left to register_codec
    assert set(CODECS) <= set(registry._FACTORIES)
    with pytest.raises(Exception, match="outside 32..255"):
        register_codec("toy-low", DenseCodec, param_size=1)  # id 1: a built-in's


def test_every_paper_key_names_a_reference_table_and_the_same_papers_everywhere():
    from pathlib import Path

    from harness.experiments.registry import DECLARED
    from harness.registry import PAPERS, load_all

    root = Path(__file__).resolve().parents[1]
    assert {p.stem for p in (root / "results" / "reference").glob("*.csv")} == set(PAPERS)
    assert {s.paper for s in load_all().values()} - {None} == set(PAPERS)
    assert {d.paper for d in DECLARED.values()} - {None} == set(PAPERS)


def test_the_declarations_import_no_torch():
    code = ("import sys\nfrom harness.registry import load_all\nfrom harness.datasets import DECLARED\n"
            "import harness.models.presets, harness.experiments.registry\nload_all()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'numpy')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "[]", p.stderr
