"""Human formats of table cells: bytes in KiB/MiB (base 1024), seconds in s/ms/µs,
large counts with k/M/G (base 1000), hex digests shortened; and the format a
unit implies when a column names none."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _sig(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, no exponent for ordinary magnitudes."""
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(digits - 1 - mag, 0)
    s = f"{x:.{decimals}f}"
    # rounding may carry into a new digit (9.996 -> 10.00): recompute once
    if len(s.lstrip("-").replace(".", "").lstrip("0")) > digits and decimals > 0:
        s = f"{x:.{decimals - 1}f}"
    return s


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (base 1024); below 1 KiB as '123 B'."""
    if not is_number(n) or not math.isfinite(n):
        return str(n)
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a < 1024:
        return f"{sign}{a:g} B" if isinstance(n, float) and a != int(a) else f"{sign}{int(a)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        a /= 1024.0
        if a < 1024 or unit == "PiB":
            return f"{sign}{_sig(a)} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """0.0123 -> '12.3 ms'; 4.5e-6 -> '4.50 µs'; 2.5 -> '2.50 s'."""
    if not is_number(s) or not math.isfinite(s):
        return str(s)
    a = abs(s)
    if a == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale:
            return f"{_sig(s / scale)} {unit}"
    return f"{_sig(s / 1e-9)} ns"


def format_si(x: float) -> str:
    """Large numbers with k/M/G/T (base 1000): 12345 -> '12.3k'; small ones as they are."""
    if not is_number(x) or not math.isfinite(x):
        return str(x)
    a = abs(x)
    if a < 10_000:
        if x == int(x):
            return str(int(x))
        return f"{x:.0f}" if a >= 1000 else f"{x:.4g}"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{_sig(x / scale)}{suffix}"
    raise AssertionError("unreachable")


def format_number(x: Any) -> str:
    """Default cell format: ints in full below 10⁶, floats with 4 significant digits."""
    if isinstance(x, bool) or not is_number(x):
        return str(x)
    if isinstance(x, int):
        return str(x) if abs(x) < 1_000_000 else format_si(x)
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def format_sha(x: Any) -> str:
    """A hex digest shortened to its first 12 characters."""
    return x[:12] if isinstance(x, str) else str(x)


NAMED_FORMATS: dict[str, Callable[[Any], str]] = {
    "bytes": format_bytes,
    "seconds": format_seconds,
    "si": format_si,
    "number": format_number,
    "sha": format_sha,
}


def format_interval(value: float, lo: float, hi: float, fmt: Callable[[Any], str] | str = format_number) -> str:
    """The one way a value with its interval is shown: ``value [lo, hi]``; a unit the three
    formatted numbers share is written once, after the value (``12.3 ms [11.9, 13.0]``).
    ``fmt``: a callable or a format spec (``".2f"``)."""
    f = fmt if callable(fmt) else (lambda x: format(x, fmt))
    v, a, b = f(value), f(lo), f(hi)
    unit = v.rpartition(" ")[2] if " " in v else ""
    if unit and not unit[0].isdigit() and a.endswith(" " + unit) and b.endswith(" " + unit):
        a, b = a[: -len(unit) - 1], b[: -len(unit) - 1]
    return f"{v} [{a}, {b}]"


TIME_UNITS = ("s", "ms", "µs", "ns")


def is_time_unit(unit: str | None) -> bool:
    """Seconds, or a rate per second (tokens/s): a measured time, which carries its spread."""
    return bool(unit) and (unit in TIME_UNITS or unit.endswith("/s"))


def format_for(name: str, unit: str | None) -> str | None:
    """The :data:`NAMED_FORMATS` entry a metric name and unit imply, or None (plain numbers)."""
    if name == "params_sha256" or name.endswith("_sha256"):
        return "sha"
    if unit in ("bytes", "B", "byte"):
        return "bytes"
    if unit == "s":
        return "seconds"
    if unit and ("/s" in unit or unit in ("messages", "count", "tokens", "samples")):
        return "si"
    return None

