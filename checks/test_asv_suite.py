"""Every asv benchmark runs once, on its smallest parameters, the way asv calls it.

asv records a benchmark only when it returns a plain finite number that JSON can store; a
benchmark that raises, or returns anything else (an ``Interval``, a tensor), is recorded as
failed and only shows up in ``scripts/asv.sh``'s output.  This check discovers the suite as asv
does (every class of ``benchmarks/asv_suite`` with ``track_`` / ``time_`` / ``mem_`` /
``peakmem_`` methods), narrows each class to its ``smallest`` parameters, runs its
``setup_cache`` / ``setup`` and calls every benchmark method directly.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import math
import pkgutil

import pytest

import benchmarks.asv_suite as suite

PREFIXES = ("track_", "time_", "mem_", "peakmem_")


def _benchmark_classes() -> list[type]:
    out = []
    for info in pkgutil.iter_modules(suite.__path__):
        mod = importlib.import_module(f"{suite.__name__}.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or inspect.isabstract(cls):
                continue
            if any(name.startswith(PREFIXES) for name in dir(cls)):
                out.append(cls)
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            assert not name.startswith(PREFIXES) or fn.__module__ != mod.__name__, (
                f"{mod.__name__}.{name}: module-level benchmarks have no 'smallest'; put it in a class")
    return out


CLASSES = _benchmark_classes()


def test_the_suite_is_found():
    assert {c.__name__ for c in CLASSES} >= {"FOReferences", "CompressedPipelines", "ProtocolModels",
                                             "ZerothOrder", "DistZO2", "DoubleQuantisation", "ClaimValues", "Codecs"}


def _param_sets(params: list) -> list[tuple]:
    if params and all(isinstance(p, list) for p in params):  # several parameter names
        return list(itertools.product(*params))
    return [(p,) for p in params] if params else [()]


def check_value(where: str, value) -> None:
    """What asv can record as a benchmark's value."""
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (
        f"{where} returned {type(value).__name__} {value!r}, not a number asv can store")
    json.dumps(value)
    assert math.isfinite(value), f"{where} returned {value!r}: asv would show no value"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_every_benchmark_runs_on_its_smallest_parameters(cls):
    smallest = getattr(cls, "smallest", None)
    assert smallest, f"{cls.__name__} names no 'smallest' parameters for this check"
    params = getattr(cls, "params", [])
    for p in _param_sets(smallest):
        assert p in _param_sets(params), f"{cls.__name__}.smallest {p} is not among its params"
    bench = cls()
    bench.params = smallest  # setup_cache runs only these
    if hasattr(cls, "smallest_common"):
        bench.common = {**cls.common, **cls.smallest_common}
    cache = bench.setup_cache() if hasattr(bench, "setup_cache") else None
    lead = (cache,) if cache is not None else ()
    methods = [n for n in dir(cls) if n.startswith(PREFIXES)]
    assert methods
    for p in _param_sets(smallest):
        if hasattr(bench, "setup"):
            bench.setup(*lead, *p)
        for name in methods:
            value = getattr(bench, name)(*lead, *p)
            if name.startswith("track_"):
                check_value(f"{cls.__name__}.{name}{p}", value)
        if hasattr(bench, "teardown"):
            bench.teardown(*lead, *p)


def test_asv_sh_fails_on_a_failed_benchmark(tmp_path, capsys):
    """scripts/asv_failed.py (what asv.sh exits by) fails on a null value, lists NaN as skipped."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "asv_failed", Path(__file__).resolve().parents[1] / "scripts" / "asv_failed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sha = "ab" * 20

    def write(values):
        data = {"result_columns": ["result", "params"],
                "results": {"bench_x.X.track_y": [values, [["'a'", "'b.5/w3'"]]]}}
        (tmp_path / f"{sha[:8]}-existing-py3.11.json").write_text(json.dumps(data))

    write([1.0, 2.0])
    assert mod.main([str(tmp_path), sha]) == 0
    write([1.0, float("nan")])
    assert mod.main([str(tmp_path), sha]) == 0
    assert "skipped: abababab bench_x.X.track_y('b.5/w3')" in capsys.readouterr().out
    write([1.0, None])
    assert mod.main([str(tmp_path), sha]) == 1
    assert "FAILED: abababab bench_x.X.track_y('b.5/w3')" in capsys.readouterr().err
    write(None)  # the class's setup_cache failed
    assert mod.main([str(tmp_path), sha]) == 1
