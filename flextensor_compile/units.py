"""Human sizes and rates: parsing `6GiB`, `24GB/s`, and printing bytes, counts and text for people.

Owns: the unit suffixes the CLI accepts, how sizes are shown, and text from files shown as
written (control characters as escapes). Must not know: torch, profiles.
"""

from __future__ import annotations

import re

from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ConfigError

__all__ = ["count_of", "format_bytes", "format_fraction", "format_ms", "format_rate", "parse_rate",
           "parse_size", "printable"]  # fmt: skip

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
    "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10, "mib": 2**20, "gib": 2**30,
    "tib": 2**40, "pib": 2**50,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """`"6GiB"` -> 6442450944; plain numbers are bytes. Raises ConfigError naming the value."""
    return _amount(str(text), str(text), what, rate=False)


def parse_rate(text: str, what: str = "bandwidth") -> float:
    """`"24GB/s"` -> 24e9 bytes per second (the `/s` is optional; plain numbers are bytes per
    second). Raises ConfigError naming the value, with rates to write instead."""
    raw = str(text).strip()
    body = raw[:-2] if raw.lower().endswith("/s") else raw
    return float(_amount(body, str(text), what, rate=True))


def _amount(body: str, text: str, what: str, rate: bool) -> int:
    """A whole number of bytes (per second, for a `rate`) from `body`; `text` is the value as
    typed, for the message."""
    if rate:
        kind, plain, one, limit = "rate", "bytes per second", "one byte per second", "1 PiB/s"
        examples, fractional = "e.g. 24GB/s, 12GiB/s, 2.5e10", "1.5GB/s"
    else:
        kind, plain, one, limit = "size", "bytes", "one byte", "1 PiB"
        examples, fractional = "e.g. 6GiB, 500MB, 1.5e9", "1.5GiB"
    m = _SIZE.match(body)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(
            f"{what} {text!r} is not a {kind}; write {plain} or a number with a unit, {examples}"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if 0 < value < 1:
        hint = "; for a fraction of device memory use --mem-fraction" if what == "--budget" else ""
        raise ConfigError(
            f"{what} {text!r} is less than {one}: {kind}s are {plain} or a number with a unit, "
            f"{examples.split(',')[0]}{hint}"
        )
    if value <= 0 or value > 2**50:
        raise ConfigError(
            f"{what} {text!r} is out of range; give a positive {kind} up to {limit}, {examples}"
        )
    if _UNITS[unit] == 1 and value != int(value):
        raise ConfigError(f"{what} {text!r} is not a whole number of {plain}; give {plain}, or a "
                          f"number with a unit, e.g. {fractional}")  # fmt: skip
    return int(value)


def format_bytes(n: int | float | None) -> str:
    """1536 -> "1.5 KiB" (binary units, 3 significant figures; 1000-1023 of a unit in full,
    "1022 KiB", where 3 figures would print "1.02e+03")."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if abs(value) >= 999.5 else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_ms(ms: float) -> str:
    """Milliseconds to 3 decimals, or 4 significant figures once that would run past 7 digits
    ("6.894e+17" from absurd measurements, not an 18-digit column)."""
    return f"{ms:.3f}" if abs(ms) < 1e6 else f"{ms:.4g}"


def format_fraction(f: float) -> str:
    """A budget fraction: 2 decimals ("0.20"), more when it has them ("0.125", not "0.12")."""
    return f"{f:.2f}" if abs(f * 100 - round(f * 100)) < 1e-9 else f"{f:.4g}"


def format_rate(bytes_per_s: float) -> str:
    """24e9 -> "24.0 GB/s" (decimal units, as bandwidths are usually quoted)."""
    return f"{bytes_per_s / 1e9:.1f} GB/s"


def printable(text: object) -> str:
    """`text` with control characters shown as escapes (`\\x1b`), so a terminal or a font never
    acts on them."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))
