"""The claims table: each paper's headline, as the paper states it, beside what this run measured,
with the criterion printed and one of three outcomes.

A row is a verdict, not a comparison: the criterion is the paper's own statement turned into a
test that can fail (a property true by construction of the code is a check in ``checks/``, not
a claim), ours and the paper's number are in the same unit, and a claim the run cannot decide
says why.  Timed claims carry an interval over steps and say "within noise" when it covers the
criterion (:func:`timed_claim`: a claim built with its interval refuses any other outcome)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.reporting import Column, Table, format_interval
from harness.results.claims_file import (  # noqa: F401 (CLAIMS_SCHEMA, OUTCOMES: re-exported)
    CLAIM_ID,
    CLAIMS_SCHEMA,
    NOT_MEASURABLE,
    NOT_SUPPORTED,
    OUTCOMES,
    SUPPORTED,
    ClaimRow,
    ClaimsFile,
)
from harness.stats import Interval, ratio_of_medians


@dataclass(frozen=True)
class Precondition:
    """The measurable condition under which the paper's mechanism can show, measured in the same
    run: ``condition`` in words with its threshold, ``measured`` what this run saw, ``held``
    whether it met the condition.  A claim whose precondition failed is "not measurable here"
    whatever its value: a failed precondition is never "not supported"."""

    condition: str
    measured: str
    held: bool

    def __post_init__(self):
        if not isinstance(self.held, bool):
            raise ValueError(f"precondition held must be a bool, got {self.held!r}")
        if not self.condition or not self.measured:
            raise ValueError("a precondition states its condition and what was measured")

    def text(self) -> str:
        return f"{self.condition} (measured {self.measured}: {'held' if self.held else 'failed'})"


def outcome_of(holds: bool | None, precondition: Precondition | None = None) -> str:
    """The outcome a verdict records: a failed precondition is "not measurable here" whatever
    ``holds`` says; else supported / not supported / (``None``) not measurable here."""
    if precondition is not None and not precondition.held:
        return NOT_MEASURABLE
    return {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds]


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict as a pure function of its measurements gives it, before it is recorded
    (:func:`claim`): whether ours meets the criterion (``None``: undecided), the text of ours,
    how it was decided, the precondition and ours as a number."""

    holds: bool | None
    ours: str
    how: str = ""
    precondition: Precondition | None = None
    value: float | None = None

    @property
    def outcome(self) -> str:
        return outcome_of(self.holds, self.precondition)


def paper_name(key: str) -> str:
    """The name a table shows for a paper key (a key outside PAPERS, e.g. a check's, as it is)."""
    from harness.registry import PAPERS

    return PAPERS.get(key, key)


@dataclass(frozen=True)
class Claim:
    """One headline claim: the paper's sentence, where it is stated, the criterion applied, the
    paper's value and ours in the same unit, and the outcome."""

    id: str  # stable across commits (``commbench compare`` matches rows by it), e.g. "sparq.comm-vs-zo"
    paper: str  # the paper's key (harness.registry.PAPERS); tables and claims.json show its name
    quote: str  # the paper's sentence, short
    source: str  # the table / section the sentence is stated for
    criterion: str  # the test ours must pass, printed in the row
    paper_value: str
    ours: str  # "—" when nothing was measured
    outcome: str
    how: str = ""  # how it was measured and scaled; for "not measurable here", why
    # a timed claim (its measure a time, a throughput, a speed-up): the interval of ours and the
    # criterion's threshold; an interval covering the threshold decides nothing ("within noise")
    interval: Interval | None = None
    threshold: float | None = None
    precondition: Precondition | None = None
    value: float | None = None  # ours as a number (claims.json, asv); None when not numeric

    def __post_init__(self):
        if not isinstance(self.id, str) or not CLAIM_ID.match(self.id):
            raise ValueError(f"claim id must be lower-case words joined by '.' or '-', got {self.id!r}")
        if self.precondition is not None and not self.precondition.held and self.outcome != NOT_MEASURABLE:
            raise ValueError(f"{self.id}: its precondition failed, so it is not measurable here, "
                             f"not {self.outcome!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.outcome == NOT_MEASURABLE and not self.how:
            raise ValueError(f"{self.paper}: a claim not measurable here must say why")
        if (self.interval is None) != (self.threshold is None):
            raise ValueError(f"{self.paper}: a timed claim gives both its interval and its threshold")
        if self.interval is not None and self.interval.covers(self.threshold) and self.outcome != NOT_MEASURABLE:
            raise ValueError(f"{self.paper}: the interval [{self.interval.lo:.3g}, {self.interval.hi:.3g}] covers "
                             f"the criterion {self.threshold:g}: within noise, not {self.outcome!r}")


_CLAIMS: list[Claim] = []


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and x != x)


