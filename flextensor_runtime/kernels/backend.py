"""Backend choice for the fused kernels: the PyTorch reference or Triton.

Owns: whether Triton can run for a set of tensors (installed, CUDA tensors or the Triton CPU
interpreter), the `backend` / `allow_triton` argument rules, and the errors for a forced but
unusable Triton backend. Triton is never imported here: only its presence is checked.
Must not know: what the kernels compute.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

from flextensor_runtime.errors import BackendUnavailableError, ConfigError

__all__ = [
    "TRITON_DTYPES",
    "Backend",
    "check_one_device",
    "resolve_allow_triton",
    "resolve_backend",
    "triton_installed",
]

Backend = Literal["torch", "triton"]
_BACKENDS = ("torch", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def triton_installed() -> bool:
    """True when the `triton` package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _one_device_type(tensors: tuple[torch.Tensor, ...]) -> str | None:
    devices = {t.device for t in tensors}
    return next(iter(devices)).type if len(devices) == 1 else None


def _devices_usable(tensors: tuple[torch.Tensor, ...]) -> bool:
    kind = _one_device_type(tensors)
    return kind == "cuda" or (kind == "cpu" and _interpreter_on())


def _unsupported_dtypes(tensors: tuple[torch.Tensor, ...]) -> list[str]:
    """Floating dtypes the Triton kernels do not handle (they compute in float32)."""
    floats = {t.dtype for t in tensors if t.is_floating_point()}
    return sorted(str(d) for d in floats - set(TRITON_DTYPES))


def _needs_grad(tensors: tuple[torch.Tensor, ...]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _check_forced(op: str, tensors: tuple[torch.Tensor, ...], fallback: str) -> None:
    """Raise BackendUnavailableError unless forced Triton can run; `fallback` is the
    argument that selects the reference instead (it differs between kernels)."""
    if not triton_installed():
        raise BackendUnavailableError(
            f"{op}: backend 'triton' requested but triton is not installed; "
            f"install it with `pip install 'flextensor-compiler[kernels]'` or use {fallback}"
        )
    if not _devices_usable(tensors):
        devices = sorted({str(t.device) for t in tensors})
        raise BackendUnavailableError(
            f"{op}: Triton kernels need all tensors on one CUDA device, got {devices}; move them "
            "to CUDA, set TRITON_INTERPRET=1 before importing triton to run on CPU, "
            f"or use {fallback}"
        )
    unsupported = _unsupported_dtypes(tensors)
    if unsupported:
        raise BackendUnavailableError(
            f"{op}: the Triton kernels support float32, bfloat16 and float16, got {unsupported}; "
            f"cast the inputs or use {fallback}"
        )
    if _needs_grad(tensors):
        raise BackendUnavailableError(
            f"{op}: the Triton kernel is forward-only but an input requires grad; "
            f"call it under torch.no_grad() or use {fallback}"
        )


def check_one_device(op: str, *tensors: torch.Tensor) -> None:
    """Raise ConfigError unless every tensor is on the same device."""
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise ConfigError(
            f"{op}: inputs are on different devices {devices}; move them to one device "
            "with .to(device)"
        )


def resolve_backend(
    op: str, backend: str | None, *tensors: torch.Tensor, fallback: str = "backend='torch'"
) -> Backend:
    """Pick the backend for one call.

    None: Triton when installed, every tensor is on one CUDA device, every floating dtype is in
    TRITON_DTYPES and no gradient is needed, else torch.
    "torch" / "triton": forced; a forced Triton that cannot run raises BackendUnavailableError.
    Tensors on different devices are a ConfigError whatever the backend. `fallback` is how the
    errors tell the caller to choose the reference instead (the caller's own argument).
    """
    check_one_device(op, *tensors)
    if backend is None:
        usable = (
            _one_device_type(tensors) == "cuda"
            and not _unsupported_dtypes(tensors)
            and not _needs_grad(tensors)
            and triton_installed()
        )
        return "triton" if usable else "torch"
    if backend not in _BACKENDS:
        raise ConfigError(f"{op}: unknown backend {backend!r}; use None, 'torch' or 'triton'")
    if backend == "triton":
        _check_forced(op, tensors, fallback)
    return "triton" if backend == "triton" else "torch"


def resolve_allow_triton(op: str, allow_triton: bool | None, *tensors: torch.Tensor) -> Backend:
    """`allow_triton` form of `resolve_backend`: None = auto, True = force, False = reference."""
    if allow_triton is None:
        return resolve_backend(op, None, *tensors)
    if not isinstance(allow_triton, bool):
        raise ConfigError(f"{op}: allow_triton must be None, True or False, got {allow_triton!r}")
    forced: Backend = "triton" if allow_triton else "torch"
    return resolve_backend(op, forced, *tensors, fallback="allow_triton=False")
