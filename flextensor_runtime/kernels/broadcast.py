"""Broadcast rules for AdaLN conditioning tensors (scale, shift, gate) against activations.

Owns: how a conditioning tensor lines up with activations `x` of shape [B, T, D] (or [..., D]),
and the canonical 3-D view [B, T, D] the Triton kernels index with strides.
Rule (diffusers DiT convention): a 2-D conditioning tensor [B, D] against an activation with 3 or
more dims is a per-sample vector, i.e. [B, 1, ..., 1, D] (what `scale[:, None]` does in DiT
blocks). Every other shape follows PyTorch broadcasting and must not enlarge `x`:
[D], [1, D], [B, 1, D], [B, T, D], [1, T, D], [B, T, 1], scalars.
Must not know: what is computed with the tensors or on which backend.
"""

from __future__ import annotations

import torch

from flextensor_runtime.errors import ConfigError

__all__ = ["align_conditioning", "as_rows3d"]


def align_conditioning(op: str, name: str, cond: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Return `cond` viewed so that PyTorch broadcasting against `shape` follows the rule above.

    The result is a view (no copy) with the same number of dims as `shape`.
    """
    if not isinstance(cond, torch.Tensor):
        raise ConfigError(f"{op}: {name} must be a torch.Tensor, got {type(cond).__name__}")
    if cond.is_complex():  # casting to the real compute dtype would drop the imaginary part
        raise ConfigError(f"{op}: {name} must be real, got {cond.dtype}; pass a real tensor")
    aligned = cond
    if cond.dim() == 2 and len(shape) >= 3:
        aligned = cond.reshape(cond.shape[0], *([1] * (len(shape) - 2)), cond.shape[1])
    try:
        full = torch.broadcast_shapes(aligned.shape, shape)
    except RuntimeError:
        full = None
    if full != shape:
        raise ConfigError(
            f"{op}: {name} of shape {tuple(cond.shape)} does not broadcast to "
            f"{tuple(shape)}; pass [B, D], [B, 1, D], [D] or the full shape"
        )
    return aligned.reshape((1,) * (len(shape) - aligned.dim()) + tuple(aligned.shape))


def as_rows3d(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Expand `t` to `shape` and view it as [B, T, D] (strides may be 0 or non-contiguous).

    1-D -> [1, 1, D]; 2-D [N, D] -> [1, N, D]; more dims merge the middle ones into T.
    Copies only when the middle dims of a non-contiguous tensor cannot be merged.
    """
    full = t.expand(shape)
    if full.dim() == 1:
        return full.reshape(1, 1, shape[0])
    if full.dim() == 2:
        return full.unsqueeze(0)
    if full.dim() == 3:
        return full
    return full.reshape(shape[0], -1, shape[-1])
