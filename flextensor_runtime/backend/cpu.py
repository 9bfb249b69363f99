"""The CPU backend: the device interface emulated on host memory with the same semantics.

Owns: real, separate block buffers and host buffers in CPU memory, copies that complete before
`copy_async` returns (so events are recorded in issue order), and a fakeable free-memory
reading for budget tests.
Must not know: profiles, traps, schedules, models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
import torch

from flextensor_runtime.backend.base import DeviceBackend
from flextensor_runtime.errors import ConfigError

__all__ = ["CpuBackend", "CpuEvent"]


class CpuEvent:
    """An event on the emulated device: `recorded` counts how often it was recorded."""

    __slots__ = ("recorded",)

    def __init__(self) -> None:
        self.recorded = 0


class CpuBackend(DeviceBackend):
    """Device memory is host memory; copies are real `copy_` calls into separate buffers.

    `free_bytes_override` fixes what `free_bytes()` reports (tests of the budget check).
    """

    synchronous = True
    pinned = False

    def __init__(self, free_bytes_override: int | None = None) -> None:
        if free_bytes_override is not None and (
            not isinstance(free_bytes_override, int)
            or isinstance(free_bytes_override, bool)
            or free_bytes_override < 0
        ):
            raise ConfigError(
                f"CpuBackend(free_bytes_override={free_bytes_override!r}) is invalid; pass a "
                "number of bytes >= 0, or None for the host's available memory"
            )
        super().__init__()
        self.device = torch.device("cpu")
        self._free_override = free_bytes_override

    def free_bytes(self) -> int:
        if self._free_override is not None:
            return self._free_override
        return int(psutil.virtual_memory().available)

    def holds(self, tensor: torch.Tensor) -> bool:
        return False  # host tensors are the host copy, never counted as device memory

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu")

    def new_event(self) -> CpuEvent:
        return CpuEvent()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, after: list[Any], done: Any) -> None:
        dst.copy_(src)
        done.recorded += 1

    def make_copy(self, dst: torch.Tensor, src: torch.Tensor) -> Callable[[list[Any], Any], None]:
        copy_ = dst.copy_

        def copy(after: list[Any], done: Any) -> None:  # the hot path: one call, one memcpy
            copy_(src)
            done.recorded += 1

        return copy

    def wait(self, event: Any) -> None:
        return None  # copies are complete when issued; compute runs after them

    def record(self, event: Any) -> None:
        event.recorded += 1
