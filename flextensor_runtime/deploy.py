"""Deployment: `load_profile`, `offload_from_profile(model, path)` and `handle(model)`.

Owns: the public entry points: load and validate a profile, bind it to the model (fingerprint
mismatch -> `ProfileMismatchError`), check the plan's peak fits the device's free memory now
(`BudgetError`), install (then the profile's `vram` and `caches` sections, on top), and the
`OffloadHandle` (`remove()`, `report()`, the event log); the marks by which other offloaders
find the installed profile from any submodule (`installed_root`).
Must not know: the compiler, typer or rich; how traps, blocks or copies work inside.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from flextensor_runtime import profile as profile_format
from flextensor_runtime.backend import DeviceBackend, select_backend
from flextensor_runtime.bind import Binding, bind_profile
from flextensor_runtime.cache_section import cache_section_from_extensions, install_cache
from flextensor_runtime.errors import BudgetError, ConfigError, ProfileFormatError
from flextensor_runtime.events import EventLog
from flextensor_runtime.install import Deployment, install
from flextensor_runtime.layerwise import layerwise_conflict
from flextensor_runtime.lazy_load import Checkpoint
from flextensor_runtime.manual import current_model
from flextensor_runtime.offloader_marks import (
    find_managed,
    mark_members,
    marked_root,
    unmark_members,
)
from flextensor_runtime.planned_device import warn_if_other_device
from flextensor_runtime.profile import Profile
from flextensor_runtime.report import Report, build_report
from flextensor_runtime.structure_guard import TrueValue, guard_structure
from flextensor_runtime.vram.autotorch import AutoTorchModule
from flextensor_runtime.vram.vram_section import VramSection, vram_section_from_extensions

__all__ = [
    "OffloadHandle",
    "handle",
    "installed_root",
    "load_profile",
    "offload_from_profile",
    "print_report",
    "profile_conflict",
]

_HANDLE_ATTR = "_ft_handle"
# on each submodule of a model with a profile installed: a `MemberMark` pointing at that model
_MEMBER_ATTR = "_ft_profile_member"


def installed_root(module: nn.Module) -> nn.Module | None:
    """The model whose installed offload profile manages `module`: `module` itself, or the model
    it was a submodule of when `offload_from_profile` installed the profile; None when no
    installed profile manages it."""
    if _HANDLE_ATTR in module.__dict__:
        return module
    root = marked_root(module, _MEMBER_ATTR)
    return root if root is not None and _HANDLE_ATTR in root.__dict__ else None


def profile_conflict(module: nn.Module) -> str | None:
    """Where an installed offload profile manages `module`, one of its submodules, or a model
    it is part of, with the fix, as a clause for another installer's one-line error; None when
    none does."""
    found = find_managed(module, installed_root)
    if found is None:
        return None
    on = f" on {found.target}" if found.target else ""
    has = "an offload profile installed by offload_from_profile"
    return f"{found.where(has)}; call handle(model).remove(){on} first"


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate an offload profile (no model needed); errors are one-line `ProfileError`s
    (a path that is no path at all: `ConfigError`)."""
    _check_path("load_profile", path)
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
        # /dev/zero would be read until memory runs out, a named pipe would block for ever
        raise ProfileFormatError(
            f"{path}: is not a regular file (a device or a pipe); pass the .msgpack file "
            "`ftc profile` wrote"
        )
    if _looks_like_json(path):
        raise ProfileFormatError(
            f"{path}: is a JSON text file (a stats file?), not a profile; pass the .msgpack "
            "profile, or make one from stats with `ftc plan STATS -o profile.msgpack`"
        )
    return profile_format.load(path)


def _check_path(who: str, path: object, or_else: str = "") -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            f"{who} needs a profile path{or_else}, got {type(path).__name__}; pass the .msgpack "
            "file `ftc profile` wrote"
        )
    if not os.fspath(path):
        raise ConfigError(
            f"{who} got an empty profile path; pass the .msgpack file `ftc profile` wrote"
        )


