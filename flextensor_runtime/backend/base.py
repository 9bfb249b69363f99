"""The device backend interface the runtime drives: memory, copies, events, an event log.

Owns: what a backend must offer (allocate device blocks and host buffers, issue a host-to-device
copy on a copy stream, record and wait on events, report free device memory) and the byte
accounting of what the runtime holds on the device.
Must not know: profiles, traps, schedules, models.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DeviceBackend"]


class DeviceBackend(ABC):
    """A device as the runtime sees it. Subclasses: `CudaBackend`, `CpuBackend`.

    `held_bytes` / `peak_held_bytes` count the device memory the runtime allocated (resident
    weights moved, memory blocks, per-use copies), not memory the model already had there.
    """

    device: torch.device
    synchronous: bool  # True when a copy has finished once `copy_async` returns (CPU)
    pinned: bool  # whether host buffers are page-locked

    def __init__(self) -> None:
        self.held_bytes = 0
        self.peak_held_bytes = 0

    def device_name(self) -> str:
        """The device's product name as `ftc profile` records it for the device it measured on
        (`DeviceSpec.name`); the device string on the CPU."""
        return str(self.device)

    # --- memory -------------------------------------------------------------------------
    @abstractmethod
    def free_bytes(self) -> int:
        """Device memory this backend can allocate right now, in bytes (on CUDA: free in the
        driver plus what the caching allocator holds unused)."""

    @abstractmethod
    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` already lives in this backend's device memory."""

    def _count(self, nbytes: int) -> None:
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def uncount(self, nbytes: int) -> None:
        """Forget `nbytes` the runtime no longer holds (a freed per-use copy, a removed block)."""
        self.held_bytes -= nbytes
        assert self.held_bytes >= 0, "released more device bytes than were held"

    def alloc_device(self, nbytes: int) -> torch.Tensor:
        """A fresh uint8 device buffer of `nbytes`, counted as held."""
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._count(nbytes)
        return buf

    def empty_device(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        """A fresh typed device tensor with the given layout, counted as held."""
        t = torch.empty_strided(shape, stride, dtype=dtype, device=self.device)
        self._count(t.numel() * t.element_size())
        return t

    def empty_for_copy(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        """A per-use device tensor that the copy stream fills and the compute stream reads."""
        return self.empty_device(shape, stride, dtype)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Move a tensor to the device once (a resident weight); counted as held."""
        self._count(tensor.numel() * tensor.element_size())
        return tensor.to(self.device, copy=False)

    @abstractmethod
    def alloc_host(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of `nbytes` (pinned where the backend supports it)."""

    # --- copies and events --------------------------------------------------------------
    @abstractmethod
    def new_event(self) -> Any:
        """A fresh event object (not yet recorded)."""

    @abstractmethod
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, after: list[Any], done: Any) -> None:
        """Copy host `src` into device `dst` on the copy stream once every event in `after` has
        completed; record `done` on the copy stream after the copy."""

    def make_copy(self, dst: torch.Tensor, src: torch.Tensor) -> Callable[[list[Any], Any], None]:
        """A reusable `copy(after, done)` of host `src` into device `dst` (see `copy_async`)."""

        def copy(after: list[Any], done: Any) -> None:
            self.copy_async(dst, src, after, done)

        return copy

    @abstractmethod
    def wait(self, event: Any) -> None:
        """Make the compute stream wait for `event` (no host synchronisation)."""

    @abstractmethod
    def record(self, event: Any) -> None:
        """Record `event` on the compute stream (marks the end of a trap's reads)."""

    def synchronize(self) -> None:
        """Wait on the host for all device work (used only outside steady state)."""
        return None
