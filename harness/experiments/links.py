"""How the experiments shape a link: the kernel when it can, the Comm's pacer otherwise.

With root, ``tc tbf`` in one network namespace per rank (``net="netns"``) is
the kernel-verified path and adds the wire bytes the kernel counted.  Without
root every shaped run uses the user-space pacer (``net="pacer"``,
``harness/comm/pacer.py``) at the same rate, so the main job runs as any
user.  ``COMMBENCH_SHAPING=pacer`` (or ``netns``) forces one path; the
tables say which one ran.
"""

from __future__ import annotations

import os

from harness.config import ConfigError
from harness.netns import unavailable_reason

PATHS = ("netns", "pacer")


def shaping_path() -> str:
    """'netns' or 'pacer' for this process's shaped runs."""
    forced = os.environ.get("COMMBENCH_SHAPING", "").strip().lower()
    if forced:
        if forced not in PATHS:
            raise ConfigError(f"COMMBENCH_SHAPING={forced!r}: choose from {', '.join(PATHS)}")
        if forced == "netns" and unavailable_reason():
            raise ConfigError(f"COMMBENCH_SHAPING=netns: {unavailable_reason()}")
        return forced
    return "pacer" if unavailable_reason() else "netns"


def link(bandwidth: str | None, path: str) -> dict:
    """Config fields of a 2-process link at ``bandwidth`` (None: unshaped) on ``path``."""
    if path == "netns":
        return dict(backend="gloo", net="netns", bandwidth=bandwidth)
    if bandwidth is None:
        return dict(backend="gloo", net="none")  # loopback, nothing to pace
    return dict(backend="gloo", net="pacer", bandwidth=bandwidth)


def describe(path: str) -> str:
    """One line for a table's caption: which path shaped its links."""
    if path == "netns":
        return ("links shaped by the kernel: one network namespace per rank, tc tbf on both directions; "
                "wire bytes = the kernel's interface counters")
    why = unavailable_reason()
    return ("links shaped in user space by the Comm's pacer (a token bucket per link direction at the "
            "same rate; harness/comm/pacer.py); no kernel wire bytes"
            + (f" ({why})" if why else " (COMMBENCH_SHAPING=pacer)"))
