"""`layer_norm_scale_shift`: affine-free LayerNorm fused with AdaLN scale and shift.

Owns: the semantics (PyTorch reference), argument checks and backend dispatch of the op.
Convention (diffusers DiT, `AdaLayerNormZero`): `LayerNorm(x, elementwise_affine=False, eps)`
then `normed * (1 + scale) + shift`; conditioning shapes follow `broadcast.py`.
Must not know: Triton (the kernel module is imported only when the Triton backend runs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels.backend import resolve_backend
from flextensor_runtime.kernels.broadcast import align_conditioning

__all__ = ["layer_norm_scale_shift", "layer_norm_scale_shift_torch"]

_OP = "layer_norm_scale_shift"


def layer_norm_scale_shift_torch(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    upcast: bool = False,
) -> torch.Tensor:
    """PyTorch reference; `scale`/`shift` must already be aligned (see `align_conditioning`).

    upcast=False computes in x's dtype; upcast=True computes in float32. Returns x's dtype.
    """
    compute_dtype = torch.float32 if upcast else x.dtype
    xc = x.to(compute_dtype)
    normed = F.layer_norm(xc, (x.shape[-1],), eps=eps)
    out = normed * (1 + scale.to(compute_dtype)) + shift.to(compute_dtype)
    return out.to(x.dtype)


def _check_args(x: torch.Tensor, eps: float, upcast: bool) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ConfigError(
            f"{_OP}: x must be a floating tensor [..., D], got {got}; pass activations"
        )
    number = not isinstance(eps, bool) and isinstance(eps, (int, float))
    if not number or not 0 < eps < float("inf"):  # inf would normalise every row to 0
        raise ConfigError(f"{_OP}: eps must be a positive finite float, got {eps!r}; use e.g. 1e-6")
    if not isinstance(upcast, bool):
        raise ConfigError(f"{_OP}: upcast must be True or False, got {upcast!r}")


def layer_norm_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-06,
    upcast: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Fuse affine-free LayerNorm with AdaLN scale and shift: `LN(x) * (1 + scale) + shift`.

    x: [..., D] (typically [B, T, D]). scale, shift: [B, D] (per sample, as in DiT), [B, 1, D],
    [D], or anything that broadcasts to x. The result has x's shape and dtype.
    upcast: compute in float32 (the Triton kernel always accumulates in float32).
    backend: None picks Triton for CUDA tensors when it is installed (and no grad is needed),
    else the reference; "torch" or "triton" forces one.
    """
    _check_args(x, eps, upcast)
    scale = align_conditioning(_OP, "scale", scale, x.shape)
    shift = align_conditioning(_OP, "shift", shift, x.shape)
    chosen = resolve_backend(_OP, backend, x, scale, shift)
    if chosen == "torch":
        return layer_norm_scale_shift_torch(x, scale, shift, eps=float(eps), upcast=upcast)
    from flextensor_runtime.kernels import triton_rows

    return triton_rows.layer_norm_scale_shift_triton(x, scale, shift, eps=float(eps))
