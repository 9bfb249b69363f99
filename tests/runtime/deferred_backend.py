"""A CPU backend whose copies run as late as a CUDA copy stream may run them.

`CpuBackend` copies at issue, so a trap that forgot to wait for its copy, or waited for the
wrong one, still reads the right bytes there. Here a copy is only queued (first in, first out,
like one copy stream) and runs when the compute side waits for an event that a queued copy
records, or at `synchronize()`. A missing or wrong wait then reads stale block bytes and the
output differs. Compute-side events complete when recorded (compute runs synchronously); a
copy checks, when it runs, that the events it was ordered after had completed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from flextensor_runtime.backend import CpuBackend

__all__ = ["DeferredBackend", "DeferredEvent"]


class DeferredEvent:
    """`recorded`: records enqueued; `completed`: records whose work has run."""

    __slots__ = ("completed", "recorded")

    def __init__(self) -> None:
        self.recorded = 0
        self.completed = 0


class DeferredBackend(CpuBackend):
    synchronous = False

    def __init__(self) -> None:
        super().__init__()
        self.queue: deque[tuple[torch.Tensor, torch.Tensor, list[tuple[Any, int]], Any]] = deque()
        self.most_queued = 0  # the longest the queue got (a test shows copies were deferred)
        self.ran = 0

    def new_event(self) -> DeferredEvent:
        return DeferredEvent()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, after: list[Any], done: Any) -> None:
        # like cudaStreamWaitEvent: ordered after each event's latest record at this moment
        self.queue.append((dst, src, [(e, e.recorded) for e in after], done))
        done.recorded += 1
        self.most_queued = max(self.most_queued, len(self.queue))

    def make_copy(self, dst: torch.Tensor, src: torch.Tensor) -> Callable[[list[Any], Any], None]:
        def copy(after: list[Any], done: Any) -> None:
            self.copy_async(dst, src, after, done)

        return copy

    def _run_one(self) -> None:
        dst, src, after, done = self.queue.popleft()
        for event, needed in after:
            assert event.completed >= needed, "a copy ran before an event it waits for"
        dst.copy_(src)
        done.completed += 1
        self.ran += 1

    def wait(self, event: Any) -> None:
        while event.completed < event.recorded:
            assert self.queue, "waited for an event nothing will record"
            self._run_one()

    def record(self, event: Any) -> None:
        event.recorded += 1
        event.completed += 1

    def synchronize(self) -> None:
        while self.queue:
            self._run_one()
