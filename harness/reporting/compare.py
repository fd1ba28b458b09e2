"""Regression report between two result sets (``commbench compare OLD NEW``).

Runs are matched by what defines them: algorithm, model, data, world size,
backend, steps, seed and the rest of the resolved config.  Deterministic
metrics — bytes and messages per step, and the ``params_sha256`` equivalence
hash — must be equal: any change is a regression and makes the command exit
non-zero.  Peak tensor bytes (live tensor storages, counted op by op) are
deterministic too, and compared where both records carry them (older records
and ``memory="rss"`` runs do not).  Time and process memory (RSS) are reported
as ratios with their noise, and never fail the comparison (these machines are
shared and noisy).

OLD and NEW are result files or directories of them, or git commits whose
asv results are stored under ``results/asv/<machine>/`` (then the asv
``track_payload_*`` / ``track_messages_*`` benchmarks are the deterministic
ones), or two claims files (``claims.json``, or export directories holding
one): then rows are matched by claim id and a changed outcome is the
regression.  Which kind an input is, is read from it (its ``schema`` key),
not from its name.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.results import ResultRecord, read_results
from harness.results.claims_file import ClaimRow, ClaimsError, ClaimsFile, read_claims, schema_of

from .table import Column, Table

DETERMINISTIC = ("payload_bytes_per_step", "messages_per_step", "framing_bytes_per_step",
                 "tokens_per_step", "params_sha256")
# deterministic, but only in records that measured them (a record without is no regression)
DETERMINISTIC_IF_MEASURED = ("peak_tensor_bytes", "peak_tensor_growth_bytes")
NOISY = ("step_time_s", "peak_memory_bytes", "peak_memory_growth_bytes")
NOISE_SIGMAS = 3.0  # a noisy change is "significant" beyond this many standard errors


@dataclass
class Change:
    run: str
    metric: str
    old: object
    new: object
    deterministic: bool
    note: str = ""

    @property
    def regression(self) -> bool:
        return self.deterministic and self.old != self.new


def _key(rec: ResultRecord) -> str:
    cfg = dict(rec.config)
    cfg.pop("metered", None)
    cfg.pop("timeout_s", None)
    cfg.pop("max_run_time_s", None)  # limits, not part of what a run computes
    cfg.pop("max_frame_bytes", None)  # (records before it was a run field lack it)
    if cfg.get("head") == "fresh":
        cfg.pop("head")  # the default (records before it was a run field lack it)
    cfg.pop("memory", None)  # which meters ran, not what ran
    return json.dumps({"algorithm": rec.algorithm, **cfg}, sort_keys=True, default=str)


def _label(rec: ResultRecord) -> str:
    """A run's name in the report: the defining fields a reader scans, the algorithm's
    parameters, and a short hash of the whole matching key so that runs whose configs
    differ anywhere never print the same label."""
    import hashlib

    cfg = rec.config
    link = f" {cfg.get('net')} {cfg.get('bandwidth')}" if cfg.get("bandwidth") else ""
    params = " ".join(f"{k}={v}" for k, v in sorted((cfg.get("params") or {}).items()))
    digest = hashlib.sha256(_key(rec).encode()).hexdigest()[:8]
    return (f"{rec.algorithm} {rec.model} w{rec.world_size} {rec.backend}{link} seed{rec.seed} "
            f"{rec.data} {rec.steps} steps" + (f" [{params}]" if params else "") + f" #{digest}")


def _by_key(records: list[ResultRecord], side: str) -> dict[str, ResultRecord]:
    """One record per config; two of one config make the comparison ambiguous."""
    out: dict[str, ResultRecord] = {}
    for r in records:
        k = _key(r)
        if k in out:
            raise ValueError(f"{side} holds two records of one config ({_label(r)}); keep one of them")
        out[k] = r
    return out


def compare_records(old: list[ResultRecord], new: list[ResultRecord]) -> tuple[list[Change], list[str]]:
    """Changes per matched run, and notes on runs present on one side only ("only in ...")."""
    o = _by_key(old, "OLD")
    n = _by_key(new, "NEW")
    changes, notes = [], []
    for k in sorted(set(o) | set(n)):
        if k not in n:
            notes.append(f"only in OLD: {_label(o[k])}")
            continue
        if k not in o:
            notes.append(f"only in NEW: {_label(n[k])}")
            continue
        a, b = o[k], n[k]
        for name in DETERMINISTIC:
            if name in a.metrics or name in b.metrics:
                va = a.metrics[name].value if name in a.metrics else None
                vb = b.metrics[name].value if name in b.metrics else None
                changes.append(Change(_label(a), name, va, vb, True))
        for name in DETERMINISTIC_IF_MEASURED:
            if name in a.metrics and name in b.metrics:
                changes.append(Change(_label(a), name, a.metrics[name].value, b.metrics[name].value,
                                      True))
        for name in NOISY:
            if name in a.metrics and name in b.metrics:
                ma, mb = a.metrics[name], b.metrics[name]
                changes.append(Change(_label(a), name, ma.value, mb.value, False, _noise_note(ma, mb)))
    return changes, notes


def _noise_note(ma, mb) -> str:
    if not ma.value:
        return ""
    ratio = mb.value / ma.value
    if ma.stderr is not None and mb.stderr is not None:
        se = math.hypot(ma.stderr, mb.stderr)
        sig = abs(mb.value - ma.value) > NOISE_SIGMAS * se
        return f"x{ratio:.3f} (±{se / ma.value:.1%} noise; {'significant' if sig else 'within noise'})"
    return f"x{ratio:.3f} (noise unknown)"


# --------------------------------------------------------------------------- asv results of commits
def _commit(rev: str) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise ValueError(f"{rev!r} is neither a result file/directory nor a git commit") from None


def _pick_machine(shas: tuple[str, str], root: Path, machine: str | None) -> str:
    """The machine both commits were measured on: times from two machines never compare."""
    have = [{p.parent.name for p in root.glob(f"*/{sha[:8]}-*.json")} for sha in shas]
    for sha, machines in zip(shas, have, strict=True):
        if not machines:
            raise ValueError(f"no asv results for commit {sha[:8]} under {root}/ "
                             f"(run scripts/asv.sh {sha[:8]})")
    if machine is not None:
        if not all(machine in m for m in have):
            raise ValueError(f"machine {machine!r} lacks asv results for one of the commits "
                             f"(old: {sorted(have[0])}, new: {sorted(have[1])})")
        return machine
    both = sorted(have[0] & have[1])
    if len(both) != 1:
        raise ValueError(f"the commits were measured together on {both or 'no machine'}; "
                         f"choose one with --machine (old: {sorted(have[0])}, new: {sorted(have[1])})")
    return both[0]


def _asv_results(sha: str, machine_dir: Path) -> dict[str, tuple[str, float | None]]:
    """``benchmark(params)`` -> (the benchmark's method name, its value); the value is None where
    asv recorded a failure and NaN where it skipped the benchmark (asv's own encoding)."""
    out: dict[str, tuple[str, float | None]] = {}
    for f in sorted(machine_dir.glob(f"{sha[:8]}-*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not a readable asv result file ({e})") from None
        cols = data.get("result_columns") if isinstance(data, dict) else None
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(cols, list) or not isinstance(results, dict) or \
                not all(isinstance(row, list) for row in results.values()):
            raise ValueError(f"{f}: not an asv result file of the format this compare reads "
                             "(needs 'result_columns' and list rows under 'results')")
        for bench, row in results.items():
            row = dict(zip(cols, row, strict=False))
            values, params = row.get("result"), row.get("params") or []
            if not all(isinstance(p, list) for p in params) or not (values is None or isinstance(values, list)):
                raise ValueError(f"{f}: benchmark {bench!r} is not in the asv format this compare reads")
            names = [",".join(p) for p in _product(params)] if params else [""]
            if values is None:  # the whole benchmark failed (its setup_cache, say)
                values = [None] * len(names)
            metric = bench.rsplit(".", 1)[-1]  # the method: the parameters may hold dots
            for i, name in enumerate(names):
                v = values[i] if i < len(values) else None
                out[f"{bench}({name})" if name else bench] = (metric, v)
    return out


def _product(params: list[list[str]]) -> list[tuple[str, ...]]:
    import itertools

    return list(itertools.product(*params))


def _no_value(v) -> str | None:
    """Why an asv value is not one: "failed" (None), "skipped" (NaN), else None."""
    if v is None:
        return "failed"
    if isinstance(v, float) and math.isnan(v):
        return "skipped"
    return None


NOT_COMPARED = "not compared: "  # a note on a metric that one side holds no value of


def compare_commits(old: str, new: str, machine: str | None = None,
                    root: Path = Path("results/asv")) -> tuple[list[Change], list[str]]:
    shas = (_commit(old), _commit(new))
    chosen = _pick_machine(shas, root, machine)
    a, b = (_asv_results(sha, root / chosen) for sha in shas)
    changes, notes, idle = [], [f"asv results of machine {chosen!r}"], []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            notes.append(f"only in {'NEW' if k in b else 'OLD'}: {k}")
            continue
        metric, va = a[k]
        vb = b[k][1]
        why_a, why_b = _no_value(va), _no_value(vb)
        if why_a and why_b:  # nothing to compare on either side, but nothing lost between them
            idle.append(f"{k} (OLD {why_a}, NEW {why_b})")
            continue
        if why_a or why_b:
            notes.append(f"{NOT_COMPARED}{k} (OLD {why_a or _short(va)}, NEW {why_b or _short(vb)})")
            continue
        det = metric.startswith(("track_payload", "track_messages", "track_peak_tensor"))
        note = "" if det or not va else f"x{vb / va:.3f} (single asv sample; noise unknown)"
        changes.append(Change(k, metric, va, vb, det, note))
    notes += [f"no value on either side: {x}" for x in idle]
    return changes, notes


def _short(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def missing_runs(notes: list[str]) -> list[str]:
    """Runs (or asv metrics) on one side only, and asv metrics one side holds no value of."""
    return [n for n in notes if n.startswith(("only in ", NOT_COMPARED))]


def exit_status(changes: list[Change], notes: list[str], allow_missing: bool = False) -> tuple[int, str]:
    """The command's exit status and its one-line reason.

    0: every run on both sides was matched and no deterministic metric moved;
    1: a deterministic metric changed, or a run is on one side only (unless
    ``allow_missing``); 2: nothing was compared at all (empty or disjoint sides).
    """
    regressions = sum(1 for c in changes if c.regression)
    missing = missing_runs(notes)
    if not changes:
        return 2, (f"nothing compared: no run is on both sides ({len(missing)} on one side only)"
                   if missing else "nothing compared: both sides are empty")
    if regressions:
        return 1, f"{regressions} deterministic change(s)"
    if missing and not allow_missing:
        valueless = sum(n.startswith(NOT_COMPARED) for n in missing)
        what = f"{len(missing) - valueless} run(s) on one side only" + (
            f", {valueless} metric(s) without a value on one side" if valueless else "")
        return 1, f"{what} (pass --allow-missing to accept)"
    return 0, "no deterministic change"


def input_kind(old: str, new: str) -> str:
    """"claims", "results" or "commits", read from the inputs; a ValueError names the bad one."""
    here = {side: Path(arg).exists() for side, arg in (("OLD", old), ("NEW", new))}
    if here["OLD"] != here["NEW"]:  # a path beside a commit: the missing path is the bad one
        side, arg = ("NEW", new) if here["OLD"] else ("OLD", old)
        other = "NEW" if side == "OLD" else "OLD"
        raise ValueError(f"{side} {arg!r}: no such file or directory ({other} is one, so {side} "
                         "must be one too)")
    if not here["OLD"]:
        return "commits"
    if any((schema_of(a) or "").startswith("commbench.claims/") for a in (old, new)):
        return "claims"  # the other side is then read as claims too, so its error is exact
    return "results"


def compare(old: str, new: str, machine: str | None = None) -> tuple[list[Change], list[str]]:
    """Result sets or commits (claims files: :func:`compare_claim_files`)."""
    if input_kind(old, new) == "results":
        return compare_records(read_results(old), read_results(new))
    return compare_commits(old, new, machine)


# --------------------------------------------------------------------------- claims files
@dataclass(frozen=True)
class ClaimChange:
    """One claim id on either side: an outcome that moved is the regression."""

    id: str
    old: ClaimRow | None
    new: ClaimRow | None

    @property
    def kind(self) -> str:
        if self.old is None or self.new is None:
            return "added" if self.old is None else "removed"
        if self.old.outcome != self.new.outcome:
            return "outcome changed"
        return "value changed" if self.old.value != self.new.value else "same"


def read_claim_sides(old: str, new: str) -> tuple[ClaimsFile, ClaimsFile]:
    out = []
    for side, arg in (("OLD", old), ("NEW", new)):
        try:
            out.append(read_claims(arg))
        except ClaimsError as e:
            raise ClaimsError(f"{side} {e}") from None
    return out[0], out[1]


def compare_claims(old: ClaimsFile, new: ClaimsFile) -> list[ClaimChange]:
    """Every id of either side, in OLD's order, then NEW's new ones."""
    a, b = old.by_id(), new.by_id()
    return [ClaimChange(i, a.get(i), b.get(i)) for i in dict.fromkeys([*a, *b])]


def claims_exit_status(changes: list[ClaimChange], allow_missing: bool = False) -> tuple[int, str]:
    """As :func:`exit_status`, with claim rows for runs: 1 on a changed outcome or a row on one
    side only (unless ``allow_missing``), 2 when no id is on both sides."""
    kinds = [c.kind for c in changes]
    one_side = kinds.count("added") + kinds.count("removed")
    if one_side == len(kinds):
        return 2, (f"nothing compared: no claim id is on both sides ({one_side} on one side only)"
                   if kinds else "nothing compared: both claims files are empty")
    if "outcome changed" in kinds:
        return 1, f"{kinds.count('outcome changed')} changed outcome(s)"
    if one_side and not allow_missing:
        return 1, f"{one_side} claim(s) on one side only (pass --allow-missing to accept)"
    return 0, "no changed outcome"


def claims_changes_table(changes: list[ClaimChange], title: str, show_all: bool = False) -> Table:
    """The rows whose outcome changed or that are on one side only (``show_all``: every row)."""
    def side(r: ClaimRow | None, key: str):
        return None if r is None else getattr(r, key)

    shown = [c for c in changes if show_all or c.kind in ("outcome changed", "added", "removed")]
    return Table(
        title=title,
        columns=[Column("id", "claim id"), Column("paper", "paper"), Column("change", "change"),
                 Column("old_outcome", "old outcome"), Column("new_outcome", "new outcome"),
                 Column("old_value", "old value", fmt=".6g"), Column("new_value", "new value", fmt=".6g")],
        rows=[dict(id=c.id, paper=side(c.new or c.old, "paper"), change=c.kind,
                   old_outcome=side(c.old, "outcome"), new_outcome=side(c.new, "outcome"),
                   old_value=side(c.old, "value"), new_value=side(c.new, "value")) for c in shown])
