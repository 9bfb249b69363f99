"""Reading the files `ftc` commands take, with a last guard for damage the readers miss.

Owns: refusing, unread, an input that is not a regular file (`/dev/zero` would be read until
memory runs out, a named pipe would block for ever) or is far larger than any stats file; and
turning any unforeseen failure while decoding a stats file (a field of the wrong type the
validator does not check yet) into one `StatsFormatError` line naming the file and the fix,
instead of an internal error; telling a compiled profile from a stats file by its first byte, for
the commands that re-solve either (`read_measurements`). Must not know: the stats format itself (`flextensor_compile.stats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flextensor_runtime.errors import FlextensorError, StatsFormatError

if TYPE_CHECKING:
    from flextensor_compile.stats import Stats
    from flextensor_runtime.profile import PlanConfig, Profile

__all__ = ["MAX_STATS_BYTES", "check_regular_file", "read_input", "read_measurements",
           "read_stats"]  # fmt: skip

_MSGPACK_MAPS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])  # a profile starts with a map

MAX_STATS_BYTES = 256 << 20  # a stats file lists each tensor once: real ones are a few MB

# What decoding a well-formed JSON document of the wrong shape can raise.
_DECODE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                  RecursionError)  # fmt: skip


def check_regular_file(path: Path, error: type[FlextensorError], fix: str) -> None:
    """`path`, if it exists and is not a folder (those have their own messages), is a regular
    file; checked with `stat`, so a pipe is never opened."""
    if path.exists() and not path.is_dir() and not path.is_file():
        raise error(f"{path}: is not a regular file (a device or a pipe); {fix}")


def read_stats(path: Path) -> Stats:
    """`load_stats(path)`; every failure is a one-line `FlextensorError`."""
    from flextensor_compile.stats import load_stats

    fix = "pass the file written by `ftc profile --save-stats`"
    check_regular_file(path, StatsFormatError, fix)
    if path.is_file() and path.stat().st_size > MAX_STATS_BYTES:
        raise StatsFormatError(
            f"{path}: {path.stat().st_size} bytes is larger than any stats file "
            f"({MAX_STATS_BYTES} bytes at most); {fix}"
        )
    try:
        return load_stats(path)
    except FlextensorError:
        raise
    except _DECODE_ERRORS as exc:
        cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        raise StatsFormatError(
            f"{path}: a field has the wrong type or value ({cause}); regenerate the file with "
            "`ftc profile --save-stats`"
        ) from None


def read_measurements(path: Path) -> tuple[Stats, PlanConfig | None]:
    """(stats, None) from a stats JSON file, or (its stats, its config) from a compiled profile
    (`stats_from_profile`): what `ftc plan` and `ftc sweep` re-solve."""
    stats, profile = read_input(path)
    return stats, None if profile is None else profile.config


def read_input(path: Path) -> tuple[Stats, Profile | None]:
    """(stats, None) from a stats JSON file, or (its stats, the profile) from a profile."""
    from flextensor_compile.sweep import stats_from_profile
    from flextensor_runtime.profile import load

    if not path.is_file():  # a missing file, a folder or a device: one line, nothing read
        if not path.exists():
            raise StatsFormatError(
                f"{path}: no such file; pass a stats file (`ftc profile --save-stats`) or a "
                "profile (`ftc profile -o`)"
            )
        return read_stats(path), None
    with open(path, "rb") as fh:
        head = fh.read(1)
    if not head:
        raise StatsFormatError(
            f"{path}: the file is empty; pass a stats file (`ftc profile --save-stats`) or a "
            "profile (`ftc profile -o`)"
        )
    if head[0] not in _MSGPACK_MAPS:  # text, JSON: read as a stats file
        return read_stats(path), None
    profile = load(path)
    return stats_from_profile(profile), profile
