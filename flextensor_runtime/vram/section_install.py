"""Installing a `VramSection` on a model (the torch side of `vram_section`).

Owns: resolving class names to the model's classes, turning the section's names into torch
dtypes, calling `enable_vram_management`, moving fully listed wrappers to the disk tier, and
keeping unwrapped the modules that `targets` (see `section_deploy`) leaves alone.
Must not know: the profile wire format, offload plans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.autotorch import AutoTorchModule
from flextensor_runtime.vram.enable import enable_vram_management
from flextensor_runtime.vram.linear import AutoWrappedLinear
from flextensor_runtime.vram.module import AutoWrappedModule, AutoWrappedNonRecurseModule
from flextensor_runtime.vram.placement import DISK
from flextensor_runtime.vram.tied_keys import with_tied_keys
from flextensor_runtime.vram.vram_section import VramSection

if TYPE_CHECKING:
    from flextensor_runtime.vram.section_deploy import SectionTargets

__all__ = ["install"]

_WRAPPERS: dict[str, type[AutoTorchModule]] = {
    "AutoWrappedLinear": AutoWrappedLinear,
    "AutoWrappedModule": AutoWrappedModule,
    "AutoWrappedNonRecurseModule": AutoWrappedNonRecurseModule,
}


def _find_class(model: nn.Module, name: str) -> type:
    for module in model.modules():
        for cls in type(module).__mro__:
            if name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
                return cls
    raise ConfigError(
        f"vram section: module class {name!r} matches no module of {type(model).__name__}: "
        "fix the class name or drop the entry"
    )


def _torch_config(section: VramSection) -> dict[str, Any]:
    return {
        key: getattr(torch, value) if key.endswith("_dtype") else value
        for key, value in section.vram_config
    }


class _DiskChooser:
    """Per-module config: the disk tier for modules whose tensors are all listed."""

    def __init__(self, disk_names: set[str], disk_map: Any, config: dict[str, Any]) -> None:
        self.disk_names = disk_names
        self.disk_map = disk_map
        self.disk_config = {**config, "offload_device": DISK, "onload_device": DISK}
        self.covered: set[str] = set()

    def __call__(self, name: str, keys: frozenset[str]) -> dict[str, Any] | None:
        listed = keys & self.disk_names
        if not listed:
            return None
        if listed != keys:
            raise ConfigError(
                f"vram section: module {name!r} has some tensors on disk but not "
                f"{sorted(keys - listed)[0]!r}: list all of its tensors in disk_tensors or none"
            )
        absent = sorted(k for k in keys if k not in self.disk_map)
        if absent:
            raise ConfigError(
                f"vram section: disk tensor {absent[0]!r} is not in the checkpoint: fix "
                "disk_tensors or the checkpoint path"
            )
        self.covered |= keys
        return self.disk_config

    def check_all_covered(self) -> None:
        stray = sorted(self.disk_names - self.covered)
        if stray:
            raise ConfigError(
                f"vram section: disk tensor {stray[0]!r} belongs to no wrapped module: add its "
                "module class to module_map or drop it from disk_tensors"
            )


def module_map_classes(model: nn.Module, section: VramSection) -> dict[type, type[AutoTorchModule]]:
    return {_find_class(model, cls): _WRAPPERS[w] for cls, w in section.module_map}


def first_wrapper(module: nn.Module, module_map: dict[type, Any]) -> Any:
    return next((w for cls, w in module_map.items() if isinstance(module, cls)), None)


def install(
    model: nn.Module, section: VramSection, disk_map: Any = None,
    targets: SectionTargets | None = None,
) -> nn.Module:  # fmt: skip
    """Wrap per the section; with `targets`, its skipped modules stay unwrapped."""
    module_map = module_map_classes(model, section)
    config = _torch_config(section)
    if section.disk_tensors and disk_map is None:
        if section.checkpoint is None:
            raise ConfigError(
                "vram section: disk_tensors are listed but no checkpoint is given: add "
                "'checkpoint' to the section or pass disk_map="
            )
        from flextensor_runtime.diskmap import DiskMap

        disk_map = DiskMap(section.checkpoint, config.get("computation_device", "cpu"))
    # a tie the checkpoint saved once answers to its other names (as the wrappers read them)
    chooser = _DiskChooser(set(section.disk_tensors), with_tied_keys(model, disk_map), config)
    hidden = [(parent, key, parent._modules[key]) for parent, key in
              (targets.skipped_places if targets is not None else ())]  # fmt: skip
    for parent, key, _ in hidden:  # the walk in enable_vram_management skips None children
        parent._modules[key] = None
    try:
        model = enable_vram_management(
            model, module_map, config, vram_limit=section.vram_limit_gib, disk_map=disk_map,
            vram_config_for=chooser if section.disk_tensors else None,
        )  # fmt: skip
    finally:
        for parent, key, child in hidden:
            parent._modules[key] = child
    chooser.check_all_covered()
    return model
