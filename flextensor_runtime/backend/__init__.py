"""Device backends for the runtime: CUDA (copy stream, events, pinned memory) and CPU (the same
semantics emulated with real copies into separate buffers), chosen by `select_backend`.

Must not know: profiles, traps, schedules, models.
"""

from __future__ import annotations

import torch

from flextensor_runtime.backend.base import DeviceBackend
from flextensor_runtime.backend.cpu import CpuBackend, CpuEvent
from flextensor_runtime.backend.cuda import CudaBackend
from flextensor_runtime.errors import ConfigError

__all__ = ["CpuBackend", "CpuEvent", "CudaBackend", "DeviceBackend", "select_backend"]


def select_backend(device: torch.device | str | None = None, pinned: bool = True) -> DeviceBackend:
    """The backend for `device` (default: the current CUDA device if there is one, else CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"device {device!r} is not a torch device; pass 'cuda', 'cuda:N' or 'cpu'"
        ) from None
    if dev.type == "cuda":
        return CudaBackend(dev, pinned=pinned)
    if dev.type == "cpu":
        return CpuBackend()
    raise ConfigError(
        f"device {str(dev)!r} is not supported by the offload runtime; pass 'cuda', 'cuda:N' or 'cpu'"
    )