def _looks_like_json(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a file whose first non-blank byte is `{` or `[` (a profile is msgpack
    and starts with a map header byte, never with these)."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        head = fh.read(256).lstrip()
    return head[:1] in (b"{", b"[")


@dataclass
class OffloadHandle:
    """The installed profile of one model: `remove()`, `report()`, `events`."""

    deployment: Deployment
    cache: Any = None  # the installed `caches` section (set_step, report), when the profile has one
    vram: Any = None  # the installed `vram` section (wrapped, skipped, disk_modules), if any
    # submodules marked at install (`installed_root` finds the profile from them)
    members: list[nn.Module] = field(default_factory=list, repr=False, compare=False)
    # removes the hook that refuses setting submodules (`structure_guard`)
    unguard: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    @property
    def profile(self) -> Profile:
        return self.deployment.profile

    @property
    def backend(self) -> DeviceBackend:
        return self.deployment.backend

    @property
    def events(self) -> EventLog:
        """The event log: empty (and never written) when installed with `log_events=False`;
        after `remove()` it keeps what was logged."""
        log = self.deployment.log
        if log is None:
            log = self.deployment.log = EventLog(max_events=0)
        return log

    @property
    def installed(self) -> bool:
        return self.deployment.runtime is not None

    def report(self) -> Report:
        """Per trap: calls, copies issued, bytes moved, stalls, wait time; totals and memory."""
        dep = self.deployment
        if dep.runtime is None:
            raise ConfigError("the profile was removed from this model; report() before remove()")
        b = dep.backend
        return build_report(dep.profile, dep.runtime.counters, str(b.device), b.held_bytes,
                            b.peak_held_bytes)  # fmt: skip

    def remove(self) -> None:
        """Restore parameters, forwards and devices exactly as before install (as normal
        tensors, also when called inside `torch.inference_mode()`)."""
        with torch.inference_mode(False):
            self._remove()

    def _remove(self) -> None:
        dep = self.deployment
        if dep.runtime is None:
            return
        self.unguard()
        if self.cache is not None:
            self.cache.remove()
            self.cache = None
        if self.vram is not None:
            self.vram.remove()
            self.vram = None
        dep.backend.synchronize()
        dep.uninstall()
        dep.runtime = None
        dep.hosts.clear()
        dep.model.__dict__.pop(_HANDLE_ATTR, None)
        unmark_members(self.members, _MEMBER_ATTR, dep.model)
        self.members.clear()
        if current_model.get() is dep.model:
            current_model.set(None)


def handle(model: nn.Module) -> OffloadHandle:
    """The `OffloadHandle` of a model that `offload_from_profile` installed a profile on."""
    h = model.__dict__.get(_HANDLE_ATTR) if isinstance(model, nn.Module) else None
    if h is None:
        raise ConfigError(
            f"{type(model).__name__} has no offload profile installed; call "
            "offload_from_profile(model, path) first"
        )
    return h


def _check_budget(profile: Profile, binding: Binding, backend: DeviceBackend) -> None:
    seen: set[int] = set()
    already = 0
    for ref in binding.refs.values():
        if id(ref) in seen:
            continue
        seen.add(id(ref))
        if backend.holds(ref.tensor):
            already += ref.tensor.numel() * ref.tensor.element_size()
    free = backend.free_bytes()
    need = profile.predicted.peak_bytes
    if need > free + already:
        raise BudgetError(
            f"the plan's peak of {need} bytes does not fit {backend.device}: {free} bytes free "
            f"now (+{already} already held by the model); free device memory, or recompile with "
            f"--budget {free + already} (ftc names the smallest budget that fits if that is too "
            "small)"
        )


def _check_vram(model: nn.Module, section: VramSection, profile: Profile) -> frozenset[str]:
    """Validate the section against the model and the plan before anything changes; returns the
    parameters its wrappers will manage (left in place by the install, not moved to the device)."""
    from flextensor_runtime.vram.section_deploy import (
        check_disk_tensors,
        section_targets,
        streamed_tensor_names,
    )

    targets = section_targets(model, section, streamed_tensor_names(profile.all_tensors()))
    check_disk_tensors(section, targets)
    if section.disk_tensors and section.checkpoint and not os.path.exists(section.checkpoint):
        raise ConfigError(
            f"vram section: checkpoint {section.checkpoint!r} does not exist: run from the folder "
            "the profile was compiled in, or recompile with an absolute --checkpoint"
        )
    return frozenset().union(*targets.wrapped.values())


def _install_sections(h: OffloadHandle, model: nn.Module, profile: Profile) -> None:
    """The `vram` section, then the `caches` section (a hit skips the module and its traps)."""
    vram = vram_section_from_extensions(profile.extensions)
    cache = cache_section_from_extensions(profile.extensions)
    if vram is not None:  # the wrappers are imported only for profiles that use them
        from flextensor_runtime.vram.section_deploy import install_undoable, streamed_tensor_names

        h.vram = install_undoable(model, vram, skip=streamed_tensor_names(profile.all_tensors()))
    h.cache = install_cache(model, cache) if cache is not None else None


def _check_no_other_offloader(model: nn.Module) -> None:
    """The profile's traps would run beside another profile, VRAM wrappers or layer-wise offload
    that keep the same weights elsewhere: on the model, on one of its submodules, or on a model
    it is part of (the reverse of `enable_vram_management`'s and layer-wise offload's checks)."""
    conflict = profile_conflict(model) or layerwise_conflict(model)
    if conflict is not None:
        raise ConfigError(f"this {type(model).__name__} cannot take an offload profile: {conflict}")
    wrapped = next((n for n, m in model.named_modules() if isinstance(m, AutoTorchModule)), None)
    if wrapped is not None:
        raise ConfigError(
            f"this {type(model).__name__} has VRAM management wrappers ({wrapped or 'the model'}"
            " is one): offload_from_profile would manage the same weights; build the model "
            "without them, or put them in the profile's vram section"
        )


def _checked_arguments(model: Any, path: Any) -> Profile:
    """The validated profile, after checking that `model` can take one."""
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"offload_from_profile needs a torch.nn.Module, got {type(model).__name__}; pass the "
            "model the profile was compiled for"
        )
    if _HANDLE_ATTR in model.__dict__:
        raise ConfigError(
            f"{type(model).__name__} already has an offload profile installed; call "
            "handle(model).remove() first"
        )
    _check_no_other_offloader(model)
    if not isinstance(path, Profile):
        _check_path("offload_from_profile", path, " or a Profile")
    profile = path if isinstance(path, Profile) else load_profile(path)
    if isinstance(path, Profile):
        profile_format.check_profile(profile)
    return profile


