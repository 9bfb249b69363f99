"""The runtime's event log: what the traps did, in host order, as plain tuples.

Owns: the event kinds and their fields, a bounded log, and typed records for readers (tests,
the report). Events: ("enter", trap), ("exit", trap), ("issue", transfer_trap, block, at_trap,
bytes, demand, offset), ("complete", transfer_trap) [synchronous backends only], ("wait", transfer_trap,
at_trap), ("reuse", block, new_transfer_trap, old_transfer_trap), ("release", transfer_trap,
at_trap), ("free", transfer_trap). `at_trap` is -1 for copies issued at install.
Must not know: torch, backends, models.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["EVENT_FIELDS", "Event", "EventLog"]

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "enter": ("trap",),
    "exit": ("trap",),
    "issue": ("transfer", "block", "at", "bytes", "demand", "offset"),
    "complete": ("transfer",),
    "wait": ("transfer", "at"),
    "reuse": ("block", "transfer", "previous"),
    "release": ("transfer", "at"),
    "free": ("transfer",),
}


@dataclass(frozen=True)
class Event:
    """One log record: `kind` and its fields by name (see `EVENT_FIELDS`)."""

    seq: int
    kind: str
    fields: dict[str, int]

    def __getitem__(self, key: str) -> int:
        return self.fields[key]


class EventLog:
    """A bounded append-only log of raw tuples (cheap to write on the hot path)."""

    def __init__(self, max_events: int = 200_000) -> None:
        self.raw: deque[tuple] = deque(maxlen=max_events)

    def clear(self) -> None:
        self.raw.clear()

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[Event]:
        for seq, item in enumerate(self.raw):
            kind = item[0]
            yield Event(seq, kind, dict(zip(EVENT_FIELDS[kind], item[1:], strict=True)))

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self if e.kind == kind]