def slug(text: str) -> str:
    """``text`` as a claim-id word: lower case, runs of anything else as one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _gate(holds: bool | None, how: str, pre: Precondition | None) -> tuple[bool | None, str]:
    """A failed precondition makes any verdict "not measurable here", saying which and what was
    measured; a held one is printed beside the verdict."""
    if pre is None:
        return holds, how
    if not pre.held:
        return None, "; ".join(x for x in (f"not measurable here: {pre.text()}", how) if x)
    return holds, "; ".join(x for x in (f"precondition {pre.text()}", how) if x)


def outcome(holds: bool | None, precondition: Precondition | None = None) -> str:
    """The row's outcome from a verdict and its precondition (a failed one: not measurable here)."""
    holds, _ = _gate(holds, "", precondition)
    return {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds]


def load_guard(load: tuple[float, float], cores: int) -> str:
    """Why a timed claim cannot be decided on this machine's load ('' when it can): the rule of
    every timed claim whose ranks share the cores — with a load average (before or after the runs)
    at or above the core count, the ranks do not get a core each, so a wall-clock ratio measures
    the other work as much as ours."""
    if max(load) >= cores:
        return f"load {max(load):.1f} on {cores} shared cores: the ranks do not get a core each"
    return ""


def claim(id: str, paper: str, quote: str, source: str, criterion: str, paper_value: str,
          ours: float | str | None, holds: bool | None, how: str = "", *, unit: str = "",
          fmt: str = ".3g", precondition: Precondition | None = None,
          value: float | None = None) -> Claim:
    """Record a claim's verdict; ``reproduce`` ends with a table of all of them.

    ``id`` is the row's stable name across commits.  ``holds``: whether ours meets the criterion,
    ``None`` when the run cannot decide (``how`` then says why).  A missing or NaN value cannot
    support anything; it can refute a claim only when the caller says so (an algorithm that never
    reaches a threshold: ``holds=False``).  ``precondition``: measured in the same run; when it
    failed the outcome is "not measurable here" whatever ``holds`` says.  ``value``: ours as a
    number when ``ours`` is text."""
    if _missing(ours) and holds is True:
        holds = None
        how = how or "the value was not measured"
    holds, how = _gate(holds, how, precondition)
    text = "—" if _missing(ours) else (ours if isinstance(ours, str) else f"{ours:{fmt}}{unit}")
    if value is None and isinstance(ours, (int, float)) and not _missing(ours):
        value = float(ours)
    outcome = {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds]
    c = Claim(id, paper, quote, source, criterion, paper_value, text, outcome, how,
              precondition=precondition, value=value)
    _CLAIMS.append(c)
    return c