def _check_options(strict: object, log_events: object, backend: object) -> None:
    for name, value in (("strict", strict), ("log_events", log_events)):
        if not isinstance(value, bool):
            raise ConfigError(
                f"offload_from_profile {name}={value!r} is invalid; pass True or False"
            )
    if backend is not None and not isinstance(backend, DeviceBackend):
        raise ConfigError(
            f"offload_from_profile backend={backend!r} is invalid; pass a DeviceBackend such as "
            "CpuBackend() or CudaBackend(device), or use device= instead"
        )


def offload_from_profile(
    model: nn.Module,
    path: str | os.PathLike[str] | Profile,
    *,
    device: torch.device | str | None = None,
    strict: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    backend: DeviceBackend | None = None,
    log_events: bool = True,
) -> nn.Module:
    """Install the offload profile at `path` on `model` and return the same model.

    No discovery, profiling or warm-up: the first forward runs the planned schedule. `strict`
    rejects model tensors the profile does not list (False leaves them where they are).
    `checkpoint` (a .safetensors file or sharded index) fills weights, e.g. of a model built on
    the meta device, straight into their final place. `backend` overrides `device`. On any error
    the model is left unchanged.
    """
    _check_options(strict, log_events, backend)
    profile = _checked_arguments(model, path)
    binding = bind_profile(profile, model, strict=strict)
    be = backend if backend is not None else select_backend(device, profile.config.pinned_memory)
    _check_budget(profile, binding, be)
    ckpt = Checkpoint(checkpoint) if checkpoint is not None else None
    cache_section_from_extensions(profile.extensions)  # sections are checked before any change
    vram = vram_section_from_extensions(profile.extensions)
    wrapped = _check_vram(model, vram, profile) if vram is not None else frozenset()
    dep = Deployment(model, profile, binding, be, EventLog() if log_events else None,
                     leave_in_place=wrapped)  # fmt: skip
    install(dep, ckpt)
    h = OffloadHandle(dep)
    try:
        _install_sections(h, model, profile)
    except BaseException:
        if h.vram is not None:
            h.vram.remove()
        dep.uninstall()
        dep.runtime = None
        dep.hosts.clear()
        raise
    model.__dict__[_HANDLE_ATTR] = h
    h.unguard = guard_structure(model, _placements(dep), _true_values(dep), partial(_refill, dep))
    _mark_members(h, model)
    current_model.set(model)
    warn_if_other_device(profile.device, be)
    return model


def _placements(dep: Deployment) -> Callable[[], dict[int, str]]:
    """`id()` of each profile parameter and buffer as it is now -> its (canonical's) placement."""
    placement = {e.name: e.placement for e in dep.profile.all_tensors()}
    names = {e.name: e.tie or e.name for e in dep.profile.all_tensors() if e.kind != "inner"}
    refs = dep.binding.refs
    return lambda: {id(refs[n].tensor): placement[canon] for n, canon in names.items()}


def _true_values(dep: Deployment) -> Callable[[], list[TrueValue]]:
    """Each profile tensor (one name per distinct tensor) as it is now with its true value: a
    streamed one's host copy, a resident one's own data."""
    hosts = {id(ref): host for ref, host in dep.host_views}
    named = {id(ref): (name, ref) for name, ref in reversed(dep.binding.refs.items())}
    return lambda: [(name, ref.tensor, hosts.get(id(ref), ref.tensor.data))
                    for name, ref in named.values()]  # fmt: skip


def _refill(dep: Deployment) -> None:
    """Copy every transfer again from the host copies (`apply` edited them in place)."""
    if dep.runtime is not None:
        dep.runtime.refill()


def _mark_members(h: OffloadHandle, model: nn.Module) -> None:
    """Mark every submodule as managed by `model`'s profile, so another offloader called on a
    submodule (whose parameters the traps stream or keep resident) can find the profile."""
    h.members.extend(mark_members(model, _MEMBER_ATTR))


def print_report(model: nn.Module) -> str:
    """Print (and return) the report table of an installed model (used by `make demo`)."""
    text = handle(model).report().table()
    print(text)
    return text
