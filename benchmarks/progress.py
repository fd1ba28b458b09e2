"""Progress of a long benchmark's rounds, on stderr: an interleaved run of hundreds of rounds takes
10 to 30 minutes and prints its table only at the end.

One rank reports (``report``), between rounds, never inside a timed region, and at most once per
``every_s`` seconds: a line is a write of a few dozen bytes, nothing the steps around it could
feel.  The clock is a parameter so the checks need not wait for it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

EVERY_S = 30.0


def rounds(n: int, label: str, report: bool = True, every_s: float = EVERY_S,
           clock: Callable[[], float] = time.monotonic, out: TextIO | None = None) -> Iterator[int]:
    """``range(n)``, with a line on ``out`` (stderr) once ``every_s`` seconds have passed since
    the last, and one at the end: rounds done, elapsed and, until the end, the time left at the
    pace so far.  ``report`` False (the other ranks): the bare range."""
    if not report:
        yield from range(n)
        return
    out = sys.stderr if out is None else out
    start = last = clock()
    for r in range(n):
        yield r
        now = clock()
        if r + 1 == n or now - last >= every_s:
            last = now
            done, spent = r + 1, now - start
            left = "" if done == n else f", about {spent / done * (n - done):.0f} s left"
            print(f"{label}: round {done} of {n}, {spent:.0f} s{left}", file=out)  # stderr: line-buffered
