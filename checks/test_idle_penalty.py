"""The shaped benchmarks' precondition: compute after an idle spell against back to back
(``benchmarks.idle_penalty``), timed on a fake clock so the check is exact."""

from __future__ import annotations

import pytest

from benchmarks import idle_penalty
from benchmarks.idle_penalty import FAULT_BELOW, MAX_PENALTY, penalty, penalty_of, probe, verdict


class _Machine:
    """A clock where work takes 1 s back to back and ``slow`` s right after a sleep."""

    def __init__(self, slow: float):
        self.now, self.slow, self.slept = 0.0, slow, False

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept = True

    def work(self) -> None:
        self.now += self.slow if self.slept else 1.0
        self.slept = False


@pytest.mark.parametrize("slow", [1.0, 3.0, 0.5])
def test_penalty_is_the_time_after_a_sleep_over_the_time_back_to_back(monkeypatch, slow):
    m = _Machine(slow)
    monkeypatch.setattr(idle_penalty.time, "perf_counter", lambda: m.now)
    monkeypatch.setattr(idle_penalty.time, "sleep", m.sleep)
    assert penalty(m.work, 0.05, repeats=5) == slow


def test_a_probe_times_the_work_back_to_back_then_after_the_gap(monkeypatch):
    # what paced_interleaved calls between its rounds, one pair at a time
    m = _Machine(3.0)
    monkeypatch.setattr(idle_penalty.time, "perf_counter", lambda: m.now)
    monkeypatch.setattr(idle_penalty.time, "sleep", m.sleep)
    assert probe(m.work, 0.05) == (1.0, 3.0)
    assert penalty_of([(1.0, 3.0), (2.0, 2.0), (1.0, 5.0)]) == 3.0 / 1.0  # median over median
    with pytest.raises(ValueError):
        probe(m.work, -0.01)  # refused before the fake sleep, which would take it
    with pytest.raises(ValueError):
        penalty_of([])


def test_penalty_rejects_a_negative_gap_or_no_repeats():
    with pytest.raises(ValueError):
        penalty(lambda: None, -1.0)
    with pytest.raises(ValueError):
        penalty(lambda: None, 0.0, repeats=0)


def test_verdict_counts_a_miss_only_where_the_precondition_holds():
    # the penalty only slows the shaped step: within the goal is met whatever it is
    assert verdict(1.08, 1.10, MAX_PENALTY) == "met"
    assert verdict(1.08, 1.10, 7.0) == "met"
    assert verdict(1.10, 1.10, 1.0) == "met"  # "<= 1.10 of the bound"
    assert verdict(1.12, 1.10, 1.0) == "not met"
    assert verdict(1.12, 1.10, MAX_PENALTY) == "not met"
    assert verdict(1.12, 1.10, MAX_PENALTY + 0.01).startswith("not measurable here")
    assert verdict(1.20, 1.10, 7.0).startswith("not measurable here")
    assert verdict(FAULT_BELOW - 0.01, 1.10, 1.0).startswith("a measurement fault")
    assert verdict(FAULT_BELOW, 1.10, 1.0) == "met"
