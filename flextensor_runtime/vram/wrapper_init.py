"""Shared construction steps of the VRAM wrappers.

Owns: validating the wrappers' extra keyword options and finding where a module's weights are
when it is wrapped (a real placement, or the disk tier for meta weights with a DiskMap), and
that the checkpoint holds what must be read from it (meta weights, meta inner tensor fields).
Must not know: what the wrappers compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flextensor_runtime.errors import ConfigError, DiskMapError, VramManagementError
from flextensor_runtime.vram.field_moves import carried_fields
from flextensor_runtime.vram.fp8 import FP8_BACKENDS
from flextensor_runtime.vram.placement import DISK, Placement, StagePlacements

__all__ = ["WRAPPER_OPTIONS", "check_checkpoint", "check_options", "initial_placement"]

WRAPPER_OPTIONS = ("memory_reader", "fp8_backend")


def check_options(kwargs: Mapping[str, Any]) -> None:
    unknown = sorted(set(kwargs) - set(WRAPPER_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown VRAM wrapper option(s) {unknown}: the options are {list(WRAPPER_OPTIONS)}"
        )
    backend = kwargs.get("fp8_backend", "auto")
    if backend not in FP8_BACKENDS:
        raise ConfigError(f"invalid fp8_backend {backend!r}: use one of {FP8_BACKENDS}")


def initial_placement(
    params: Mapping[str, torch.Tensor], disk_map: Any, name: str, stages: StagePlacements
) -> Placement | None:
    """Where the managed parameters are now; None when there are none."""
    if disk_map is not None and not callable(getattr(disk_map, "load", None)):
        raise ConfigError(
            f"module {name!r}: disk_map={disk_map!r} is invalid; pass a DiskMap(path, device)"
        )
    tiers = (stages.offload, stages.onload, stages.preparing)
    if params and disk_map is None and any(p.on_disk for p in tiers):
        raise ConfigError(
            f"module {name!r} has a 'disk' placement but no disk_map, so its weights could never "
            "be read back: pass disk_map=DiskMap(checkpoint, device)"
        )
    if not params:
        return None
    _check_meta_fields(params, disk_map, name)
    first = next(iter(params.values()))
    if any(p.device != first.device for p in params.values()):
        devices = sorted({str(p.device) for p in params.values()})
        raise VramManagementError(
            f"module {name!r} has parameters on several devices {devices}: move it to one first"
        )
    if first.device.type == "meta" and disk_map is None:
        raise VramManagementError(
            f"module {name!r} has meta parameters and no disk_map: pass disk_map= so its "
            "weights can be loaded from the checkpoint"
        )
    if first.device.type == "meta" or any(p.on_disk for p in tiers):
        check_checkpoint(params, disk_map, name)  # before any weight is dropped to meta
    if first.device.type == "meta":
        return Placement(None, DISK)
    return Placement(first.dtype, str(first.device))


def check_checkpoint(params: Mapping[str, torch.Tensor], disk_map: Any, name: str) -> None:
    """Every managed tensor of module `name` is in `disk_map`, with its shape and kind."""
    if not hasattr(disk_map, "__contains__"):  # a duck-typed map with load() only
        return
    for local, param in params.items():
        key = f"{name}.{local}" if name else local
        if key not in disk_map:
            raise DiskMapError(
                f"module {name!r} keeps {local!r} on the disk tier but the checkpoint has no "
                f"tensor {key!r}: pass the checkpoint of this model or a state_dict_converter"
            )
        layout = getattr(disk_map, "stored_layout", None)
        if layout is None:  # a duck-typed map: names only
            continue
        shape, floating = layout(key)
        if shape != tuple(param.shape) or floating != param.is_floating_point():
            kind = "floating" if floating else "integer"
            raise DiskMapError(
                f"checkpoint tensor {key!r} is {kind} {list(shape)} but module {name!r} needs "
                f"{param.dtype} {list(param.shape)}: pass the checkpoint of this model"
            )


def _check_meta_fields(params: Mapping[str, torch.Tensor], disk_map: Any, name: str) -> None:
    """An inner tensor field on the meta device (a model built with buffers on meta) has no
    values: it is read from `disk_map` with its parameter, so the map must hold it."""
    for local, param in params.items():
        for attr, inner in carried_fields(param):
            if inner.device.type != "meta":
                continue
            key = f"{name}.{local}.{attr}" if name else f"{local}.{attr}"
            if disk_map is None:
                raise VramManagementError(
                    f"module {name!r} has inner tensor field {key!r} on the meta device and no "
                    "disk_map: pass disk_map= so it can be read from the checkpoint"
                )
            if hasattr(disk_map, "__contains__") and key not in disk_map:
                raise DiskMapError(
                    f"module {name!r} has inner tensor field {key!r} on the meta device but the "
                    "checkpoint has no such tensor: pass a checkpoint that holds it, or build "
                    "the model with its inner fields on the host"
                )
