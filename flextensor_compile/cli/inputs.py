"""Reading the files `ftc` commands take, with a last guard for damage the readers miss.

Owns: turning any unforeseen failure while decoding a stats file (a field of the wrong type the
validator does not check yet) into one `StatsFormatError` line naming the file and the fix,
instead of an internal error. Must not know: the stats format itself (`flextensor_compile.stats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flextensor_runtime.errors import FlextensorError, StatsFormatError

if TYPE_CHECKING:
    from flextensor_compile.stats import Stats

__all__ = ["read_stats"]

# What decoding a well-formed JSON document of the wrong shape can raise.
_DECODE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                  RecursionError)  # fmt: skip


def read_stats(path: Path) -> Stats:
    """`load_stats(path)`; every failure is a one-line `FlextensorError`."""
    from flextensor_compile.stats import load_stats

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
