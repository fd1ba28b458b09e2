"""The row model of every table: typed columns over plain rows of raw values
(numbers, strings, ``None`` for missing), and :func:`records_to_table`, which
builds one from result records."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.results import THROUGHPUT_METRICS, ResultRecord
from harness.stats import IQR, Interval, median_iqr

from .units import (
    NAMED_FORMATS,
    format_for,
    format_interval,
    format_number,
    is_number,
    is_time_unit,
)

MISSING = "—"

DEFAULT_METRICS = (
    "payload_bytes_per_step",
    "messages_per_step",
    "peak_tensor_bytes",
    "peak_memory_bytes",
    "peak_memory_growth_bytes",
    "step_time_s",
    "throughput",
    "final_loss",
    "params_sha256",
)

WIRE_METRICS = ("wire_bytes_per_step", "wire_to_payload_ratio")

HEADERS = {
    "wire_bytes_per_step": "wire/step (kernel)",
    "wire_to_payload_ratio": "wire / payload",
    "algorithm": "algorithm",
    "model": "model",
    "world_size": "world size",
    "backend": "backend",
    "data": "data",
    "steps": "steps",
    "seed": "seed",
    "runs": "runs",
    "data_kind": "data kind",
    "link": "link",
    "payload_bytes_per_step": "payload/step",
    "messages_per_step": "messages/step",
    "peak_tensor_bytes": "peak tensors",
    "peak_memory_bytes": "peak RSS",
    "peak_memory_growth_bytes": "RSS growth",
    "step_time_s": "step time",
    "throughput_tokens_per_s": "throughput",
    "throughput_samples_per_s": "throughput",
    "final_loss": "final loss",
    "params_sha256": "params sha256",
}

BYTES_NOTE = "KiB, MiB, GiB = 1024, 1024², 1024³ bytes."


class TableError(ValueError):
    """Bad table input (unknown metric, mixed units, missing or malformed reference file)."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # a column without a default: every dict row names it


@dataclass
class Column:
    """A column: ``key`` (machine name), ``header`` (human name), unit, direction, format.

    ``fmt`` is a name from :data:`NAMED_FORMATS` ("bytes", "seconds", "si",
    "number", "sha"), a format spec for :func:`format` (".3f"), a callable
    value -> str, or None to choose from the unit ("bytes" -> KiB/MiB, "s" ->
    s/ms/µs, "<x>/s" -> k/M/G, otherwise :func:`format_number`). Non-numbers
    are shown as they are. ``default`` is the value of a dict row that leaves
    the column out; without one (:data:`REQUIRED`) every row must give it.

    ``spread`` says what interval the column's cells carry ("median [interquartile
    range] of the measured steps"): such a column holds :class:`~harness.stats.Interval`
    cells (or None), shown ``value [lo, hi]`` (:func:`format_interval`), and the table's
    notes say what the brackets are; a column without one holds no interval.
    """

    key: str
    header: str
    unit: str | None = None
    higher_is_better: bool | None = None
    fmt: str | Callable[[Any], str] | None = None
    default: Any = REQUIRED
    spread: str | None = None

    @property
    def is_time(self) -> bool:
        """Seconds or a rate per second: a measured time (it carries an interval)."""
        return is_time_unit(self.unit)

    @property
    def arrow(self) -> str:
        return {True: "↑", False: "↓"}.get(self.higher_is_better, "")

    def header_text(self) -> str:
        """Header as shown to people: ``step time [s] ↓``."""
        text = self.header
        if self.unit:
            text += f" [{self.unit}]"
        if self.arrow:
            text += f" {self.arrow}"
        return text

    def csv_header(self) -> str:
        """Header in CSV: the machine key with the unit, ``step_time_s [s]``."""
        return f"{self.key} [{self.unit}]" if self.unit else self.key

    def format(self, value: Any) -> str:
        if value is None:
            return MISSING
        if isinstance(value, Interval):
            return format_interval(value.value, value.lo, value.hi, self._format_one)
        return self._format_one(value)

    def _format_one(self, value: Any) -> str:
        fmt = self.fmt if self.fmt is not None else format_for(self.key, self.unit)
        if fmt is None:
            return format_number(value)
        if callable(fmt):
            return fmt(value)
        if fmt in NAMED_FORMATS:
            return NAMED_FORMATS[fmt](value)
        try:
            return format(value, fmt)
        except (TypeError, ValueError):
            return str(value)


