"""The order contestants take their turns in one round of an interleaved benchmark.

A rotation (round r starts at contestant r mod n) puts each contestant behind the same one in
nearly every round, so a ratio compares contestants with different predecessors, and what one
leaves behind (caches, gloo's state, sends still in flight) helps or hinders the next.  It
showed: ``comm_before_after`` with the same Comm loaded twice (an A/A run) read "now / before"
0.934 at 16 KiB and 0.973 at 1 MiB, their medians' 95 % intervals excluding 1
(``benchmarks/results/balanced-turns/``).  A random order per round, drawn from the round's
number alone (every rank draws the same), gives each contestant every predecessor and every
place in the round equally often, up to the draw's spread.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

SEED = 20261129


def turn_order(rnd: int, contestants: Sequence[T]) -> list[T]:
    """``contestants`` in the order they take their turns in round ``rnd``."""
    return random.Random(SEED * 1_000_003 + rnd).sample(list(contestants), len(contestants))
