"""The CUDA backend: a dedicated copy stream, CUDA events, pinned host memory.

Owns: issuing host-to-device copies on the copy stream ordered by events, stream-level waits
(never a host synchronisation in steady state), pinned host buffers, free-memory reading.
Must not know: profiles, traps, schedules, models.
"""

from __future__ import annotations

from typing import Any

import torch

from flextensor_runtime.backend.base import DeviceBackend
from flextensor_runtime.errors import BackendUnavailableError

__all__ = ["CudaBackend", "allocatable_bytes"]


def allocatable_bytes(device: torch.device) -> int:
    """Device memory PyTorch can allocate now: the driver's free bytes plus what its caching
    allocator holds unused (a model just moved off the device leaves it there)."""
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


class CudaBackend(DeviceBackend):
    """Copies run on their own stream; the compute stream waits on per-transfer events."""

    synchronous = False

    def __init__(self, device: torch.device | str = "cuda", pinned: bool = True) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"device {str(device)!r} was requested but CUDA is not available; "
                "pass device='cpu' or run on a machine with a GPU"
            )
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.pinned = pinned
        self.copy_stream = torch.cuda.Stream(device=self.device)

    def device_name(self) -> str:
        return str(torch.cuda.get_device_properties(self.device).name)

    def free_bytes(self) -> int:
        return allocatable_bytes(self.device)

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.device == self.device

    def alloc_device(self, nbytes: int) -> torch.Tensor:
        buf = super().alloc_device(nbytes)  # allocated on the compute stream
        # the copy stream writes it: that stream first waits for the compute work queued so far
        # (the memory's previous owner may still be in use there), and freeing the block
        # (remove, a failed install) waits for the copies queued into it
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        buf.record_stream(self.copy_stream)
        return buf

    def empty_for_copy(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        # allocated on the copy stream (so reuse of freed memory is ordered after earlier
        # copies) and marked as used by the compute stream (so freeing waits for its readers)
        with torch.cuda.stream(self.copy_stream):
            t = self.empty_device(shape, stride, dtype)
        t.record_stream(torch.cuda.current_stream(self.device))
        return t

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=self.pinned)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, after: list[Any], done: Any) -> None:
        stream = self.copy_stream
        for event in after:
            stream.wait_event(event)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        done.record(stream)

    def wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def record(self, event: Any) -> None:
        event.record(torch.cuda.current_stream(self.device))

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
