"""The deployment report: per trap, what the runtime did; totals; a plain-text table.

Owns: turning trap counters and the profile into `TrapReport` / `Report` records and rendering
them as an aligned text table (no third-party renderers).
Must not know: how counters are collected, backends' internals, files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flextensor_runtime.profile import Profile
from flextensor_runtime.traps import TrapCounters

__all__ = ["Report", "TrapReport", "build_report", "format_table"]


@dataclass(frozen=True)
class TrapReport:
    """One trap's activity since install."""

    name: str
    kind: str
    calls: int
    transfers_issued: int
    bytes_moved: int
    stalls: int
    wait_ms: float  # host time spent in trap entry (issuing copies, waiting on events)


@dataclass(frozen=True)
class Report:
    """Per-trap rows plus totals for one installed profile."""

    traps: tuple[TrapReport, ...]
    transfer_mode: str
    device: str
    device_bytes_held: int
    device_peak_bytes: int
    predicted_peak_bytes: int

    @property
    def bytes_moved(self) -> int:
        return sum(t.bytes_moved for t in self.traps)

    @property
    def stalls(self) -> int:
        return sum(t.stalls for t in self.traps)

    @property
    def wait_ms(self) -> float:
        return sum(t.wait_ms for t in self.traps)

    def table(self) -> str:
        return format_table(self)

    def __str__(self) -> str:
        return self.table()


def build_report(profile: Profile, counters: Sequence[TrapCounters], device: str,
                 held_bytes: int, peak_bytes: int) -> Report:  # fmt: skip
    rows = tuple(
        TrapReport(t.name, t.kind, c.calls, c.issued, c.bytes_issued, c.stalls, c.enter_ns / 1e6)
        for t, c in zip(profile.traps, counters, strict=True)
    )
    return Report(rows, profile.config.transfer_mode, device, held_bytes, peak_bytes,
                  profile.predicted.peak_bytes)  # fmt: skip


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f}"


def format_table(report: Report) -> str:
    """An aligned plain-text table: one row per trap, then totals and memory."""
    header = ("trap", "kind", "calls", "copies", "MiB moved", "stalls", "wait ms")
    rows = [
        (t.name, t.kind, str(t.calls), str(t.transfers_issued), _mib(t.bytes_moved),
         str(t.stalls), f"{t.wait_ms:.3f}")
        for t in report.traps
    ]  # fmt: skip
    total = ("total", "", str(sum(t.calls for t in report.traps)),
             str(sum(t.transfers_issued for t in report.traps)), _mib(report.bytes_moved),
             str(report.stalls), f"{report.wait_ms:.3f}")  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows, total]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        return "  ".join(cells).rstrip()

    rule = "-" * len(line(header))
    out = [line(header), rule, *(line(r) for r in rows), rule, line(total)]
    out.append(
        f"device {report.device}, mode {report.transfer_mode}: holds {_mib(report.device_bytes_held)} "
        f"MiB, peak {_mib(report.device_peak_bytes)} MiB, predicted peak "
        f"{_mib(report.predicted_peak_bytes)} MiB"
    )
    return "\n".join(out)
