"""Checking a device a user names for the toolkit: that it parses and exists on this machine.

Owns: checking that a parsed `torch.device` is one this machine can allocate on, with a
one-line `BackendUnavailableError` for a missing backend or a device index past the last device.
Callers parse the name themselves (their messages list the names they accept); `meta` is
accepted here, and callers that need real storage reject it.
Must not know: placements, wrappers, checkpoints.
"""

from __future__ import annotations

import torch

from flextensor_runtime.errors import BackendUnavailableError

__all__ = ["usable_device"]


def _check_cuda(device: torch.device, what: str) -> torch.device:
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"device {str(device)!r} needs CUDA, which this machine lacks ({what}): use 'cpu' "
            "placements here"
        )
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise BackendUnavailableError(
            f"device {str(device)!r} does not exist ({what}): this machine has {count} CUDA "
            "device(s)"
        )
    return device


def usable_device(resolved: torch.device, what: str) -> torch.device:
    """`resolved`, after checking this machine has it; `what` names the option in errors."""
    if resolved.type in ("cpu", "meta"):
        return resolved
    if resolved.type == "cuda":
        return _check_cuda(resolved, what)
    try:  # another backend (mps, xpu, ...): a zero-byte allocation says whether it works
        torch.empty(0, device=resolved)
    except Exception as exc:  # torch raises AssertionError, RuntimeError, ... per backend
        raise BackendUnavailableError(
            f"device {str(resolved)!r} is not available on this machine ({what}, "
            f"{type(exc).__name__}): use 'cpu' or 'cuda'"
        ) from exc
    return resolved
