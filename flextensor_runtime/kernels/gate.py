"""`residual_gate_add`: `residual + update * gate` in one pass (the DiT gated residual).

Owns: the semantics (PyTorch reference), argument checks and backend dispatch of the op.
`gate` follows `broadcast.py` ([B, D] is per sample, as `gate_msa.unsqueeze(1)` in DiT blocks);
`update` follows plain PyTorch broadcasting; both must broadcast to `residual`'s shape.
The result has residual's shape and the promoted dtype of the three inputs, as the
unfused expression would.
Must not know: Triton (the kernel module is imported only when the Triton backend runs).
"""

from __future__ import annotations

import torch

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels.backend import resolve_backend
from flextensor_runtime.kernels.broadcast import align_conditioning

__all__ = ["residual_gate_add", "residual_gate_add_torch"]

_OP = "residual_gate_add"


def residual_gate_add_torch(
    residual: torch.Tensor, update: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """PyTorch reference; `gate` must already be aligned (see `align_conditioning`)."""
    return residual + update * gate


def _check_update(residual: torch.Tensor, update: torch.Tensor) -> None:
    for name, t in (("residual", residual), ("update", update)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = type(t).__name__ if not isinstance(t, torch.Tensor) else str(t.dtype)
            raise ConfigError(f"{_OP}: {name} must be a floating tensor, got {got}")
    if residual.dim() == 0:
        raise ConfigError(f"{_OP}: residual must have at least one dim [..., D], got a scalar")
    try:
        full = torch.broadcast_shapes(update.shape, residual.shape)
    except RuntimeError:
        full = None
    if full != residual.shape:
        raise ConfigError(
            f"{_OP}: update of shape {tuple(update.shape)} does not broadcast to residual of "
            f"shape {tuple(residual.shape)}; pass an update with the residual's shape"
        )


def residual_gate_add(
    residual: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """Return `residual + update * gate` with broadcast-aware fusion.

    residual: [..., D] (typically [B, T, D]); update: broadcastable to residual; gate: [B, D]
    (per sample), [B, 1, D], [D], or anything that broadcasts to residual.
    backend: None picks Triton for CUDA tensors when it is installed (and no grad is needed),
    else the reference; "torch" or "triton" forces one.
    """
    _check_update(residual, update)
    gate = align_conditioning(_OP, "gate", gate, residual.shape)
    chosen = resolve_backend(_OP, backend, residual, update, gate)
    if chosen == "torch":
        return residual_gate_add_torch(residual, update, gate)
    from flextensor_runtime.kernels import triton_rows

    return triton_rows.residual_gate_add_triton(residual, update, gate)
