"""Deploying a `VramSection` next to an offload plan: which modules it wraps, and undoing it.

Owns: `section_targets` (the modules a section would wrap, with the same walk as
`enable_vram_management`; a module that would manage a tensor the caller names in `skip`, e.g.
one the plan streams, is left unwrapped, whole) and `install_undoable` (install, and on failure
or `remove()` put back every module, parameter and buffer object).
Must not know: the profile wire format, how offload plans are installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.autotorch import AutoTorchModule
from flextensor_runtime.vram.module import AutoWrappedNonRecurseModule
from flextensor_runtime.vram.section_install import first_wrapper, install, module_map_classes
from flextensor_runtime.vram.tensor_slots import managed_parameters
from flextensor_runtime.vram.vram_section import VramSection

__all__ = [
    "SectionTargets",
    "VramInstallation",
    "check_disk_tensors",
    "install_undoable",
    "section_targets",
    "streamed_tensor_names",
]


def streamed_tensor_names(entries: Iterable[Any]) -> frozenset[str]:
    """Names (tie aliases too) of plan entries (`name`, `tie`, `placement`, as a profile's
    `all_tensors()` gives) whose data is not resident: what a section must not wrap."""
    by_name = {e.name: e for e in entries}
    return frozenset(
        name for name, e in by_name.items()
        if by_name.get(e.tie or name, e).placement != "resident"
    )  # fmt: skip


@dataclass(frozen=True)
class SectionTargets:
    """The modules a section wraps and those it leaves alone, each with the checkpoint keys of
    the parameters its wrapper would manage, in wrapping order."""

    wrapped: dict[str, frozenset[str]]
    skipped: dict[str, frozenset[str]]
    skipped_places: tuple[tuple[nn.Module, str], ...]  # (parent, child key) of skipped modules


def section_targets(
    model: nn.Module, section: VramSection, skip: Iterable[str] = ()
) -> SectionTargets:
    """Which modules `install` wraps (the same walk as `enable_vram_management`): a matching
    module that would manage a tensor named in `skip` is left unwrapped, whole. Changes nothing."""
    module_map, skip = module_map_classes(model, section), frozenset(skip)
    if first_wrapper(model, module_map) is not None:
        raise ConfigError(
            f"vram section: module_map matches the root {type(model).__name__}: a deployed "
            "model keeps its identity, so map only submodule classes"
        )
    wrapped: dict[str, frozenset[str]] = {}
    skipped: dict[str, frozenset[str]] = {}
    places: list[tuple[nn.Module, str]] = []
    seen: dict[int, bool] = {}

    def walk(parent: nn.Module, prefix: str) -> None:
        for key, child in parent._modules.items():
            if child is None or isinstance(child, AutoTorchModule):
                continue
            name = f"{prefix}.{key}" if prefix else key
            if id(child) in seen:  # shared module: wrapped (or skipped) once
                if not seen[id(child)]:
                    places.append((parent, key))
                continue
            wrapper = first_wrapper(child, module_map)
            if wrapper is None:
                walk(child, name)
                continue
            recurse = not issubclass(wrapper, AutoWrappedNonRecurseModule)
            keys = frozenset(f"{name}.{n}" for n in managed_parameters(child, recurse))
            seen[id(child)] = not (keys & skip)
            if keys & skip:
                skipped[name] = keys
                places.append((parent, key))
                continue
            wrapped[name] = keys
            if not recurse:
                walk(child, name)

    walk(model, "")
    return SectionTargets(wrapped, skipped, tuple(places))


@dataclass
class VramInstallation:
    """A section installed by a deployment: what was wrapped, and `remove()` to undo it."""

    model: nn.Module
    targets: SectionTargets
    disk_modules: tuple[str, ...]
    _saved: list[tuple[nn.Module, dict, dict, dict, dict]]
    _had_marker: bool

    @property
    def wrapped(self) -> tuple[str, ...]:
        return tuple(self.targets.wrapped)

    @property
    def skipped(self) -> tuple[str, ...]:
        return tuple(self.targets.skipped)

    def summary(self) -> str:
        return (
            f"vram: {count_of(len(self.wrapped), 'module')} wrapped ({len(self.disk_modules)} on disk), "
            f"{len(self.skipped)} left to streaming"
        )

    def remove(self) -> None:
        """Put back every module, parameter and buffer object exactly as before the install."""
        for module, modules, params, buffers, hooks in self._saved:
            for live, saved in ((module._modules, modules), (module._parameters, params),
                                (module._buffers, buffers), (module._forward_pre_hooks, hooks)):  # fmt: skip
                live.clear()
                live.update(saved)
        if not self._had_marker:
            self.model.__dict__.pop("vram_management_enabled", None)
        self._saved = []


def check_disk_tensors(section: VramSection, targets: SectionTargets) -> None:
    """Every disk tensor must belong to a module the section wraps (not one left to streaming)."""
    stray = sorted(set(section.disk_tensors) - set().union(*targets.wrapped.values()))
    if stray:
        raise ConfigError(
            f"vram section: disk tensor {stray[0]!r} belongs to no module the section wraps "
            "(unmatched, or streamed by the plan): drop it from disk_tensors"
        )


def install_undoable(
    model: nn.Module, section: VramSection, disk_map: Any = None, skip: Iterable[str] = ()
) -> VramInstallation:
    """Install the section, leaving modules that manage a tensor in `skip` unwrapped; any failure
    restores the model, and `remove()` of the result does the same later."""
    targets = section_targets(model, section, skip)
    check_disk_tensors(section, targets)
    # forward pre-hooks: the install turns off fused fast paths over wrappers with one
    saved = [(m, dict(m._modules), dict(m._parameters), dict(m._buffers), dict(m._forward_pre_hooks))
             for m in model.modules()]  # fmt: skip
    result = VramInstallation(
        model, targets, (), saved, "vram_management_enabled" in model.__dict__
    )
    try:
        install(model, section, disk_map, targets)
    except BaseException:
        result.remove()
        raise
    disk = set(section.disk_tensors)
    result.disk_modules = tuple(n for n, keys in targets.wrapped.items() if keys and keys <= disk)
    return result
