"""Checks across a whole stats document, after each field was read on its own.

Owns: the one-line error a bad stats file raises (`stats_error`), and what holds between
fields: trap and tensor names are unique, a tie names an untied listed tensor, no untrapped
tensor is tied to a trap's tensor that may stream, and the weights' total fits a profile.
Must not know: JSON, files, torch, the solver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flextensor_runtime.errors import StatsFormatError
from flextensor_runtime.profile.fields import MAX_BYTES

if TYPE_CHECKING:
    from flextensor_compile.stats import Stats

__all__ = ["check_stats", "stats_error"]


def stats_error(where: str, message: str) -> StatsFormatError:
    """The error for a bad stats file: where, what, and how to fix or re-record it."""
    return StatsFormatError(f"stats {where}: {message}; fix the file or re-record it with "
                            "`ftc profile --save-stats`")  # fmt: skip


_err = stats_error


def check_stats(stats: Stats) -> None:
    """Every check across fields (`StatsFormatError` at the first that fails)."""
    _names(stats)
    _split_ties(stats)
    _total(stats)


def _split_ties(stats: Stats) -> None:
    """No untrapped tensor is tied to a trap's tensor that may stream (discovery pins those)."""
    owner = {t.name: (trap.name, t) for trap in stats.traps for t in trap.tensors}
    for i, t in enumerate(stats.untrapped):
        trap, canon = owner.get(t.tie or "", (None, None))
        if canon is not None and canon.offloadable:
            raise _err(f"untrapped[{i}].tie", f"untrapped {t.name!r} is tied to {canon.name!r} "
                       f"of trap {trap!r}, which may stream; list {t.name!r} in that trap's "
                       f"tensors, or give {canon.name!r} \"offloadable\": false")  # fmt: skip


def _total(stats: Stats) -> None:
    """The weights fit the sizes a profile can record (each tensor does; together they may not)."""
    total = sum(t.bytes for trap in stats.traps for t in trap.tensors if t.tie is None)
    total += sum(t.bytes for t in stats.untrapped if t.tie is None)
    if total > MAX_BYTES:
        raise _err("tensors", f"the weights total {total} bytes, over the {MAX_BYTES} "
                   "(1 PiB) a profile can describe")  # fmt: skip


def _names(stats: Stats) -> None:
    """Trap and tensor names are unique; a tie names a canonical (untied) tensor."""
    seen: set[str] = set()
    for trap in stats.traps:
        if trap.name in seen:
            raise _err("traps", f"trap name {trap.name!r} appears twice")
        seen.add(trap.name)
    tensors = [t for trap in stats.traps for t in trap.tensors] + list(stats.untrapped)
    names: set[str] = set()
    for t in tensors:
        if t.name in names:
            raise _err("tensors", f"tensor {t.name!r} is listed twice")
        names.add(t.name)
    tie_of = {t.name: t.tie for t in tensors}
    for t in tensors:
        if t.tie is None or tie_of.get(t.tie, t.tie) is None:
            continue
        if t.tie == t.name:
            raise _err("tensors", f"tensor {t.name!r} is tied to itself; drop its tie (a tie "
                       "names the other tensor that holds the same storage)")  # fmt: skip
        if t.tie not in tie_of:
            raise _err("tensors", f"tensor {t.name!r} is tied to {t.tie!r}, not a listed tensor; "
                       "list it or drop the tie")  # fmt: skip
        root = _tie_root(t.tie, tie_of)
        fix = f"tie {t.name!r} to {root!r}" if root else "give one of them no tie"
        raise _err("tensors", f"tensor {t.name!r} is tied to {t.tie!r}, which is itself tied to "
                   f"{tie_of[t.tie]!r}; a tie names an untied tensor: {fix}")  # fmt: skip


def _tie_root(name: str, tie_of: dict[str, str | None]) -> str | None:
    """The untied tensor a chain of ties from `name` ends at (None: the chain loops or leaves
    the listed tensors)."""
    seen = set()
    while (nxt := tie_of.get(name)) is not None:
        if name in seen:
            return None
        seen.add(name)
        name = nxt
    return name if name in tie_of else None
