"""Every table of the main job (``reproduce all``), printed at 80 and 120 columns,
shows every cell whole: no ellipsis, and each cell's full text on one line.

The tables are the experiments' own (their columns, titles, captions and the
committed paper numbers), built from stand-in records whose every metric is a
long value (so formatted cells are as wide as real ones get) instead of real
runs; double quantisation runs its deterministic simulator for one epoch.
The claims table is built from the claims those experiments register.
"""

from __future__ import annotations

import importlib
import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from harness.experiments import claims as claims_mod
from harness.experiments import registry
from harness.reporting import Column, Table, print_table
from harness.results.schema import Metric

LONG = 123456.789012345
METRICS = ("payload_bytes_per_step", "payload_bytes_total", "messages_per_step", "peak_memory_bytes",
           "peak_memory_growth_bytes", "step_time_s", "throughput_tokens_per_s", "final_loss", "val_loss",
           "val_accuracy", "wire_bytes_per_step", "wire_to_payload_ratio", "ef_state_bytes_total",
           "h2d_bytes_per_step", "d2h_bytes_per_step", "d2d_bytes_per_step", "device_pool_peak_bytes",
           "model_t_step_s", "act_nnz_ratio", "split_nnz_ratio0", "split_block0")


class _Metrics(dict):
    """Every metric an experiment reads, all long values; unknown names too."""

    def __init__(self):
        super().__init__({k: Metric(LONG + i, "x") for i, k in enumerate(METRICS)})
        self["params_sha256"] = Metric("0123456789abcdef" * 4, "sha256")

    def __missing__(self, key):
        self[key] = Metric(LONG, "x")
        return self[key]

    def get(self, key, default=None):
        return self[key]


