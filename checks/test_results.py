"""Result records: round trips, validation of corrupt/foreign files, atomic writes, fingerprints."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import struct
import subprocess

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.results import (
    REQUIRED_METRICS,
    SCHEMA,
    Metric,
    ResultError,
    ResultRecord,
    env_info,
    environment,
    files,
    params_sha256,
    params_sha256_of_model,
    read_result,
    read_results,
    write_result,
)

SHA = "ab" * 32


def make_metrics(**over) -> dict[str, Metric]:
    m = {
        "payload_bytes_per_step": Metric(4096, "bytes", False),
        "messages_per_step": Metric(4, "messages", False),
        "peak_memory_bytes": Metric(123_456_789, "bytes", False),
        "step_time_s": Metric(0.0125, "s", False, stderr=0.001),
        "throughput_tokens_per_s": Metric(5000.5, "tokens/s", True),
        "final_loss": Metric(2.5, "nats", False),
        "params_sha256": Metric(SHA, "sha256"),
    }
    m.update(over)
    return m


def make_record(**over) -> ResultRecord:
    kw = dict(
        algorithm="sparq", config={"lr": 1e-3, "bits": 4, "layers": [1, 2]}, world_size=2,
        backend="threads", model="tiny-opt", data="tiny-shakespeare", steps=3, seed=0,
        metrics=make_metrics(),
        per_rank=[{"rank": 0, "metrics": {"peak_memory_bytes": Metric(100, "bytes", False)}},
                  {"rank": 1, "metrics": {}}],
        env={"commbench": "0.1.0", "device": "cpu"}, data_kind="synthetic",
        history={"loss": [3.0, 2.7, 2.5]}, created="2025-01-01T00:00:00+00:00",
    )
    kw.update(over)
    return ResultRecord(**kw)


def good_dict() -> dict:
    return make_record().to_dict()


def write_raw(path, obj) -> None:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")


def assert_bad(tmp_path, obj, *fragments: str) -> ResultError:
    p = tmp_path / "bad.json"
    write_raw(p, obj)
    with pytest.raises(ResultError) as ei:
        read_result(p)
    msg = str(ei.value)
    assert msg.startswith(str(p) + ": "), msg
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)
    return ei.value


# --------------------------------------------------------------------------- round trips

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
finite = st.floats(allow_nan=False, allow_infinity=False)
metric_values = st.one_of(st.integers(-2**62, 2**62), finite, st.text(max_size=10))


@st.composite
def metrics_st(draw):
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=8).filter(
        lambda s: s not in REQUIRED_METRICS), st.builds(
        Metric, metric_values, st.text(min_size=1, max_size=6).filter(str.strip),
        st.sampled_from([None, True, False])), max_size=3))
    m = make_metrics(
        final_loss=Metric(draw(finite), "nats", False,
                          stderr=draw(st.none() | st.floats(0, 1e6))),
        step_time_s=Metric(draw(st.floats(0, 1e3)), "s", False),
    )
    if draw(st.booleans()):
        del m["throughput_tokens_per_s"]
        m["throughput_samples_per_s"] = Metric(draw(finite), "samples/s", True)
    m.update(extra)
    return m


@given(metrics=metrics_st(), config=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
       world_size=st.integers(1, 8), steps=st.integers(0, 10**6), seed=st.integers(-2**31, 2**31),
       history=st.dictionaries(st.text(min_size=1, max_size=5),
                               st.lists(st.none() | finite, max_size=5), max_size=2),
       data_kind=st.sampled_from([None, "real", "synthetic"]))
def test_round_trip_write_read(tmp_path_factory, metrics, config, world_size, steps, seed,
                               history, data_kind):
    rec = make_record(metrics=metrics, config=config, world_size=world_size, steps=steps,
                      seed=seed, history=history, data_kind=data_kind,
                      per_rank=[{"rank": r, "metrics": {"step_time_s": Metric(0.5, "s")}}
                                for r in range(world_size)])
    path = tmp_path_factory.mktemp("rt") / "sub" / "run.json"
    assert write_result(rec, path) == path
    back = read_result(path)
    assert back == rec
    assert ResultRecord.from_dict(rec.to_dict()) == rec
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert os.listdir(path.parent) == ["run.json"]


def test_defaults_and_created():
    rec = ResultRecord("a", {}, 1, "threads", "m", "d", 1, 0, make_metrics())
    assert rec.created is not None and rec.per_rank == [] and rec.history == {}
    assert ResultRecord.from_dict(rec.to_dict()) == rec


def test_read_results_expands_directories_sorted(tmp_path):
    for name in ("b.json", "a.json", "c.json"):
        write_result(make_record(algorithm=name[0]), tmp_path / "runs" / name)
    (tmp_path / "runs" / "notes.txt").write_text("not a result")
    (tmp_path / "runs" / ".hidden.json").write_text("{")
    write_result(make_record(algorithm="z"), tmp_path / "z.json")
    recs = read_results([tmp_path / "z.json", tmp_path / "runs"])
    assert [r.algorithm for r in recs] == ["z", "a", "b", "c"]
    assert [r.algorithm for r in read_results(str(tmp_path / "runs"))] == ["a", "b", "c"]
    (tmp_path / "runs" / "d.json").write_text("[]")
    with pytest.raises(ResultError, match="d.json: not a commbench result"):
        read_results(tmp_path / "runs")


# --------------------------------------------------------------------------- corrupt files


def test_truncated_at_every_cut(tmp_path):
    rec = make_record(env={}, config={}, history={}, per_rank=[])
    full = tmp_path / "full.json"
    write_result(rec, full)
    data = full.read_bytes()
    p = tmp_path / "cut.json"
    for cut in range(len(data)):
        if data[:cut].strip() == data.strip():
            continue  # only trailing whitespace removed: still the whole document
        p.write_bytes(data[:cut])
        with pytest.raises(ResultError) as ei:
            read_result(p)
        msg = str(ei.value)
        assert msg.startswith(f"{p}: "), msg
        assert ("truncated or invalid JSON at line" in msg or "empty file" in msg), msg


def test_truncation_names_the_line(tmp_path):
    e = assert_bad(tmp_path, '{\n  "schema": "commbench.result/1",\n  "algorithm": "sp',
                   "truncated or invalid JSON at line 3")
    assert "bad.json" in str(e)


@pytest.mark.parametrize("obj", [[], [1, 2], None, "text", 3, {"foo": 1},
                                 {"schema": "foo", "metrics": {}}, {"schema": 1}])
def test_foreign_json(tmp_path, obj):
    assert_bad(tmp_path, json.dumps(obj), "not a commbench result")


def test_wrong_schema_messages(tmp_path):
    d = good_dict()
    d["schema"] = "foo"
    assert_bad(tmp_path, d, "not a commbench result (schema 'foo')")
    d["schema"] = "commbench.result/2"
    assert_bad(tmp_path, d, "unsupported result schema 'commbench.result/2'")


@pytest.mark.parametrize("name", REQUIRED_METRICS)
def test_missing_required_metric(tmp_path, name):
    d = good_dict()
    del d["metrics"][name]
    assert_bad(tmp_path, d, "missing required metric", name)


def test_missing_throughput(tmp_path):
    d = good_dict()
    del d["metrics"]["throughput_tokens_per_s"]
    assert_bad(tmp_path, d, "throughput_tokens_per_s or throughput_samples_per_s")
    d["metrics"]["throughput_samples_per_s"] = {"value": 3.0, "unit": "samples/s"}
    p = tmp_path / "ok.json"
    write_raw(p, d)
    assert read_result(p).metrics["throughput_samples_per_s"] == Metric(3.0, "samples/s")


def test_metric_without_unit(tmp_path):
    d = good_dict()
    del d["metrics"]["final_loss"]["unit"]
    assert_bad(tmp_path, d, "metric 'final_loss' has no unit")
    d["metrics"]["final_loss"]["unit"] = "  "
    assert_bad(tmp_path, d, "metric 'final_loss' has no unit")


def _set(path: str, value):
    def mutate(d):
        keys = path.split("/")
        cur = d
        for k in keys[:-1]:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        last = keys[-1]
        if value is KeyError:
            del cur[last]
        elif isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return mutate


WRONG = [
    ("world_size", "2", "'world_size' must be an integer"),
    ("world_size", True, "'world_size' must be an integer"),
    ("world_size", 0, "'world_size' must be >= 1"),
    ("steps", -1, "'steps' must be >= 0"),
    ("seed", 1.5, "'seed' must be an integer"),
    ("algorithm", "", "'algorithm' must be a non-empty string"),
    ("backend", None, "'backend' must be a non-empty string"),
    ("config", [1], "'config' must be an object"),
    ("env", "cpu", "'env' must be an object"),
    ("metrics", [], "'metrics' must be an object"),
    ("metrics/final_loss", 2.5, "metric 'final_loss' must be an object"),
    ("metrics/final_loss/value", [2.5], "metric 'final_loss' value must be a number or a string"),
    ("metrics/final_loss/value", True, "metric 'final_loss' value must be a number or a string"),
    ("metrics/final_loss/value", "low", "metric 'final_loss' must be numeric"),
    ("metrics/final_loss/unit", 3, "metric 'final_loss' unit must be a string"),
    ("metrics/final_loss/higher_is_better", "no", "higher_is_better must be true, false or null"),
    ("metrics/final_loss/stderr", -1.0, "stderr -1.0 must be finite and >= 0"),
    ("metrics/final_loss/extra", 1, "unknown key(s) 'extra'"),
    ("metrics/final_loss/value", KeyError, "metric 'final_loss' has no value"),
    ("metrics/params_sha256/value", "xyz", "must be 64 lowercase hex digits"),
    ("per_rank", {}, "'per_rank' must be a list"),
    ("per_rank/0", 5, "per_rank[0] must be an object"),
    ("per_rank/0/rank", 2, "per_rank[0] rank 2 is not in 0..1"),
    ("per_rank/1/rank", 0, "per_rank[1] repeats rank 0"),
    ("per_rank/0/metrics", [], "per_rank[0] 'metrics' must be an object"),
    ("per_rank/0/metrics/peak_memory_bytes/unit", "", "per_rank[0] metric 'peak_memory_bytes' has no unit"),
    ("per_rank/0/host", "x", "per_rank[0] must have exactly the keys"),
    ("data_kind", "fake", "'data_kind' must be one of"),
    ("history", [1], "'history' must be an object"),
    ("history/loss", 1.0, "history 'loss' must be a list"),
    ("history/loss/0", {}, "history 'loss'[0] must be a number, string or null"),
    ("created", "yesterday", "'created' 'yesterday' is not an ISO 8601 time"),
    ("created", 5, "'created' must be an ISO 8601 string"),
    ("surprise", 1, "unknown key(s): 'surprise'"),
    ("model", KeyError, "missing key(s): model"),
]


@pytest.mark.parametrize(("path", "value", "fragment"), WRONG,
                         ids=[f"{p}={v!r}" for p, v, _ in WRONG])
def test_wrong_types(tmp_path, path, value, fragment):
    d = good_dict()
    _set(path, value)(d)
    assert_bad(tmp_path, d, fragment)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_rejected(tmp_path, token):
    text = json.dumps(good_dict(), indent=1).replace('"value": 2.5', f'"value": {token}')
    assert token in text
    assert_bad(tmp_path, text, "non-finite number", token)
    d = good_dict()
    d["config"]["x"] = 1.0
    text = json.dumps(d).replace('"x": 1.0', f'"x": {token}')
    assert_bad(tmp_path, text, "non-finite number")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_metric_rejects_non_finite(bad):
    with pytest.raises(ValueError, match="not finite"):
        Metric(bad, "s")
    with pytest.raises(ValueError, match="must be finite"):
        Metric(1.0, "s", stderr=bad)


def test_metric_validation_on_construction():
    with pytest.raises(ValueError, match="has no unit"):
        Metric(1, "")
    with pytest.raises(ValueError):
        Metric(None, "s")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Metric(1, "s", higher_is_better=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="string value cannot have a stderr"):
        Metric("x", "s", stderr=0.1)
    m = Metric(3, "bytes", False)
    with pytest.raises(AttributeError):
        m.value = 4  # type: ignore[misc]


def test_other_unreadable_files(tmp_path):
    assert_bad(tmp_path, "", "empty file")
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ResultError, match=r"bin\.json: not UTF-8"):
        read_result(p)
    with pytest.raises(ResultError, match=r"nope\.json: no such file"):
        read_result(tmp_path / "nope.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ResultError, match="is a directory"):
        read_result(tmp_path / "dir.json")


def test_from_dict_without_source_and_validate():
    with pytest.raises(ResultError, match=r"^<result>: not a commbench result"):
        ResultRecord.from_dict({"schema": "x"})
    d = good_dict()
    del d["metrics"]["final_loss"]
    with pytest.raises(ResultError, match=r"^runs/x\.json: missing required metric"):
        ResultRecord.from_dict(d, source="runs/x.json")
    assert copy.deepcopy(make_record()).validate() == make_record()


def test_write_rejects_invalid_record(tmp_path):
    rec = make_record()
    del rec.metrics["final_loss"]
    p = tmp_path / "out" / "bad.json"
    with pytest.raises(ResultError, match=r"bad\.json: missing required metric\(s\): final_loss"):
        write_result(rec, p)
    assert not p.exists()
    rec = make_record(config={"t": (1, 2)})
    with pytest.raises(ResultError, match="not plain JSON"):
        write_result(rec, p)
    rec = make_record(config={"x": float("nan")})
    with pytest.raises(ResultError, match="non-finite"):
        write_result(rec, p)


# --------------------------------------------------------------------------- atomic writes


def _old_file(tmp_path):
    p = tmp_path / "run.json"
    write_result(make_record(algorithm="old"), p)
    return p, p.read_bytes()


def test_atomic_write_failure_during_serialisation(tmp_path, monkeypatch):
    p, before = _old_file(tmp_path)

    def half_then_fail(obj, fh, **kw):
        fh.write(json.dumps(obj)[:40])
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(files.json, "dump", half_then_fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_result(make_record(algorithm="new"), p)
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["run.json"]
    assert read_result(p).algorithm == "old"


@pytest.mark.parametrize("target", ["fsync", "replace"])
def test_atomic_write_failure_in_os_calls(tmp_path, monkeypatch, target):
    p, before = _old_file(tmp_path)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, target, boom)
    with pytest.raises(OSError, match="No space left"):
        write_result(make_record(algorithm="new"), p)
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["run.json"]


def test_atomic_write_keeps_mode_and_replaces(tmp_path):
    p, _ = _old_file(tmp_path)
    os.chmod(p, 0o640)
    write_result(make_record(algorithm="new"), p)
    assert read_result(p).algorithm == "new"
    assert p.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["run.json"]


# --------------------------------------------------------------------------- params_sha256


@st.composite
def param_sets(draw):
    n = draw(st.integers(1, 6))
    shapes = [tuple(draw(st.lists(st.integers(1, 4), max_size=3))) for _ in range(n)]
    seed = draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    perm = draw(st.permutations(range(n)))
    return tensors, perm


@given(param_sets())
def test_params_sha256_order_independent_and_float32(ps):
    tensors, perm = ps
    ref = params_sha256(enumerate(tensors))
    assert params_sha256([(i, tensors[i]) for i in perm]) == ref
    assert params_sha256((i, t.float()) for i, t in enumerate(tensors)) == ref
    expected = hashlib.sha256(b"".join(
        t.to(torch.float32).numpy().astype("<f4").tobytes() for t in tensors)).hexdigest()
    assert ref == expected


def test_params_sha256_independent_tiny_example():
    a = torch.tensor([[1.0, -2.0], [0.5, 3.25]], dtype=torch.float64)
    b = torch.tensor([1e-3], dtype=torch.float32)
    digest = hashlib.sha256(struct.pack("<5f", 1.0, -2.0, 0.5, 3.25, 1e-3)).hexdigest()
    assert params_sha256([(1, b), (0, a)]) == digest
    # a value whose float64 and float32 bytes differ: hashed as its float32 cast
    c = torch.tensor([0.1], dtype=torch.float64)
    assert params_sha256([(0, c)]) == hashlib.sha256(struct.pack("<f", 0.1)).hexdigest()
    assert params_sha256([(0, c)]) != hashlib.sha256(struct.pack("<d", 0.1)).hexdigest()
    assert params_sha256([(0, c.to(torch.bfloat16))]) == params_sha256(
        [(0, c.to(torch.bfloat16).float())])


@pytest.mark.parametrize(("items", "match"), [
    ([(0, torch.zeros(1)), (0, torch.ones(1))], "appears more than once"),
    ([(0, torch.zeros(1)), (2, torch.ones(1))], r"not 0\.\.2: missing 1"),
    ([(1, torch.zeros(1)), (2, torch.ones(1))], "missing 0"),
    ([(-1, torch.zeros(1)), (0, torch.ones(1))], "negative global parameter index"),
    ([], "no parameters"),
    ([("0", torch.zeros(1))], "must be an int"),
    ([(0, [1.0])], "not a torch.Tensor"),
    ([torch.zeros(1)], r"\(global_index, tensor\) pairs"),
])
def test_params_sha256_rejects_bad_indices(items, match):
    with pytest.raises(ValueError, match=match):
        params_sha256(items)


def test_params_sha256_of_model_matches_split_stages():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    whole = params_sha256_of_model(model)
    named = list(model.named_parameters())
    stage0 = [(i, p) for i, (_, p) in enumerate(named) if i < 2]
    stage1 = [(i, p) for i, (_, p) in enumerate(named) if i >= 2]
    assert params_sha256(stage1 + stage0) == whole
    with pytest.raises(ValueError, match="missing"):
        params_sha256(stage0[:1] + stage1)  # a stage lost one parameter
    with torch.no_grad():
        model[2].bias[0] += 1
    assert params_sha256_of_model(model) != whole


# --------------------------------------------------------------------------- env_info


def test_env_info_fields():
    env = env_info()
    for key in ("commbench", "torch", "python", "device", "git_sha", "hostname", "platform",
                "cpu_count", "date"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert env["device"] == "cpu" or isinstance(env["device"], str)
    sha = env["git_sha"]
    assert sha is None or (len(sha.removesuffix("-dirty")) == 40)
    json.dumps(env, allow_nan=False)
    rec = make_record(env=env)
    assert ResultRecord.from_dict(rec.to_dict()) == rec


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_sha_clean_dirty_and_not_a_checkout(tmp_path):
    assert environment._git_sha(tmp_path) is None
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                               "-c", "user.email=t@t", *args], check=True, env=env,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    assert environment._git_sha(tmp_path) is None  # no commit yet
    (tmp_path / "f.txt").write_text("1")
    git("add", "f.txt")
    git("commit", "-q", "-m", "x")
    head = git("rev-parse", "HEAD")
    assert environment._git_sha(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("u")
    assert environment._git_sha(tmp_path) == head
    (tmp_path / "f.txt").write_text("2")
    assert environment._git_sha(tmp_path) == head + "-dirty"
    sub = tmp_path / "pkg"
    sub.mkdir()
    assert environment._git_sha(sub) is None  # inside some other checkout: not ours


# --------------------------------------------------------------------------- load before / after


def test_a_run_records_the_load_before_and_after(monkeypatch):
    """The launcher writes the 1, 5, 15 min load averages taken at the run's start and end into the
    record's environment (the two readings are told apart: a fake getloadavg counts its calls)."""
    from harness import launcher
    from harness.registry import make_config

    calls = []

    def fake_loadavg():
        calls.append(len(calls))
        return (1.0 + len(calls), 2.0, 3.0)

    monkeypatch.setattr(environment.os, "getloadavg", fake_loadavg)
    rec = launcher.run(make_config("fo-sgd", world_size=1, model="tiny-opt", data="wiki-en", steps=2,
                                   batch_size=2, seq_len=8))
    assert rec.env["load_before"] == [2.0, 2.0, 3.0] and rec.env["load_after"] == [3.0, 2.0, 3.0]
    assert len(calls) == 2
    again = ResultRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again.env["load_before"] == [2.0, 2.0, 3.0]


def test_records_without_load_still_load_and_bad_load_is_refused(tmp_path):
    d = good_dict()
    assert "load_before" not in d["env"]
    ResultRecord.from_dict(d)  # a record from before records carried the load
    for bad in ([1.0, 2.0], [1.0, -2.0, 3.0], "high", [1.0, "x", 3.0]):
        d = good_dict()
        d["env"]["load_after"] = bad
        assert_bad(tmp_path, d, "'load_after' must be the 1, 5 and 15 min load averages")
    d = good_dict()
    d["env"]["load_before"] = environment.load_average()
    ResultRecord.from_dict(d)
