"""Host-to-device copies for layer-wise offload, behind one small interface.

Owns: `CudaCopyBackend` (a side CUDA stream, events, pinned host memory, `record_stream` so the
allocator does not reuse a tensor the compute stream still reads) and `ThreadCopyBackend`, the
same interface on CPU where a worker thread performs real copies concurrently with compute.
Must not know: layers, hooks, models.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch

__all__ = ["CopyBackend", "CopyTicket", "CudaCopyBackend", "ThreadCopyBackend"]

CopyPairs = Sequence[tuple[torch.Tensor, torch.Tensor]]  # (device destination, host source)


class CopyTicket(Protocol):
    def wait(self) -> None:
        """Make the compute side wait until the copies are complete."""


class CopyBackend(Protocol):
    device: torch.device
    asynchronous: bool  # copies run concurrently with compute

    def pin(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def is_pageable(self, tensor: torch.Tensor) -> bool: ...

    def empty_like(self, tensor: torch.Tensor) -> torch.Tensor:
        """An uninitialised device tensor shaped like `tensor`, and a normal tensor even under
        `torch.inference_mode()`: the copy into it may run on another thread (outside inference
        mode), and a copy prefetched during one request may serve the next, under `no_grad` or
        with autograd (inference tensors can be neither written outside inference mode nor
        saved for backward)."""
        ...

    def compute_done(self) -> CopyTicket: ...

    def copy_async(self, pairs: CopyPairs, after: CopyTicket | None = None) -> CopyTicket: ...


class _Done:
    def wait(self) -> None:
        return None


class _FutureTicket:
    def __init__(self, future: Future[None]) -> None:
        self.future = future

    def wait(self) -> None:
        self.future.result()


class ThreadCopyBackend:
    """CPU stand-in for a copy stream: one worker thread copies while the caller computes.

    Host memory is directly addressable on CPU, so no tensor counts as pageable here.
    """

    asynchronous = True

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flextensor-copy")

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def is_pageable(self, tensor: torch.Tensor) -> bool:
        return False

    def empty_like(self, tensor: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(False):  # see CopyBackend.empty_like
            return torch.empty_like(tensor, device=self.device)

    def compute_done(self) -> CopyTicket:
        return _Done()  # CPU compute has finished when the call returns

    def copy_async(self, pairs: CopyPairs, after: CopyTicket | None = None) -> CopyTicket:
        def run() -> None:
            if after is not None:
                after.wait()
            for dst, src in pairs:
                dst.copy_(src)

        return _FutureTicket(self._worker.submit(run))


class _EventTicket:
    def __init__(self, event: Any, tensors: Sequence[torch.Tensor], device: torch.device) -> None:
        self.event = event
        self.tensors = tensors
        self.device = device

    def wait(self) -> None:
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.event)
        for tensor in self.tensors:
            tensor.record_stream(stream)  # the compute stream now reads it


class CudaCopyBackend:
    """A side stream for host-to-device copies of pinned tensors, ordered with events."""

    asynchronous = True

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        if self.device.index is None:  # tensors say cuda:N; a bare "cuda" would never match
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(device=self.device)

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_pinned() else tensor.pin_memory()

    def is_pageable(self, tensor: torch.Tensor) -> bool:
        return not tensor.is_pinned()

    def empty_like(self, tensor: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(self._stream), torch.inference_mode(False):  # normal tensors
            return torch.empty_like(tensor, device=self.device)

    def compute_done(self) -> CopyTicket:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return _EventTicket(event, (), self.device)

    def copy_async(self, pairs: CopyPairs, after: CopyTicket | None = None) -> CopyTicket:
        with torch.cuda.stream(self._stream):
            if isinstance(after, _EventTicket):
                self._stream.wait_event(after.event)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return _EventTicket(event, [dst for dst, _ in pairs], self.device)
