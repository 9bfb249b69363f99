"""Where a stage of a wrapped module keeps its weights: a (dtype, device) pair, or the disk tier.

Owns: the `Placement` and `StagePlacements` value types, resolving omitted stages to the
computation placement, and the injectable free-memory reading behind `vram_limit`.
Must not know: modules, wrappers or checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union

import torch

from flextensor_runtime.device_names import usable_device
from flextensor_runtime.errors import ConfigError

__all__ = [
    "DISK",
    "DeviceLike",
    "MemoryReader",
    "Placement",
    "StagePlacements",
    "TorchMemoryReader",
    "resolve_stages",
]

DISK = "disk"
DeviceLike = Union[str, torch.device]
GIB = 1024**3


@dataclass(frozen=True)
class Placement:
    """A dtype and a device; `device == "disk"` means the tensors are DiskMap-backed (meta)."""

    dtype: torch.dtype | None
    device: str

    @property
    def on_disk(self) -> bool:
        return self.device == DISK

    def satisfies(self, wanted: Placement) -> bool:
        """Same device, and the same dtype unless `wanted` leaves the dtype open (None)."""
        return self.device == wanted.device and wanted.dtype in (None, self.dtype)

    def torch_device(self) -> torch.device:
        assert not self.on_disk, "the disk tier has no torch device"
        return torch.device(self.device)

    @classmethod
    def on(cls, dtype: torch.dtype | None, device: DeviceLike) -> Placement:
        """`dtype` on `device`, named as the stage placements name it (a bare "cuda" as the
        current device, "cuda:N", as tensors report it), so the two compare equal."""
        name = _device_name(device)
        assert name is not None  # DeviceLike is never None
        return cls(dtype, name)


@dataclass(frozen=True)
class StagePlacements:
    """The four lifecycle stages of a wrapped module."""

    offload: Placement
    onload: Placement
    preparing: Placement
    computation: Placement


def _device_name(device: DeviceLike | None) -> str | None:
    if device is None:
        return None
    if device == DISK:
        return DISK
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"invalid device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'disk'"
        ) from exc
    if resolved.type == "meta":  # weights moved to meta lose their values
        raise ConfigError(
            f"device {device!r} is invalid for a placement: meta holds no data; keep weights "
            "off-device with 'disk' and a disk_map, or use 'cpu'"
        )
    usable_device(resolved, "placement")
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())  # as parameters report it
    return str(resolved)


def _dtype(dtype: object, key: str) -> torch.dtype | None:
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    raise ConfigError(
        f"invalid {key} {dtype!r}: pass a floating torch.dtype such as torch.bfloat16, or None"
    )


def resolve_stages(
    offload_dtype: torch.dtype | None = None,
    offload_device: DeviceLike | None = None,
    onload_dtype: torch.dtype | None = None,
    onload_device: DeviceLike | None = None,
    preparing_dtype: torch.dtype | None = None,
    preparing_device: DeviceLike | None = None,
    computation_dtype: torch.dtype | None = None,
    computation_device: DeviceLike | None = None,
) -> StagePlacements:
    """Build the four placements; an omitted dtype or device defaults to the computation one."""
    for key, value in (
        ("offload_dtype", offload_dtype), ("onload_dtype", onload_dtype),
        ("preparing_dtype", preparing_dtype), ("computation_dtype", computation_dtype),
    ):  # fmt: skip
        _dtype(value, key)
    comp_device = _device_name(computation_device) or "cpu"
    if comp_device == DISK:
        raise ConfigError("computation_device='disk' is invalid: compute needs a real device")

    def stage(dtype: torch.dtype | None, device: DeviceLike | None) -> Placement:
        return Placement(dtype or computation_dtype, _device_name(device) or comp_device)

    return StagePlacements(
        offload=stage(offload_dtype, offload_device),
        onload=stage(onload_dtype, onload_device),
        preparing=stage(preparing_dtype, preparing_device),
        computation=Placement(computation_dtype, comp_device),
    )


class MemoryReader(Protocol):
    """Reports accelerator memory this process uses on a device, in bytes (injectable for tests)."""

    def used_bytes(self, device: torch.device) -> int: ...


class TorchMemoryReader:
    """Default reader: bytes reserved by this process's caching allocator on the device.

    Other processes are not counted (their usage is not ours to spend), and CPU has no
    accelerator memory so it always reads 0.
    """

    def used_bytes(self, device: torch.device) -> int:
        if device.type == "cuda" and torch.cuda.is_available():
            return int(torch.cuda.memory_reserved(device))
        return 0


def limit_bytes(vram_limit_gib: float) -> int:
    """`vram_limit` is in GiB (as in the reference API); return it in bytes (inf: no limit,
    read as the largest int64 byte count)."""
    return int(min(vram_limit_gib * GIB, float(2**63 - 1)))
