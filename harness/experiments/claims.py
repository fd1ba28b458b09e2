"""The claims table: each paper's headline, as the paper states it, beside what this run measured,
with the criterion printed and one of three outcomes.

A row is a verdict, not a comparison: the criterion is the paper's own statement turned into a
test that can fail (a property true by construction of the code is a check in ``checks/``, not
a claim), ours and the paper's number are in the same unit, and a claim the run cannot decide
says why.  Timed claims carry an interval over steps and say "within noise" when it covers the
criterion (:func:`timed_claim`: a claim built with its interval refuses any other outcome)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.reporting import Column, Table, format_interval
from harness.stats import Interval, ratio_of_medians

SUPPORTED, NOT_SUPPORTED, NOT_MEASURABLE = "supported", "not supported", "not measurable here"
OUTCOMES = (SUPPORTED, NOT_SUPPORTED, NOT_MEASURABLE)


@dataclass(frozen=True)
class Claim:
    """One headline claim: the paper's sentence, where it is stated, the criterion applied, the
    paper's value and ours in the same unit, and the outcome."""

    paper: str
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

    def __post_init__(self):
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


def claim(paper: str, quote: str, source: str, criterion: str, paper_value: str,
          ours: float | str | None, holds: bool | None, how: str = "", *, unit: str = "",
          fmt: str = ".3g") -> Claim:
    """Record a claim's verdict; ``reproduce`` ends with a table of all of them.

    ``holds``: whether ours meets the criterion, ``None`` when the run cannot decide (``how`` then
    says why).  A missing or NaN value cannot support anything; it can refute a claim only when
    the caller says so (an algorithm that never reaches a threshold: ``holds=False``)."""
    if _missing(ours) and holds is True:
        holds = None
        how = how or "the value was not measured"
    text = "—" if _missing(ours) else (ours if isinstance(ours, str) else f"{ours:{fmt}}{unit}")
    outcome = {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds]
    c = Claim(paper, quote, source, criterion, paper_value, text, outcome, how)
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


def timed_claim(paper: str, quote: str, source: str, criterion: str, paper_value: str, ours: Interval,
                threshold: float, how: str, *, above: bool = True, fmt: str = ".3g", unit: str = "",
                undecided: str = "") -> Claim:
    """Record a claim whose measure is a time (throughput, speed-up, bandwidth) from its interval:
    supported / not supported only when the interval lies wholly on one side of ``threshold``
    (``above``: ours must reach it), else "not measurable here", within noise.  ``undecided``: a
    reason the run cannot decide even so (the machine's load); ``ours`` is shown ``value unit [lo, hi]``."""
    holds, why = timed_verdict(ours.lo, ours.hi, threshold, above=above)
    if undecided:
        holds, why = None, "; ".join(x for x in (undecided, why) if x)
    text = format_interval(ours.value, ours.lo, ours.hi, lambda x: f"{x:{fmt}} {unit}".rstrip())
    c = Claim(paper, quote, source, criterion, paper_value, text,
              {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}[holds],
              "; ".join(x for x in (why, how) if x), interval=ours, threshold=threshold)
    _CLAIMS.append(c)
    return c


def claims_table(claims: list[Claim]) -> Table:
    return Table(
        title="claims: each paper's headline as stated, tested at this machine's scale",
        columns=[Column("paper", "paper"), Column("quote", "claim (the paper's words)"),
                 Column("source", "stated for"), Column("criterion", "criterion"),
                 Column("paper_value", "paper"), Column("ours", "ours"), Column("outcome", "outcome"),
                 Column("how", "how measured / why not measurable")],
        rows=[dict(paper=c.paper, quote=c.quote, source=c.source, criterion=c.criterion,
                   paper_value=c.paper_value, ours=c.ours, outcome=c.outcome, how=c.how) for c in claims],
        caption="each claim measured at the paper's hyper-parameters, scaled only in model size and steps "
                "(2 CPU cores, random-weight models of the papers' shapes, byte-level text); 'not "
                "supported' is a finding, not a failure; properties true by construction are checks, "
                "not claims",
        notes=["checks, not claims (true by construction of the code): Clapping's EF memory independent of "
               "the dataset size and AQ-SGD's growing per sample (checks/test_compressed_pipeline.py); "
               "Protocol Models' payload ratio d/k (checks/test_protocol.py)"])


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

