"""Building models without allocating or initialising their weights.

Owns: the two contexts that redirect newly registered parameters (and optionally buffers) to one
device (a parameter registered twice, or already there, stays one object: ties made in
`__init__` hold), and that skip `torch.nn.init` initialisers; every global hook is restored in
`finally`. Nested contexts: the innermost one decides where parameters (and, with
`include_buffers`, new tensors) go; the enclosing one applies again once it exits.
The contexts patch process-wide state and must not overlap across threads.
Must not know: checkpoints, wrappers, profiles.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flextensor_runtime.device_names import usable_device
from flextensor_runtime.errors import ConfigError

__all__ = ["init_weights_on_device", "skip_model_initialization"]

_INIT_FUNCTIONS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
    "sparse_",
)  # fmt: skip


_SCOPE_ATTR = "_flextensor_init_scope"  # set on our patched register_parameter


@dataclass(frozen=True)
class _Scope:
    """What an open `init_weights_on_device` block tells a block nested inside it."""

    # register_parameter as it was before the outermost of our blocks patched it
    register_parameter: Callable[..., None]
    # the default device before the blocks redirected new tensors (include_buffers=True);
    # None when the block leaves new tensors where they would go anyway
    host_device: torch.device | None


def _enclosing_scope() -> _Scope | None:
    scope = getattr(nn.Module.register_parameter, _SCOPE_ATTR, None)
    return scope if isinstance(scope, _Scope) else None


def _default_device() -> torch.device:
    return torch.empty(0).device  # honours `with torch.device(...)` on every torch >= 2.1


def _tensor_device(
    stack: ExitStack, device: torch.device, include_buffers: bool, enclosing: _Scope | None
) -> torch.device | None:
    """Enter the default-device context this block needs; return the device it replaced
    when it redirects new tensors. An inner block without `include_buffers` inside one with
    it puts the default back, so its parameters are not first created on the outer device."""
    outer_host = None if enclosing is None else enclosing.host_device
    if include_buffers:
        host = _default_device() if outer_host is None else outer_host
        stack.enter_context(device)
        return host
    if outer_host is not None:
        stack.enter_context(outer_host)
    return None


def _on(param: nn.Parameter, device: torch.device) -> bool:
    here = param.device
    return here.type == device.type and (device.index is None or here.index == device.index)


def _moved_parameter(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    if type(param) is nn.Parameter:
        return nn.Parameter(param.detach().to(device), requires_grad=param.requires_grad)
    return type(param)(param.to(device), **vars(param))  # parameter subclasses keep their fields


@contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def init_weights_on_device(
    device: str | torch.device = torch.device("meta"), include_buffers: bool = False
) -> Iterator[None]:
    """Temporarily redirect newly registered module weights to one device.

    Parameters registered inside the block move to `device` as they are registered (on `meta`
    that skips their storage and the initialisers that run on them afterwards). With
    `include_buffers=True` tensors created inside the block are also created on `device`
    directly, so buffers land there and nothing is allocated elsewhere.
    Inside another such block (or `skip_model_initialization`) this block's device and
    `include_buffers` apply until it exits; then the enclosing block's apply again.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"init_weights_on_device got device={device!r}, which is not a torch device; pass "
            "'meta' (the default), 'cpu' or 'cuda'"
        ) from exc
    usable_device(device, "init_weights_on_device")  # fail here, not in the model's __init__
    if not isinstance(include_buffers, bool):
        raise ConfigError(
            f"init_weights_on_device got include_buffers={include_buffers!r}; pass True or False"
        )
    enclosing = _enclosing_scope()
    # an enclosing block's patch is bypassed, not chained: it would move the parameter to its
    # own device first (a copy, or a meta tensor that cannot be copied back)
    register_parameter = nn.Module.register_parameter
    if enclosing is not None:
        register_parameter = enclosing.register_parameter
    # id(original) -> (weak ref to it, its moved parameter): registering one parameter twice
    # (a tie) registers one moved object, without keeping the host originals alive
    moved: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = {}

    def register_on_device(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is None or _on(param, device):  # already moved (`head.weight = embed.weight`)
            return
        seen = moved.get(id(param))
        if seen is None or seen[0]() is not param:
            seen = moved[id(param)] = (weakref.ref(param), _moved_parameter(param, device))
        module._parameters[name] = seen[1]

    with ExitStack() as stack:
        host = _tensor_device(stack, device, include_buffers, enclosing)
        setattr(register_on_device, _SCOPE_ATTR, _Scope(register_parameter, host))
        stack.enter_context(_patched(nn.Module, "register_parameter", register_on_device))
        yield


@contextmanager
def skip_model_initialization(device: str | torch.device = torch.device("meta")) -> Iterator[None]:
    """Return an allocation-skipping context for constructing checkpoint-backed models.

    Parameters go to `device` (see `init_weights_on_device`) and the `torch.nn.init`
    initialisers do nothing, so on a real device the weights are uninitialised: load a
    checkpoint (or use a DiskMap) before running the model.
    """

    def skip(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tensor

    with ExitStack() as stack:
        for name in _INIT_FUNCTIONS:
            stack.enter_context(_patched(nn.init, name, skip))
        stack.enter_context(init_weights_on_device(device, include_buffers=False))
        yield