@dataclass
class Table:
    """Plain rows of raw values under typed columns, with a title, caption and notes.

    A row is given as a dict keyed by :attr:`Column.key` (a key no column has,
    or a column left out that has no default, is a :class:`TableError`), or
    as a list in column order; either way ``rows`` holds lists in column
    order, and :meth:`row_dicts` reads them back by key.
    """

    title: str
    columns: list[Column]
    rows: list[list]
    caption: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        keys = [c.key for c in self.columns]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise TableError(f"duplicate column key(s): {', '.join(dup)}")
        self.rows = [_in_column_order(self.columns, i, row) for i, row in enumerate(self.rows)]
        for j, c in enumerate(self.columns):
            for i, row in enumerate(self.rows):
                v = row[j]
                if c.spread is not None and v is not None and not isinstance(v, Interval):
                    raise TableError(f"row {i}, column {c.key!r}: the column shows a spread ({c.spread}), "
                                     f"so its cell must be an Interval, not {v!r}")
                if c.spread is None and isinstance(v, Interval):
                    raise TableError(f"row {i}, column {c.key!r}: an Interval in a column that declares "
                                     "no spread (Column(spread=...) says what the brackets are)")

    def column_index(self, key: str) -> int:
        for i, c in enumerate(self.columns):
            if c.key == key:
                return i
        raise KeyError(key)

    def is_numeric(self, j: int) -> bool:
        """A column is numeric when all its present values are numbers (and one exists)."""
        vals = [r[j] for r in self.rows if r[j] is not None]
        return bool(vals) and all(is_number(v) or isinstance(v, Interval) for v in vals)

    def display_notes(self) -> list[str]:
        """Notes as shown beside formatted cells: states the 1024 base when bytes are shown."""
        notes = [n for n in self.notes if n.strip()]
        uses_bytes = any(
            (c.fmt if c.fmt is not None else format_for(c.key, c.unit)) == "bytes"
            and any(is_number(r[j]) and abs(r[j]) >= 1024 for r in self.rows)
            for j, c in enumerate(self.columns))
        if uses_bytes and BYTES_NOTE not in notes:
            notes.append(BYTES_NOTE)
        spreads: dict[str, list[str]] = {}
        for j, c in enumerate(self.columns):
            if c.spread is not None and any(r[j] is not None for r in self.rows):
                spreads.setdefault(c.spread, []).append(c.header)
        for spread, headers in spreads.items():
            note = f"value [lo, hi] in {', '.join(headers)}: {spread}"
            if note not in notes:
                notes.append(note)
        return notes

    def formatted_rows(self) -> list[list[str]]:
        return [[c.format(v) for c, v in zip(self.columns, row, strict=True)] for row in self.rows]

    def row_dicts(self) -> list[dict[str, Any]]:
        return [{c.key: v for c, v in zip(self.columns, row, strict=True)} for row in self.rows]


def _in_column_order(columns: list[Column], i: int, row: Mapping[str, Any] | Sequence[Any]) -> list:
    if isinstance(row, Mapping):
        keys = {c.key for c in columns}
        unknown = [k for k in row if k not in keys]
        if unknown:
            raise TableError(f"row {i} has unknown column key(s) {', '.join(map(repr, unknown))}; "
                             f"columns: {', '.join(c.key for c in columns)}")
        missing = [c.key for c in columns if c.key not in row and c.default is REQUIRED]
        if missing:
            raise TableError(f"row {i} has no value for column key(s) {', '.join(map(repr, missing))}")
        return [row[c.key] if c.key in row else c.default for c in columns]
    if len(row) != len(columns):
        raise TableError(f"row {i} has {len(row)} cells, expected {len(columns)}")
    return row


# --------------------------------------------------------------------------- from records


def _group_value(rec: ResultRecord, key: str) -> Any:
    if key == "link":
        return link_of(rec)
    if key in ("algorithm", "model", "world_size", "backend", "data", "steps", "seed",
               "data_kind"):
        return getattr(rec, key)
    cur: Any = rec.config
    for part in key.removeprefix("config.").split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur if isinstance(cur, (str, int, float, bool)) or cur is None else str(cur)


