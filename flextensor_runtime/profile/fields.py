"""Typed reading of untrusted decoded msgpack data, with one-line errors naming the field path.

Owns: checking that a decoded value has the expected type and range, and the error text for
when it does not. Must not know: which sections a profile has (see `wire`), torch, files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flextensor_runtime.errors import ProfileFormatError

__all__ = ["MAX_BYTES", "MAX_COUNT", "MAX_NUMBER", "MAX_STR", "MIN_RATE", "READ_FIX", "Reader",
           "read_section"]  # fmt: skip

# The ranges a profile's fields must lie in; the stats reader checks the same ones, so a plan
# made from any stats file it accepts is a profile this reader accepts.
# Larger than any device or model this format describes (1 PiB); guards against absurd sizes.
MAX_BYTES = 1 << 50
MAX_COUNT = 1 << 31  # calls, blocks, trap and tensor counts
MAX_NUMBER = 1e18  # times (ms) and rates (bytes/s)
MIN_RATE = 1e-9  # bytes/s: slower is no link (and divides into infinite copy times)
MAX_STR = 4096  # characters of a name or other string field (`as_str`'s default)
READ_FIX = "the file is damaged or was not written by ftc; recompile it with `ftc profile`"

T = TypeVar("T")


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


class Reader:
    """A decoded value and its path in the document (e.g. `traps[3].tensors[0].bytes`)."""

    __slots__ = ("path", "value")

    def __init__(self, value: Any, path: str) -> None:
        self.value = value
        self.path = path

    def fail(self, expected: str) -> ProfileFormatError:
        where = self.path or "top level"
        return ProfileFormatError(
            f"profile field '{where}': expected {expected}, got {_describe(self.value)}; {READ_FIX}"
        )

    def child(self, key: str | int) -> Reader:
        if isinstance(key, int):
            return Reader(self.value[key], f"{self.path}[{key}]")
        path = f"{self.path}.{key}" if self.path else key
        return Reader(self.value[key], path)

    def as_map(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            raise self.fail("a map")
        return self.value

    def as_list(self) -> list[Reader]:
        if not isinstance(self.value, list):
            raise self.fail("a list")
        return [self.child(i) for i in range(len(self.value))]

    def as_int(self, lo: int = 0, hi: int = MAX_BYTES) -> int:
        v = self.value
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail("an integer")
        if not lo <= v <= hi:
            raise self.fail(f"an integer in [{lo}, {hi}]")
        return v

    def as_float(self, lo: float = 0.0, hi: float = MAX_NUMBER) -> float:
        v = self.value
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise self.fail("a number")
        f = float(v)
        if not math.isfinite(f) or not lo <= f <= hi:
            raise self.fail(f"a finite number in [{lo}, {hi:g}]")
        return f

    def as_str(self, choices: tuple[str, ...] | None = None, max_len: int = MAX_STR) -> str:
        v = self.value
        if not isinstance(v, str) or len(v) > max_len:
            raise self.fail(f"a string of at most {max_len} characters")
        if choices is not None and v not in choices:
            raise self.fail("one of " + ", ".join(repr(c) for c in choices))
        return v

    def as_bool(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail("true or false")
        return self.value

    def optional(self, parse: Callable[[Reader], T]) -> T | None:
        return None if self.value is None else parse(self)

    def as_ints(self, lo: int = 0, hi: int = MAX_BYTES) -> tuple[int, ...]:
        return tuple(r.as_int(lo, hi) for r in self.as_list())

    def as_strs(self) -> tuple[str, ...]:
        return tuple(r.as_str() for r in self.as_list())


def read_section(reader: Reader, spec: Mapping[str, Callable[[Reader], Any]]) -> dict[str, Any]:
    """Parse a map whose keys must be exactly `spec`'s; returns field name -> parsed value."""
    raw = reader.as_map()
    missing = [k for k in spec if k not in raw]
    if missing:
        where = reader.path or "top level"
        raise ProfileFormatError(
            f"profile section '{where}' lacks field {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f"; {READ_FIX}"
        )
    extra = sorted(str(k) for k in raw if k not in spec)
    if extra:
        where = reader.path or "top level"
        raise ProfileFormatError(
            f"profile section '{where}' has unknown field {extra[0]!r}; {READ_FIX}"
        )
    return {k: parse(reader.child(k)) for k, parse in spec.items()}