class _History(dict):
    """Every per-step series an experiment reads (``[]`` and ``.get`` alike), long values."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def __missing__(self, key):
        self[key] = [5.4321098765 - 1e-3 * i for i in range(self.steps)]
        return self[key]

    def get(self, key, default=None):
        return self[key]


class _Record:
    def __init__(self, cfg):
        self.config, self.algorithm, self.world_size = cfg.to_dict(), cfg.algorithm, cfg.world_size
        self.steps, self.model, self.backend, self.env = cfg.steps, cfg.model, cfg.backend, {}
        self.metrics = _Metrics()
        self.history = _History(cfg.steps)
        self.per_rank = [{"rank": r, "metrics": _Metrics()} for r in range(cfg.world_size)]


BUILT_CLAIMS: list = []  # the claims the main job's experiments registered (filled by the fixture)


@pytest.fixture(scope="module")
def main_job_tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("exports")
    mp = pytest.MonkeyPatch()
    mp.setattr("harness.reporting.plots._pyplot", lambda: None)  # no PNGs: tables only
    claims_mod._CLAIMS.clear()
    tables: list[Table] = []
    try:
        for name in registry.ORDER:
            mod = importlib.import_module(f"harness.experiments.{registry.MODULES[name]}")
            if hasattr(mod, "run_and_save"):
                mp.setattr(mod, "run_and_save", lambda cfg, path=None, quiet=True: _Record(cfg))
            if name == "double-quant":
                small = mod.settings("tiny") | dict(max_epochs=1, mu_max_epochs=1, reach_epochs=1)
                mp.setattr(mod, "settings", lambda scale, small=small: small)
            built = registry.get_experiment(name).run("tiny", out, True)
            assert built, f"{name} built no table"
            tables += built
        tables.append(claims_mod.claims_table(list(claims_mod._CLAIMS)))
        BUILT_CLAIMS[:] = claims_mod._CLAIMS
    finally:
        mp.undo()
        claims_mod._CLAIMS.clear()
    return tables


def _assert_whole(table: Table, width: int) -> None:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    print_table(table, console)
    text = console.export_text()
    lines = text.splitlines()
    assert "…" not in text, f"{table.title!r} at {width} columns: a cell is cut\n{text}"
    assert max(cell_len(line) for line in lines) <= width, [line for line in lines if cell_len(line) > width]
    for row in table.formatted_rows():
        for j, cell in enumerate(row):
            # a number with its unit stays on one line; text may wrap at spaces, every word whole
            if cell == "—":  # missing (a column with no value at all is left out and named)
                continue
            pieces = [cell] if table.is_numeric(j) else cell.split()
            for piece in pieces:
                assert any(piece in line for line in lines), \
                    f"{table.title!r} at {width} columns: {piece!r} of {cell!r} is not shown whole\n{text}"


@pytest.mark.parametrize("width", [80, 120])
def test_main_job_tables_are_never_cut(main_job_tables, width):
    names = {t.title.split(":")[0] for t in main_job_tables}
    assert len(main_job_tables) >= 10 and {"protocol", "bandwidth sweep"} <= names
    for table in main_job_tables:
        _assert_whole(table, width)


@pytest.mark.parametrize("width", [80, 120])
def test_long_labels_and_many_columns(width):
    cols = [Column("setting", "setting")] + [Column(f"c{i}", f"measured value {i}", "bytes", False)
                                             for i in range(14)]
    rows = [dict(setting="acc-asylpg (b = 4, adaptive b_x) @ 80 Mbit/s", **{f"c{i}": 1e9 / 7 * i for i in range(14)}),
            dict(setting="acc-asyfpg", **{f"c{i}": None if i % 3 else 256.123 for i in range(14)})]
    _assert_whole(Table("wide", cols, rows), width)
    huge = Table("one huge label", [Column("k", "key"), Column("v", "value", "s")],
                 [dict(k="x" * 64, v=0.123456)])
    _assert_whole(huge, width)


# ---------------------------------------------------------------------------- times with spread

TIMED = re.compile(r"\btime\b|speed-up|throughput|(?<!\w)s/step|/ epoch|achievable", re.IGNORECASE)


def test_main_job_times_carry_their_interval(main_job_tables):
    """Every column of the main job's tables that shows a time (seconds, a rate per second, or a ratio
    of times: a speed-up, a throughput ratio) holds value [lo, hi] cells and says what the brackets
    are; the paper's numbers, given without spread, are exempt."""
    from harness.experiments.runner import timed_columns_without_spread
    from harness.stats import Interval

    seen = 0
    for table in main_job_tables:
        assert timed_columns_without_spread(table) == [], table.title
        for j, c in enumerate(table.columns):
            timed = c.is_time or bool(TIMED.search(c.header))
            if not timed or "paper" in (c.key + c.header).lower() or c.key in ("quote", "criterion", "how"):
                continue
            assert c.spread, f"{table.title!r}: column {c.header!r} shows a time without its interval"
            cells = [r[j] for r in table.rows if r[j] is not None]
            assert cells and all(isinstance(v, Interval) for v in cells), (table.title, c.header)
            assert all(" [" in s and s.endswith("]") for s in (c.format(v) for v in cells)), (table.title, c.header)
            assert any(c.spread in n for n in table.display_notes()), (table.title, c.header)
            seen += 1
    assert seen >= 15  # step times, throughputs, speed-ups and phases of six experiments


def test_main_job_timed_claims_are_decided_by_their_interval(main_job_tables):
    """The claims whose measure is a time (DistZO2's speed-ups, Protocol's throughput) carry an
    interval and a threshold, and an interval covering the threshold is never a verdict."""
    timed = [c for c in BUILT_CLAIMS if any(w in c.criterion.lower() for w in ("speed-up", "tokens/s", "throughput"))]
    assert {c.paper for c in timed} == {"distzo2", "protocol"} and len(timed) >= 3
    for c in timed:
        assert c.interval is not None and c.threshold is not None, c.criterion
        if c.interval.covers(c.threshold):
            assert c.outcome == claims_mod.NOT_MEASURABLE and "within noise" in c.how, c
        assert c.ours.endswith("]") and " [" in c.ours, c.ours
