"""Clocks that timestamp trap boundaries: CUDA events on a GPU, synchronised perf_counter on CPU.

Owns: taking a mark cheaply while the forward runs and turning the marks into milliseconds once
the iteration is over (one device synchronisation per iteration, none inside it).
Must not know: traps, events' meaning, the model.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

__all__ = ["Clock", "CpuClock", "CudaClock", "clock_for"]


class Clock(Protocol):
    def mark(self) -> Any: ...

    def to_ms(self, marks: list[Any]) -> list[float]:
        """Milliseconds since the first mark, one per mark (synchronises the device)."""
        ...


class CpuClock:
    """`time.perf_counter`; CPU kernels run synchronously, so a mark is taken after the work."""

    def mark(self) -> float:
        return time.perf_counter()

    def to_ms(self, marks: list[Any]) -> list[float]:
        if not marks:
            return []
        first = float(marks[0])
        return [(float(m) - first) * 1e3 for m in marks]


class CudaClock:
    """CUDA events recorded on the current stream; read after one synchronize per iteration."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def to_ms(self, marks: list[Any]) -> list[float]:
        if not marks:
            return []
        torch.cuda.synchronize(self.device)
        first = marks[0]
        return [0.0] + [float(first.elapsed_time(m)) for m in marks[1:]]


def clock_for(device: torch.device) -> Clock:
    """The clock for measuring on `device`."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
