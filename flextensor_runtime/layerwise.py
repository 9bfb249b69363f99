"""Layer-wise CPU offload: keep a layer stack's weights on the host, stream one layer at a time.

Owns: finding the layer stack (a ModuleList, or an explicitly named Sequential), moving the rest
of the model to the device, installing and removing the hooks, the handle with its report, the
mutation scope for in-place weight edits, and the marks by which other offloaders find it from
any submodule (`layerwise_root`). Without CUDA the public entry returns a disabled
handle; `enable_layerwise_offload_on` runs the same logic on any `CopyBackend` (e.g. the CPU
`ThreadCopyBackend`).
Must not know: how copies are issued (see `vram.copy_backend`, `vram.layer_window`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.layerwise_checks import check_materialized, check_unshared
from flextensor_runtime.module_state import unchanged_on_error
from flextensor_runtime.offloader_marks import (
    find_managed,
    mark_members,
    marked_root,
    unmark_members,
)
from flextensor_runtime.vram.copy_backend import CopyBackend, CudaCopyBackend
from flextensor_runtime.vram.field_moves import carried_fields, with_fields
from flextensor_runtime.vram.layer_window import LayerWindow, WindowCounters
from flextensor_runtime.vram.tensor_slots import managed_parameters, replace_parameters

__all__ = [
    "LayerwiseOffloadHandle",
    "LayerwiseReport",
    "enable_layerwise_cpu_offload",
    "enable_layerwise_offload_on",
    "layerwise_conflict",
    "layerwise_offload_mutation_scope",
    "layerwise_root",
]

_HANDLE_ATTR = "_flextensor_layerwise_handle"
_LAYER_ATTR = "_flextensor_layer_window"
# on each submodule of a model with layer-wise offload: a `MemberMark` pointing at that model
_MEMBER_ATTR = "_flextensor_layerwise_member"


def layerwise_root(module: nn.Module) -> nn.Module | None:
    """The model whose layer-wise offload manages `module`: `module` itself, or the model it was
    a submodule of when the offload was enabled (its layer stack, a layer, a module inside a
    layer, or a part kept on the device); None when no layer-wise offload manages it."""
    if _HANDLE_ATTR in module.__dict__:
        return module
    root = marked_root(module, _MEMBER_ATTR)
    return root if root is not None and _HANDLE_ATTR in root.__dict__ else None


def layerwise_conflict(module: nn.Module, besides: nn.Module | None = None) -> str | None:
    """Where layer-wise offload (other than one enabled on `besides`) manages `module`, one of
    its submodules, or a model it is part of, with the fix, as a clause for another installer's
    one-line error; None when none does."""

    def root_of(m: nn.Module) -> nn.Module | None:
        root = layerwise_root(m)
        return None if root is besides else root

    found = find_managed(module, root_of)
    if found is None:
        return None
    owner = f"{found.target}'s" if found.target else "its"
    return (
        f"{found.where('layer-wise CPU offload')}; call disable() on {owner} "
        "LayerwiseOffloadHandle first"
    )


@dataclass(frozen=True)
class LayerwiseReport:
    """Lifetime and request-local evidence of what the offload really did."""

    enabled: bool
    layer_count: int
    reason: str
    effective: bool  # a forward ran entirely in the two-layer window with async copies
    asynchronous: bool
    reuse_buffers: bool
    lifetime_forwards: int
    forwards: int
    layer_runs: int
    prefetch_hits: int
    async_copies: int
    sync_materializations: int
    pageable_tensors: tuple[str, ...]


class LayerwiseOffloadHandle:
    """Handle returned by `enable_layerwise_cpu_offload`; owns the hooks so `disable` undoes them."""

    def __init__(self, enabled: bool, layer_count: int, reason: str = "") -> None:
        self.enabled = enabled
        self.layer_count = layer_count
        self.reason = reason
        self._window: LayerWindow | None = None
        self._hooks: list[Any] = []
        self._model: nn.Module | None = None
        self._members: list[nn.Module] = []  # submodules marked for `layerwise_root`

    def __repr__(self) -> str:
        return (
            f"LayerwiseOffloadHandle(enabled={self.enabled}, layer_count={self.layer_count}, "
            f"reason={self.reason!r})"
        )

    def reset(self) -> None:
        """Reset request-local counters without discarding a prefetched layer."""
        if self._window is not None:
            self._window.counters = WindowCounters()

    def report(self) -> LayerwiseReport:
        """Return auditable lifetime and request-local execution evidence.

        `enabled` only proves hooks were installed; `effective` is true once a forward used the
        two-layer window for every layer, with asynchronous copies, no emergency synchronous
        materialization and no pageable host tensors (which would make copies synchronous), and
        only while the hooks are installed (after `disable` it is False; the counters remain).
        """
        window = self._window
        if window is None:
            return LayerwiseReport(
                self.enabled, self.layer_count, self.reason, False, False, False, 0, 0, 0, 0, 0,
                0, (),
            )  # fmt: skip
        c = window.counters
        effective = (
            self.enabled and c.forwards > 0 and window.backend.asynchronous
            and c.sync_materializations == 0
            and c.prefetch_hits == c.layer_runs and not window.pageable
        )  # fmt: skip
        return LayerwiseReport(
            self.enabled, self.layer_count, self.reason, effective, window.backend.asynchronous,
            window.reuse_buffers, window.lifetime_forwards, c.forwards, c.layer_runs,
            c.prefetch_hits, c.async_copies, c.sync_materializations, tuple(window.pageable),
        )  # fmt: skip

    def disable(self) -> bool:
        """Remove offload hooks and restore the real parameters (on CPU) onto each layer.

        Move the model to the desired device afterwards. Returns True when hooks were removed;
        a handle that owns no hooks (e.g. reason "already enabled") returns False.
        """
        if self._window is None or not self._hooks:
            return False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._window.close()
        for state in self._window.layers:
            for owner, local, master in state.slots:
                owner._parameters[local] = master
        for layer in self._layers():
            layer.__dict__.pop(_LAYER_ATTR, None)
        if self._model is not None:
            self._model.__dict__.pop(_HANDLE_ATTR, None)
            unmark_members(self._members, _MEMBER_ATTR, self._model)
        self._members.clear()
        self.enabled = False
        return True

    def _layers(self) -> list[nn.Module]:
        window = self._window
        return [] if window is None else [s.slots[0][0] for s in window.layers if s.slots]


def _layer_list(container: nn.Module) -> list[nn.Module]:
    return [m for m in container._modules.values() if m is not None]


def _find_layers(model: nn.Module, layer_container: str | None) -> list[nn.Module] | None:
    """The layer stack; a bad `model` or `layer_container` is a ConfigError (nothing changes)."""
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"layer-wise offload needs a torch.nn.Module, got {type(model).__name__}; pass the model"
        )
    if layer_container is not None:
        if not isinstance(layer_container, str):
            raise ConfigError(
                f"layer_container={layer_container!r} is invalid; pass the dotted path of the "
                "layer list as a str, e.g. 'model.layers'"
            )
        try:
            container = model.get_submodule(layer_container)
        except AttributeError as exc:
            raise ConfigError(
                f"layer_container {layer_container!r} is not a submodule of "
                f"{type(model).__name__}: pass the dotted path of its layer list"
            ) from exc
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            raise ConfigError(
                f"layer_container {layer_container!r} is a {type(container).__name__}: "
                "name a ModuleList or Sequential of layers"
            )
        if not _layer_list(container):
            raise ConfigError(
                f"layer_container {layer_container!r} is an empty {type(container).__name__}: "
                "name the list that holds the layers"
            )
        return _layer_list(container)
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    return _layer_list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


def _moved(
    param: torch.Tensor, device: torch.device, copies: dict[int, torch.Tensor]
) -> nn.Parameter:
    """`param` on `device` as a new parameter, its inner tensor fields moved with it (one copy
    per field in `copies`, so a field two parameters share stays shared)."""
    for _, inner in carried_fields(param):
        if id(inner) not in copies:
            copies[id(inner)] = inner.detach().to(device)
    return with_fields(param.detach().to(device), param, copies, param.requires_grad)


def _move_resident(model: nn.Module, layers: list[nn.Module], device: torch.device) -> None:
    """Everything outside the layer stack, and every buffer, lives on the device; the
    layers' parameters come to the host (ties kept) to become masters. Inner tensor fields
    (an FP8 `weight.scale`) go where their parameter goes."""
    host: dict[int, torch.Tensor] = {}
    cpu = torch.device("cpu")
    for layer in layers:
        away = {n: _moved(p, cpu, host)
                for n, p in managed_parameters(layer).items() if p.device.type != "cpu"}  # fmt: skip
        replace_parameters(layer, away)
    layer_modules = {id(m) for layer in layers for m in layer.modules()}
    moved: dict[int, nn.Parameter] = {}  # one device copy per parameter, so ties stay ties
    fields: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = buf.to(device)
        if id(module) in layer_modules:
            continue
        for key, param in module._parameters.items():
            if param is not None and param.device != device:
                if id(param) not in moved:
                    moved[id(param)] = _moved(param, device, fields)
                module._parameters[key] = moved[id(param)]


def _check_no_other_offloader(model: nn.Module) -> None:
    """An offload profile's traps, or another layer-wise offload's hooks, already stream or hold
    these weights: hooks on top would rebind parameters they manage (the reverse of
    `offload_from_profile`'s check). That holds for a model with one, one holding such a model,
    and a submodule of one. Layer-wise offload on `model` itself is "already enabled", not an
    error."""
    from flextensor_runtime.deploy import profile_conflict  # deploy imports us

    profile = profile_conflict(model)
    if profile is not None:
        raise ConfigError(
            f"this {type(model).__name__} cannot take layer-wise offload: {profile}, or keep the "
            "profile alone"
        )
    other = layerwise_conflict(model, besides=model)
    if other is not None:
        raise ConfigError(
            f"this {type(model).__name__} cannot take layer-wise offload: {other}, or keep that "
            "offload alone"
        )


def enable_layerwise_offload_on(
    model: nn.Module,
    backend: CopyBackend,
    layer_container: str | None = None,
    pin_memory: bool = True,
    reuse_buffers: bool = False,
) -> LayerwiseOffloadHandle:
    """Install layer-wise offload using `backend` for copies (any device; see module doc)."""
    layers = _find_layers(model, layer_container)
    existing = model.__dict__.get(_HANDLE_ATTR)
    if existing is not None:
        return LayerwiseOffloadHandle(True, existing.layer_count, reason="already enabled")
    _check_no_other_offloader(model)
    if layers is None:
        return LayerwiseOffloadHandle(
            False, 0, reason="no ModuleList found: pass layer_container= naming the layer stack"
        )
    check_materialized(model)
    if reuse_buffers:
        check_unshared(layers)
    # masters, resident copies and slots stay normal tensors; a failure puts the model back
    with torch.inference_mode(False), unchanged_on_error(model):
        return _install(model, layers, backend, pin_memory, reuse_buffers)


def _install(
    model: nn.Module,
    layers: list[nn.Module],
    backend: CopyBackend,
    pin_memory: bool,
    reuse_buffers: bool,
) -> LayerwiseOffloadHandle:
    """Move the rest of the model to the device, make the layers' host masters, install the
    hooks and prefetch layer 0."""
    _move_resident(model, layers, backend.device)
    window = LayerWindow(layers, backend, pin_memory, reuse_buffers)
    handle = LayerwiseOffloadHandle(True, len(layers))
    handle._window, handle._model = window, model
    for index, layer in enumerate(layers):
        pre = layer.register_forward_pre_hook(lambda *_, i=index: window.before(i))
        post = layer.register_forward_hook(lambda *_, i=index: window.after(i), always_call=True)
        handle._hooks += [pre, post]
        layer.__dict__[_LAYER_ATTR] = (window, index)
    window.prefetch(0)
    model.__dict__[_HANDLE_ATTR] = handle
    handle._members = mark_members(model, _MEMBER_ATTR)
    return handle


def enable_layerwise_cpu_offload(
    model: nn.Module,
    layer_container: str | None = None,
    device: torch.device | str | None = None,
    pin_memory: bool = True,
    reuse_buffers: bool = False,
) -> LayerwiseOffloadHandle:
    """Attach hooks to a ModuleList or an explicitly named Sequential stack.

    Parameters stay on CPU and one layer at a time moves to CUDA; the next layer is prefetched
    on a side stream while the current one runs. Returns a disabled handle (with a reason) on
    machines without CUDA or for a non-CUDA `device`.
    """
    _find_layers(model, layer_container)  # a bad argument fails on any machine
    _check_no_other_offloader(model)  # so does a model that already has an offload profile
    for flag, value in (("pin_memory", pin_memory), ("reuse_buffers", reuse_buffers)):
        if not isinstance(value, bool):
            raise ConfigError(f"{flag}={value!r} is invalid; pass True or False")
    try:
        target = torch.device(device) if device is not None else torch.device("cuda")
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device={device!r} is not a torch device; pass 'cuda', 'cuda:N' or None"
        ) from exc
    if not torch.cuda.is_available():
        return LayerwiseOffloadHandle(
            False, 0, reason="CUDA is not available: layer-wise CPU offload needs a CUDA device"
        )
    if target.type != "cuda":
        return LayerwiseOffloadHandle(
            False, 0, reason=f"device {target} is not a CUDA device: pass device='cuda'"
        )
    backend = CudaCopyBackend(target)
    return enable_layerwise_offload_on(model, backend, layer_container, pin_memory, reuse_buffers)


@contextmanager
def layerwise_offload_mutation_scope(module: nn.Module) -> Iterator[None]:
    """Temporarily materialize offloaded parameters for in-place mutations.

    Inside the block the layers' parameters are their host masters, so in-place edits change
    the weights; on exit any device copy prefetched before the edit is dropped so the next
    forward copies the edited values (re-prefetched where a copy was in flight). A module
    without layer-wise offload is left alone.
    """
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"layerwise_offload_mutation_scope needs a torch.nn.Module, got "
            f"{type(module).__name__}; pass the model or layer you edit"
        )
    touched = [m.__dict__[_LAYER_ATTR] for m in module.modules() if _LAYER_ATTR in m.__dict__]
    prefetched = [(w, i) for w, i in touched if w.layers[i].ticket is not None]
    for window, index in touched:
        window.invalidate(index)  # waits for in-flight copies before the masters change
    try:
        yield
    finally:
        for window, index in prefetched:
            window.prefetch(index)  # copy the edited masters again
