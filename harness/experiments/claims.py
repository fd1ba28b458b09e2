"""The claims table: each paper's headline beside what this run measured."""

from __future__ import annotations

from dataclasses import dataclass

from harness.reporting import Column, Table


@dataclass(frozen=True)
class Claim:
    """A paper's headline ratio beside the one this run measured."""

    paper: str
    claim: str
    paper_value: str
    ours: float | None
    supported: bool | None  # None: the run cannot decide (e.g. a value is missing)
    note: str = ""


_CLAIMS: list[Claim] = []


def claim(paper: str, claim: str, paper_value: str, ours: float | None, supported: bool | None,
          note: str = "") -> None:
    """Record a claim check; ``reproduce`` ends with a table of all of them."""
    if ours is None or (isinstance(ours, float) and ours != ours):
        ours, supported = None, None
    _CLAIMS.append(Claim(paper, claim, paper_value, ours, supported, note))


def claims_table(claims: list[Claim]) -> Table:
    verdict = {True: "yes", False: "no", None: "undecided"}
    return Table(
        title="claims: each paper's headline beside this run",
        columns=[Column("paper", "paper"), Column("claim", "claim"), Column("paper_value", "paper"),
                 Column("ours", "ours", None, None, ".3g"), Column("supported", "supported here"),
                 Column("note", "how measured")],
        rows=[dict(paper=c.paper, claim=c.claim, paper_value=c.paper_value, ours=c.ours,
                   supported=verdict[c.supported], note=c.note) for c in claims],
        caption="ratios measured side by side in one run at this machine's scale (2 CPU cores, "
                "random-weight models of the papers' shapes); 'no' is a finding, not a failure")


def provenance() -> str:
    """Where these numbers come from: commit, machine, versions, date (the claims file's header)."""
    from harness.results.environment import env_info

    e = env_info()
    return (f"Measured by `commbench reproduce` at commit {e['git_sha'] or 'unknown (not a git checkout)'} "
            f"on {e['hostname']} ({e['platform']}, {e['cpu_count']} CPUs, {e['device']}; Python {e['python']}, "
            f"torch {e['torch']}), {e['date']}.")

