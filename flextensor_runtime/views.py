"""Typed views of packed bytes: how a streamed tensor lives inside a block or a host buffer.

Owns: turning (byte buffer, byte offset, tensor entry) into a tensor view with the entry's dtype,
shape and stride, and the checks that make such a view safe (alignment, dense layout).
Must not know: schedules, traps, backends, files.
"""

from __future__ import annotations

import torch

from flextensor_runtime.errors import InstallError
from flextensor_runtime.profile import DTYPE_ITEMSIZE, TensorEntry

__all__ = ["is_dense", "placeholder", "torch_dtype", "typed_view"]


def torch_dtype(name: str) -> torch.dtype:
    """ "bfloat16" -> torch.bfloat16 (the profile's dtype spelling back to torch)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InstallError(
            f"dtype {name!r} is not available in this torch {torch.__version__}; "
            "upgrade torch or recompile the profile"
        )
    return dtype


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether the layout covers exactly numel elements once (any dimension order)."""
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True


def typed_view(base: torch.Tensor, byte_offset: int, entry: TensorEntry) -> torch.Tensor:
    """The tensor `entry` as a view of the uint8 buffer `base` starting at `byte_offset`."""
    itemsize = DTYPE_ITEMSIZE[entry.dtype]
    if byte_offset % itemsize:
        raise InstallError(
            f"tensor {entry.name!r} starts at byte {byte_offset}, not a multiple of its "
            f"{itemsize}-byte {entry.dtype} elements; recompile the profile with aligned offsets"
        )
    if not is_dense(entry.shape, entry.stride):
        raise InstallError(
            f"tensor {entry.name!r} has a non-dense layout (stride {list(entry.stride)}); "
            "mark it resident (exclude it) and recompile the profile"
        )
    flat = base[byte_offset : byte_offset + entry.bytes].view(torch_dtype(entry.dtype))
    return flat.as_strided(entry.shape, entry.stride)


def placeholder(entry: TensorEntry, device: torch.device) -> torch.Tensor:
    """What a streamed tensor points at outside its trap (per-use modes): right shape and dtype,
    one element of memory, so `shape`/`dtype`/`device` queries still answer correctly."""
    one = torch.zeros(1, dtype=torch_dtype(entry.dtype), device=device)
    return one.expand(entry.shape)