def ratio_interval(num: list[float], den: list[float], *, level: float = 0.95, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """median(num) / median(den) with a percentile bootstrap interval, each series resampled
    independently (per-step times of two runs; :func:`harness.stats.ratio_of_medians`)."""
    iv = ratio_of_medians([num], [den], level=level, draws=draws, seed=seed)
    return iv.value, iv.lo, iv.hi


def timed_verdict(lo: float, hi: float, threshold: float, *, above: bool = True) -> tuple[bool | None, str]:
    """The outcome of "ratio ≥ threshold" (``above``) or "≤" from an interval: decided only when the
    interval lies wholly on one side, else "within noise" (not measurable here)."""
    if lo <= threshold <= hi:
        return None, f"within noise: the 95 % interval [{lo:.3g}, {hi:.3g}] covers the criterion {threshold:g}"
    return (lo > threshold) if above else (hi < threshold), ""


def timed_holds(ours: Interval, threshold: float, how: str = "", *, above: bool = True, undecided: str = "",
                precondition: Precondition | None = None) -> tuple[bool | None, str]:
    """A timed claim's verdict (None: not measurable here) and its ``how``: decided only when the
    interval lies wholly on one side of ``threshold``, no ``undecided`` reason stands and the
    precondition held (:func:`timed_claim` records it)."""
    holds, why = timed_verdict(ours.lo, ours.hi, threshold, above=above)
    if undecided:
        holds, why = None, "; ".join(x for x in (undecided, why) if x)
    return _gate(holds, "; ".join(x for x in (why, how) if x), precondition)


def timed_claim(id: str, paper: str, quote: str, source: str, criterion: str, paper_value: str,
                ours: Interval, threshold: float, how: str, *, above: bool = True, fmt: str = ".3g",
                unit: str = "", undecided: str = "", precondition: Precondition | None = None) -> Claim:
    """Record a claim whose measure is a time (throughput, speed-up, bandwidth) from its interval:
    supported / not supported only when the interval lies wholly on one side of ``threshold``
    (``above``: ours must reach it), else "not measurable here", within noise.  ``undecided``: a
    reason the run cannot decide even so (the machine's load); ``ours`` is shown ``value unit [lo, hi]``."""
    holds, how = timed_holds(ours, threshold, how, above=above, undecided=undecided, precondition=precondition)
    text = format_interval(ours.value, ours.lo, ours.hi, lambda x: f"{x:{fmt}} {unit}".rstrip())
    c = Claim(id, paper, quote, source, criterion, paper_value, text,
              {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds],
              how, interval=ours, threshold=threshold, precondition=precondition, value=ours.value)
    _CLAIMS.append(c)
    return c


def claims_table(claims: list[Claim]) -> Table:
    return Table(
        title="claims: each paper's headline as stated, tested at this machine's scale",
        columns=[Column("id", "id"), Column("paper", "paper"), Column("quote", "claim (the paper's words)"),
                 Column("source", "stated for"), Column("criterion", "criterion"),
                 Column("paper_value", "paper"), Column("ours", "ours"), Column("outcome", "outcome"),
                 Column("how", "how measured / why not measurable")],
        rows=[dict(id=c.id, paper=paper_name(c.paper), quote=c.quote, source=c.source, criterion=c.criterion,
                   paper_value=c.paper_value, ours=c.ours, outcome=c.outcome, how=c.how) for c in claims],
        caption="each claim measured at the paper's hyper-parameters, scaled only in model size and steps "
                "(2 CPU cores); each experiment's tables say what its setting changes from the paper's (the "
                "model and whether it is pre-trained, data, sequence, steps); 'not "
                "supported' is a finding, not a failure; properties true by construction are checks, "
                "not claims",
        notes=["checks, not claims (true by construction of the code): Clapping's EF memory independent of "
               "the dataset size and AQ-SGD's growing per sample (checks/test_compressed_pipeline.py); "
               "Protocol Models' payload ratio d/k (checks/test_protocol.py)"])


def claims_json(claims: list[Claim], header: str = "") -> str:
    """``claims.json``: one object per row, keyed by its stable id, so two commits' verdicts can be
    compared (``commbench compare OLD NEW``); the rows' schema and its rules are
    :class:`harness.results.claims_file.ClaimRow`'s (unique ids among them)."""
    return ClaimsFile(header, tuple(_row(c) for c in claims)).to_json()


def _row(c: Claim) -> ClaimRow:
    pre = c.precondition
    return ClaimRow(
        id=c.id, paper=paper_name(c.paper), quote=c.quote, source=c.source, criterion=c.criterion,
        outcome=c.outcome, ours=c.ours, value=_num(c.value),
        interval=None if c.interval is None else (_num(c.interval.lo), _num(c.interval.hi)),
        threshold=_num(c.threshold), paper_value=c.paper_value, how=c.how,
        precondition=None if pre is None else pre.condition,
        precondition_measured=None if pre is None else pre.measured,
        precondition_held=None if pre is None else pre.held)


def _num(x: float | None) -> float | None:
    """A finite number as itself; NaN, infinities and None as null (JSON has no NaN)."""
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else float(x)


# two-sided 95 % Student t quantiles by degrees of freedom (repeats - 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean over repeats (seeds) and its 95 % t interval; a single repeat has no interval."""
    n = len(values)
    mu = sum(values) / n
    if n < 2:
        return mu, float("nan"), float("nan")
    sd = (sum((v - mu) ** 2 for v in values) / (n - 1)) ** 0.5
    half = _T95.get(n - 1, 1.96) * sd / n ** 0.5
    return mu, mu - half, mu + half


def _rolling(xs: list[float], w: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - w] if i >= w else 0.0)
        out.append(acc / min(i + 1, w))
    return out


def separation_step(a: list[list[float]], b: list[list[float]], window: int) -> int | None:
    """The first step (1-based) from which the 95 % bands over repeats of two sets of loss curves
    (running mean over ``window`` steps) stay apart to the end; None when they overlap at the end."""
    def band(runs):
        sm = [_rolling(list(r), window) for r in runs]
        return [mean_interval([s[i] for s in sm]) for i in range(min(len(s) for s in sm))]

    ba, bb = band(a), band(b)
    apart = [alo > bhi or blo > ahi for (_, alo, ahi), (_, blo, bhi) in zip(ba, bb, strict=False)]
    if not apart or not apart[-1]:
        return None
    i = len(apart)
    while i > 0 and apart[i - 1]:
        i -= 1
    return i + 1


def provenance() -> str:
    """Where these numbers come from: commit, machine, versions, date (the claims file's header)."""
    from harness.results.environment import env_info

    e = env_info()
    return (f"Measured by `commbench reproduce` at commit {e['git_sha'] or 'unknown (not a git checkout)'} "
            f"on {e['hostname']} ({e['platform']}, {e['cpu_count']} CPUs, {e['device']}; Python {e['python']}, "
            f"torch {e['torch']}), {e['date']}.")

