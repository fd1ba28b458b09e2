"""The order of an interleaved benchmark's turns (``benchmarks.turns``)."""

from __future__ import annotations

from collections import Counter

from benchmarks.turns import turn_order


def test_every_contestant_follows_every_other_and_takes_every_place_equally_often():
    # the turns as one stream (a benchmark with no barrier between rounds runs them so): a
    # contestant's predecessor may be any of the others, and over many rounds each about as
    # often; a rotation fails this (each one nearly always behind the same one)
    for n, rounds in ((3, 3000), (6, 600)):
        stream = [i for r in range(rounds) for i in turn_order(r, range(n))]
        assert all(sorted(turn_order(r, range(n))) == list(range(n)) for r in range(rounds))
        after = Counter(zip(stream, stream[1:], strict=False))
        # within a round, n - 1 neighbours, each any of the n (n - 1) ordered pairs; across two
        # rounds, one, any of the n^2 pairs
        expect = rounds / n + (rounds - 1) / n**2
        # within 4 standard deviations of a count drawn at random (Poisson: sqrt of its mean)
        assert all(abs(after[a, b] - expect) <= 4 * expect**0.5 for a in range(n) for b in range(n) if a != b), after
        places = Counter((place, i) for r in range(rounds) for place, i in enumerate(turn_order(r, range(n))))
        assert all(abs(places[p, i] - rounds / n) <= 4 * (rounds / n)**0.5 for p in range(n) for i in range(n)), places


def test_every_rank_draws_the_same_order():
    assert [turn_order(r, range(6)) for r in range(50)] == [turn_order(r, range(6)) for r in range(50)]
    assert len({tuple(turn_order(r, range(6))) for r in range(50)}) > 20  # drawn, not one order