# config fields a table pools a row's runs over instead of splitting rows by: repeats (the
# seed), and limits and meters that do not change what a run computes
POOLED = ("seed", "timeout_s", "max_run_time_s", "metered", "memory", "max_frame_bytes")
SHAPING = ("net", "bandwidth", "latency_ms")  # shown together as the row's link


def _flat(cfg: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def link_of(rec: ResultRecord) -> str:
    """The shaping a run had, as one cell: ``unshaped``, ``pacer 80mbit``, ``netns 80mbit +5 ms``."""
    cfg = rec.config
    net, rate, lat = cfg.get("net") or "none", cfg.get("bandwidth"), cfg.get("latency_ms") or 0
    if net == "none" and not rate and not lat:
        return "unshaped"
    parts = [net if net != "none" else "", str(rate) if rate else "", f"+{lat:g} ms" if lat else ""]
    return " ".join(p for p in parts if p)


def _split_fields(records: Sequence[ResultRecord], group_by: Sequence[str]) -> list[str]:
    """The config fields (``config.`` paths) whose values differ between records and that
    ``group_by``, the link and :data:`POOLED` do not already stand for: each splits rows."""
    named = {k.removeprefix("config.") for k in group_by}
    flats = [_flat(r.config) for r in records]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    return [f"config.{k}" for k in keys
            if k not in named and k not in POOLED and k not in SHAPING
            and len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]


def _pooled_note(groups: dict[tuple, list[ResultRecord]]) -> str | None:
    """Which :data:`POOLED` fields differ inside some row, with their values."""
    seen: dict[str, set] = {}
    for recs in groups.values():
        for k in POOLED:
            vals = {str(r.seed if k == "seed" else _flat(r.config).get(k)) for r in recs}
            if len(vals) > 1:
                seen.setdefault(k, set()).update(vals)
    if not seen:
        return None
    return "Rows pool runs that differ only in " + "; ".join(
        f"{k} ({', '.join(sorted(v))})" for k, v in seen.items()) + "."


STEP_SPREAD = f"{IQR} of the measured steps (a row's runs pooled)"


def _step_times(rec: ResultRecord) -> list[float]:
    return [t for t in rec.history.get("step_time_s", []) if is_number(t)]


def _pooled_steps(recs: Sequence[ResultRecord]) -> Interval:
    return median_iqr([t for r in recs for t in _step_times(r)])


def _throughput(recs: Sequence[ResultRecord]) -> Interval | None:
    per_step = {r.metrics["tokens_per_step"].value for r in recs if "tokens_per_step" in r.metrics}
    if len(per_step) != 1 or any("throughput_tokens_per_s" not in r.metrics for r in recs):
        return None
    steps = _pooled_steps(recs)
    return steps.reciprocal(per_step.pop()) if steps.lo > 0 else None


def _spread_of(name: str, records: Sequence[ResultRecord]) -> Callable[[Sequence[ResultRecord]], Any] | None:
    """How a time metric's interval is drawn from the records' per-step times, or None."""
    if name == "step_time_s":
        return _pooled_steps
    if name == "throughput_tokens_per_s" and all("tokens_per_step" in r.metrics
                                                 for r in records if name in r.metrics):
        return _throughput
    return None


def records_to_table(
    records: Sequence[ResultRecord],
    metrics: Sequence[str] | None = None,
    group_by: Sequence[str] = ("algorithm", "model", "world_size", "backend"),
    title: str = "commbench results",
) -> Table:
    """One row per distinct ``group_by`` value (in first-seen order), one column per metric.

    Rows are split further by every config field whose value differs between the records
    (``--set`` fields, algorithm parameters, data, steps, ...), each shown as a column, and by
    the link (net, bandwidth, latency: a ``link`` column whenever any run was shaped); only
    :data:`POOLED` fields (the seed, limits, meters) are pooled over, and a note names those
    that differ inside a row.

    ``metrics`` defaults to :data:`DEFAULT_METRICS`; the pseudo-metric
    ``throughput`` stands for whichever of ``throughput_tokens_per_s`` /
    ``throughput_samples_per_s`` the records carry. Several records in one
    group (repeats, seeds) are averaged for numbers; a string metric shows its
    value when all agree and ``"<k> distinct"`` otherwise; a ``runs`` column
    appears. ``group_by`` keys are record fields or ``config.`` paths.
    When every record kept its per-step times (``history["step_time_s"]``), step
    time and token throughput are shown as median [IQR] over the steps (a row's
    runs pooled) instead of a mean of medians.
    """
    records = list(records)
    if not records:
        raise TableError("no result records to tabulate")
    requested = list(DEFAULT_METRICS if metrics is None else metrics)
    if metrics is None and any(WIRE_METRICS[0] in r.metrics for r in records):
        requested[1:1] = WIRE_METRICS  # a netns run: the kernel's count is why it was run
    available = sorted({m for r in records for m in r.metrics})
    names: list[str] = []
    for m in requested:
        if m == "throughput":
            present = [t for t in THROUGHPUT_METRICS if any(t in r.metrics for r in records)]
            names.extend(t for t in present if t not in names)
        elif m not in names:
            if not any(m in r.metrics for r in records):
                if metrics is None:  # a default metric no record measured (e.g. memory="rss")
                    continue
                raise TableError(f"no record has metric {m!r}; available: {', '.join(available)}")
            names.append(m)

    group_by = list(group_by)
    if "link" not in group_by and any(link_of(r) != "unshaped" for r in records):
        group_by.append("link")
    group_by += _split_fields(records, group_by)
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault(tuple(_group_value(r, k) for k in group_by), []).append(r)
    multi = any(len(g) > 1 for g in groups.values())
    # every record kept its per-step times: the time columns show median [IQR] over the steps
    # (a group's runs pooled); an older record without them leaves the bare value
    timed = all(_step_times(r) for r in records)
    synthetic = any(r.data_kind == "synthetic" for r in records)

    columns = [Column(k, HEADERS.get(k, k.removeprefix("config."))) for k in group_by]
    if synthetic and "data_kind" not in group_by:
        columns.append(Column("data_kind", HEADERS["data_kind"]))
    if multi:
        columns.append(Column("runs", HEADERS["runs"]))
    for name in names:
        units = {r.metrics[name].unit for r in records if name in r.metrics}
        if len(units) > 1:
            raise TableError(f"metric {name!r} has different units across records: "
                             f"{', '.join(sorted(units))}")
        unit = units.pop()
        hib = next((r.metrics[name].higher_is_better for r in records
                    if name in r.metrics and r.metrics[name].higher_is_better is not None), None)
        shown_unit = None if name == "params_sha256" else unit
        spread = STEP_SPREAD if timed and _spread_of(name, records) else None
        columns.append(Column(name, HEADERS.get(name, name), shown_unit, hib, format_for(name, unit),
                              spread=spread))

    rows: list[dict[str, Any]] = []
    for key, recs in groups.items():
        row: dict[str, Any] = dict(zip(group_by, key, strict=True))
        if synthetic and "data_kind" not in group_by:
            kinds = {r.data_kind for r in recs}
            row["data_kind"] = kinds.pop() if len(kinds) == 1 else "mixed"
        if multi:
            row["runs"] = len(recs)
        for name in names:
            vals = [r.metrics[name].value for r in recs if name in r.metrics]
            if timed and vals and _spread_of(name, records):
                row[name] = _spread_of(name, records)(recs)
                continue
            if not vals:
                row[name] = None
            elif all(is_number(v) for v in vals):
                if len(vals) == 1 or all(v == vals[0] for v in vals):
                    row[name] = vals[0]
                else:
                    row[name] = math.fsum(vals) / len(vals)
            else:
                distinct = list(dict.fromkeys(map(str, vals)))
                row[name] = distinct[0] if len(distinct) == 1 else f"{len(distinct)} distinct"
        rows.append(row)

    notes: list[str] = []
    if multi:
        notes.append("Rows with several runs show the mean of numeric metrics.")
    pooled = _pooled_note(groups)
    if pooled:
        notes.append(pooled)
    if "params_sha256" in names:
        notes.append("params sha256: first 12 hex digits (full digest in CSV).")
    if synthetic:
        notes.append("data kind 'synthetic': a synthetic task, not real data.")
    return Table(title=title, columns=columns, rows=rows, notes=notes)

