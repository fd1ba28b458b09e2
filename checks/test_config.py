"""The run config: fields validated on construction, handed to rank processes as
validated JSON (nothing in the project unpickles), and the micro-batch rule held
by the families that split a batch."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from harness.config import DEFAULT_MAX_FRAME_BYTES, ConfigError, RunConfig
from harness.registry import config_from_dict, load_all, make_config

ROOT = Path(__file__).resolve().parents[1]
# the algorithms whose step splits its batch into micro_batches (algorithms/pipeline/local.py,
# algorithms/pipeline/engine.py): the pipeline and protocol families
SPLITTERS = {"fo-sgd", "pipeline-sgd", "direct-compress", "aq-sgd", "clapping-fc", "clapping-fu",
             "protocol", "protocol-central"}


def _default(name: str, **kw) -> RunConfig:
    return make_config(name, world_size=load_all()[name].min_world, **kw)


# ---- max_frame_bytes --------------------------------------------------------------
def test_max_frame_bytes_default_is_the_comms():
    from harness.comm.base import DEFAULT_MAX_FRAME_BYTES as COMM_DEFAULT

    assert DEFAULT_MAX_FRAME_BYTES == COMM_DEFAULT == RunConfig("fo-sgd").max_frame_bytes


@pytest.mark.parametrize("bad", [0, -1, 1023, (1 << 40) + 1, True, 4096.0, "4096", None])
def test_max_frame_bytes_is_validated(bad):
    with pytest.raises(ConfigError, match=r"max_frame_bytes must be an integer number of bytes in 1024\.\."):
        RunConfig("fo-sgd", max_frame_bytes=bad)


@pytest.mark.parametrize("good", [1024, 4096, 1 << 40])
def test_max_frame_bytes_bounds_are_inclusive(good):
    assert RunConfig("fo-sgd", max_frame_bytes=good).max_frame_bytes == good


# ---- the micro-batch rule --------------------------------------------------------
@pytest.mark.parametrize("name", sorted(load_all()))
def test_only_the_families_that_split_a_batch_refuse_an_uneven_split(name):
    if name in SPLITTERS:
        # the whole reason, so a user knows what the rule is (algorithms/pipeline/local.py)
        with pytest.raises(ConfigError, match=re.escape(
                "batch_size 9 is not divisible by micro_batches 2 "
                "(each step splits its batch into micro_batches equal micro-batches)")):
            _default(name, batch_size=9, micro_batches=2)
        assert _default(name, batch_size=8, micro_batches=4).micro_batches == 4
    else:
        assert _default(name, batch_size=9, micro_batches=2).batch_size == 9


def test_every_reader_of_micro_batches_is_a_splitter():
    # the list above must follow the code: a module that reads cfg.micro_batches
    # registers only algorithms of SPLITTERS
    readers = {p for p in (ROOT / "algorithms").rglob("*.py") if "micro_batches" in p.read_text()}
    load_all()
    from harness.registry import ALGORITHMS

    in_readers = {name for name, spec in ALGORITHMS.items()
                  if (ROOT / (spec.module.replace(".", "/") + ".py")).resolve() in readers}
    assert in_readers - SPLITTERS == set(), "registered in a module that reads micro_batches"
    assert len(in_readers) >= 6  # the scan sees the pipeline and protocol modules


# ---- the config as JSON ----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(load_all()))
def test_every_default_config_round_trips_through_json(name):
    cfg = _default(name, max_frame_bytes=4096, max_run_time_s=30.0, bandwidth="80mbit")
    back = config_from_dict(json.loads(json.dumps(cfg.to_dict(), allow_nan=False)))
    assert back == cfg and type(back.params) is type(cfg.params)


def _cfg_dict() -> dict:
    return make_config("pipeline-sgd", world_size=2).to_dict()


def _edit(path: tuple, value):
    d = _cfg_dict()
    target = d
    for k in path[:-1]:
        target = target[k]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


_DROP = object()
HOSTILE_CONFIGS = [  # (what, dict, needle of the one-line ConfigError)
    ("not an object", [1, 2], "must be a JSON object"),
    ("unknown field", _edit(("shell",), "rm -rf /"), "unknown fields: shell"),
    ("no algorithm", _edit(("algorithm",), _DROP), "lacks algorithm"),
    ("unknown algorithm", _edit(("algorithm",), "os.system"), "unknown algorithm 'os.system'"),
    ("string for an int", _edit(("world_size",), "2"), "world_size: expected int, got str"),
    ("bool for an int", _edit(("steps",), True), "steps: expected int, got bool"),
    ("float for an int", _edit(("max_frame_bytes",), 4096.5), "max_frame_bytes: expected int"),
    ("list for a str", _edit(("model",), ["tiny-opt"]), "model: expected str, got list"),
    ("value out of range", _edit(("max_frame_bytes",), 5), "max_frame_bytes must be an integer"),
    ("world the algorithm refuses", _edit(("world_size",), 1), "needs world size >= 2"),
    ("params not an object", _edit(("params",), "lr=1"), "params: expected an object"),
    ("unknown param", _edit(("params", "exec"), 1), "unknown fields: exec"),
    ("string for a float param", _edit(("params", "lr"), "0.1"), "lr: expected float, got str"),
    ("bad param value", _edit(("params", "lr"), -1.0), "lr must be > 0"),
    ("uneven micro-batches", _edit(("batch_size",), 9), "batch_size 9 is not divisible"),
]


@pytest.mark.parametrize("what,d,needle", HOSTILE_CONFIGS, ids=[c[0] for c in HOSTILE_CONFIGS])
def test_a_bad_config_file_is_a_clear_error(what, d, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(d)
    assert needle in str(e.value) and "\n" not in str(e.value), (what, str(e.value))


def test_rank_entry_reads_json_and_reports_a_bad_config(tmp_path, monkeypatch):
    # the real entry point on a run directory: a hostile config.json ends in a
    # reported ConfigError before any group is joined; a config.pkl is never read
    from harness import rank_entry

    (tmp_path / "config.json").write_text(json.dumps(_edit(("world_size",), "2")))
    (tmp_path / "config.pkl").write_bytes(b"\x80\x04K\x01.")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("COMMBENCH_LAUNCHER_PID", raising=False)
    assert rank_entry.main([str(tmp_path)]) == 1
    err = json.loads((tmp_path / "rank0.error.json").read_text())
    assert err["type"] == "ConfigError" and "world_size: expected int" in err["message"], err


_UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}


def test_nothing_in_the_project_unpickles():
    # harness/ and algorithms/: rank outputs, configs and payloads are data with
    # validating decoders (ARCHITECTURE.md, "trust what a peer sends")
    found = []
    for pkg in ("harness", "algorithms"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module.split(".")[0]]
                elif isinstance(node, ast.Attribute) and node.attr in ("load", "loads") and \
                        isinstance(node.value, ast.Name) and node.value.id == "torch":
                    names = ["torch.load"]
                found += [f"{p.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n in _UNPICKLERS or n == "torch.load"]
    assert found == []


def test_the_json_carries_every_field():
    # a field added to RunConfig reaches the ranks: to_dict names every field
    cfg = make_config("pipeline-sgd", world_size=2)
    assert set(cfg.to_dict()) == {f.name for f in dataclasses.fields(RunConfig)}
