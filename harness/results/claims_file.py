"""``claims.json`` (``commbench.claims/1``): the claims table of a ``reproduce`` run as data.

One row per claim, keyed by its stable id, so that two commits' verdicts can be compared
(``commbench compare OLD NEW``).  The row's fields and their types are stated once, here:
:class:`ClaimRow` validates itself on construction, so the writer
(:func:`harness.experiments.claims.claims_json`) and the reader (:func:`read_claims`) hold
every row to the same rules.  A file that breaks one raises :class:`ClaimsError`, one line
naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

CLAIMS_SCHEMA = "commbench.claims/1"
SUPPORTED, NOT_SUPPORTED, NOT_MEASURABLE = "supported", "not supported", "not measurable here"
OUTCOMES = (SUPPORTED, NOT_SUPPORTED, NOT_MEASURABLE)
CLAIM_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")  # lower-case words joined by '.' or '-'
CLAIMS_FILE = "claims.json"  # its name in an export directory (one experiment's: <name>-claims.json)


class ClaimsError(ValueError):
    """A claims file or row that breaks the schema (the message names the file and the field)."""


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _opt(check):
    return lambda x: x is None or check(x)


def _interval(x: Any) -> bool:
    return isinstance(x, list | tuple) and len(x) == 2 and all(v is None or _is_num(v) for v in x)


# field -> (test, what the test accepts); every ClaimRow field has one
_TYPES = {
    "id": (lambda x: isinstance(x, str) and bool(CLAIM_ID.match(x)),
           "lower-case words joined by '.' or '-'"),
    "outcome": (lambda x: x in OUTCOMES, f"one of {', '.join(map(repr, OUTCOMES))}"),
    **{k: (lambda x: isinstance(x, str), "a string")
       for k in ("paper", "quote", "source", "criterion", "ours", "paper_value", "how")},
    **{k: (_opt(_is_num), "a finite number or null") for k in ("value", "threshold")},
    "interval": (_opt(_interval), "null or [lo, hi] of finite numbers or nulls"),
    **{k: (_opt(lambda x: isinstance(x, str) and bool(x)), "a non-empty string or null")
       for k in ("precondition", "precondition_measured")},
    "precondition_held": (_opt(lambda x: isinstance(x, bool)), "true, false or null"),
}


@dataclass(frozen=True)
class ClaimRow:
    """One row of ``claims.json``, in the file's key order."""

    id: str
    paper: str
    quote: str
    source: str
    criterion: str
    outcome: str
    ours: str
    value: float | None
    interval: tuple[float | None, float | None] | None
    threshold: float | None
    paper_value: str
    how: str
    precondition: str | None
    precondition_measured: str | None
    precondition_held: bool | None

    def __post_init__(self) -> None:
        for f in fields(self):
            test, accepts = _TYPES[f.name]
            v = getattr(self, f.name)
            if not test(v):
                raise ClaimsError(f"claim {self.id!r}: {f.name} must be {accepts}, got {v!r}")
        pre = (self.precondition, self.precondition_measured, self.precondition_held)
        if any(x is None for x in pre) and any(x is not None for x in pre):
            raise ClaimsError(f"claim {self.id!r}: a precondition gives its condition, what was "
                              "measured and whether it held, or none of them")
        # a failed precondition is never "not supported" (nor "supported")
        if self.precondition_held is False and self.outcome != NOT_MEASURABLE:
            raise ClaimsError(f"claim {self.id!r}: its precondition failed, so it is "
                              f"{NOT_MEASURABLE!r}, not {self.outcome!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval"] = None if self.interval is None else list(self.interval)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> ClaimRow:
        if not isinstance(d, dict):
            raise ClaimsError(f"a claim row must be an object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        missing, extra = [k for k in names if k not in d], sorted(set(d) - set(names))
        if missing or extra:
            raise ClaimsError(f"claim {d.get('id')!r}: " + "; ".join(
                x for x in (missing and f"missing {', '.join(missing)}",
                            extra and f"unknown {', '.join(extra)}") if x))
        iv = d["interval"]
        return cls(**{**d, "interval": tuple(iv) if isinstance(iv, list) else iv})


@dataclass(frozen=True)
class ClaimsFile:
    provenance: str
    claims: tuple[ClaimRow, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.provenance, str):
            raise ClaimsError(f"provenance must be a string, got {self.provenance!r}")
        ids = [c.id for c in self.claims]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:  # compare matches rows by id
            raise ClaimsError(f"claim ids must be unique in a run: {', '.join(dupes)}")

    def by_id(self) -> dict[str, ClaimRow]:
        return {c.id: c for c in self.claims}

    def to_json(self) -> str:
        return json.dumps({"schema": CLAIMS_SCHEMA, "provenance": self.provenance,
                           "claims": [c.to_dict() for c in self.claims]},
                          indent=1, allow_nan=False) + "\n"


def claims_file_in(path: str | os.PathLike) -> Path | None:
    """The claims file ``path`` names: the file itself, or a directory's ``claims.json`` (else its
    one ``<name>-claims.json``); None for a directory without one."""
    p = Path(path)
    if not p.is_dir():
        return p
    if (p / CLAIMS_FILE).is_file():
        return p / CLAIMS_FILE
    found = sorted(f for f in p.glob(f"*-{CLAIMS_FILE}") if f.is_file())
    return found[0] if len(found) == 1 else None


def schema_of(path: str | os.PathLike) -> str | None:
    """The ``schema`` key of the JSON object at ``path`` (a directory: of its claims file); None
    when there is none or the file is not a readable JSON object."""
    f = claims_file_in(path)
    try:
        d = json.loads(f.read_text(encoding="utf-8")) if f is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    s = d.get("schema") if isinstance(d, dict) else None
    return s if isinstance(s, str) else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} (not valid JSON)")


def read_claims(path: str | os.PathLike) -> ClaimsFile:
    """Read and validate a claims file (or an export directory holding one); any problem is a
    :class:`ClaimsError` of one line that starts with ``path``."""
    src = os.fspath(path)
    f = claims_file_in(path)
    try:
        if f is None:
            raise ClaimsError(f"a directory without {CLAIMS_FILE} (or exactly one *-{CLAIMS_FILE})")
        try:
            text = f.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ClaimsError("no such file") from None
        except UnicodeDecodeError:
            raise ClaimsError("not UTF-8 text; not a claims file") from None
        except OSError as exc:
            raise ClaimsError(f"cannot read ({exc.strerror or exc})") from None
        try:
            d = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise ClaimsError(f"not a claims file: invalid JSON at line {exc.lineno} column "
                              f"{exc.colno} ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:
            raise ClaimsError(f"not a claims file: {exc}") from None
        if not isinstance(d, dict):
            raise ClaimsError(f"not a claims file (a JSON {type(d).__name__}, not an object)")
        if d.get("schema") != CLAIMS_SCHEMA:
            raise ClaimsError(f"not a claims file (schema {d.get('schema')!r}, expected {CLAIMS_SCHEMA!r})")
        if set(d) != {"schema", "provenance", "claims"} or not isinstance(d["claims"], list):
            raise ClaimsError("a claims file holds exactly 'schema', 'provenance' and a list 'claims'")
        return ClaimsFile(d["provenance"], tuple(ClaimRow.from_dict(c) for c in d["claims"]))
    except ClaimsError as exc:
        where = src if f is None or f == Path(src) else f"{src} ({f.name})"
        raise ClaimsError(f"{where}: {exc}") from None
