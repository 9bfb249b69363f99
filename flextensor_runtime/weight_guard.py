"""Keeping a deployed model's weights honest: their true values out, no silent changes in.

Owns: per-module hooks on a model with a profile installed. `state_dict()` reports each
streamed weight's host copy (its true value) instead of the memory block it is a view into
(which holds whichever transfer ran last). `load_state_dict` and dtype/device conversions
(`.half()`, `.double()`, `.to(...)`: `nn.Module._apply`) raise one `ConfigError` line before
anything changes: blocks are refilled from the host copies taken at install, so a new value or
dtype would be overwritten at the next copy and undone by `remove()`. A conversion that changes
no profile tensor (`.to()` the device and dtype they already have) still runs. Pickling
(`torch.save(model)`) and `copy.copy` / `copy.deepcopy` of any hooked module raise one
`ConfigError` line too: a copy would share or lose the runtime's blocks, copy stream and hooks.
Must not know: schedules, backends, profile files.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError

__all__ = ["guard_weights"]

_PATCHED = frozenset(("_apply", "__reduce_ex__", "__deepcopy__"))  # instance attributes set here
_FIX = (
    "call handle(model).remove(), change the weights, then offload_from_profile(model, path) again"
)


def _where(module: nn.Module, root: nn.Module) -> str:
    if module is root:
        return type(root).__name__
    name = next((n for n, m in root.named_modules() if m is module), "")
    return f"{type(root).__name__}.{name}" if name else type(module).__name__


def _changes_a_bound_tensor(module: nn.Module, fn: Callable[[Any], Any], bound: set[int]) -> bool:
    tensors = itertools.chain(module.parameters(), module.buffers())
    return any(id(t) in bound and fn(t) is not t for t in tensors)


class _RefuseCopy:
    """Set as a module's `__reduce_ex__` and `__deepcopy__` (instance attributes, which pickle
    and `copy` look up first): copying a deployed module fails with one line."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, *args: Any) -> Any:
        raise ConfigError(
            f"copying or pickling {self.where}, which has an offload profile installed, is not "
            "supported (its weights are views into memory blocks the runtime refills); save "
            "model.state_dict() (it has the true weights), or call handle(model).remove() "
            "first and deploy the copy with offload_from_profile"
        )


def _true_values(owned: dict[str, torch.Tensor]) -> Callable[..., None]:
    def hook(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        for local, host in owned.items():
            if prefix + local in state:
                state[prefix + local] = host.detach()

    return hook


def _true_value_hooks(model: nn.Module, host_copies: dict[str, torch.Tensor]) -> list[Any]:
    """`state_dict` post-hooks on each module owning a streamed tensor (see `_true_values`)."""
    owned: dict[str, dict[str, torch.Tensor]] = {}
    for name, host in host_copies.items():
        path, _, local = name.rpartition(".")
        owned.setdefault(path, {})[local] = host
    return [
        module.register_state_dict_post_hook(_true_values(owned[path]))
        for path, module in model.named_modules(remove_duplicate=False)
        if path in owned
    ]


def guard_weights(
    model: nn.Module,
    tensors: Callable[[], Iterable[torch.Tensor]],
    host_copies: dict[str, torch.Tensor],
) -> Callable[[], None]:
    """Hook every module of `model`; `tensors()` gives the profile's tensors as they are now,
    `host_copies` the true value of each streamed tensor by name (tied names included).
    Returns the undo (removes every hook)."""

    def refuse_load(module: nn.Module, *args: Any) -> None:
        raise ConfigError(
            f"load_state_dict on {_where(module, model)}, which has an offload profile installed, "
            f"would be lost (streamed weights are refilled from copies taken at install); {_FIX}"
        )

    def guarded_apply(module: nn.Module) -> Callable[..., nn.Module]:
        def _apply(fn: Callable[[Any], Any], recurse: bool = True) -> nn.Module:
            if _changes_a_bound_tensor(module, fn, {id(t) for t in tensors()}):
                raise ConfigError(
                    f"converting the weights of {_where(module, model)} (.to(), .half(), "
                    ".float(), ...) while an offload profile is installed would be lost (streamed "
                    f"weights are views into memory blocks); {_FIX}"
                )
            return type(module)._apply(module, fn, recurse)

        return _apply

    hooks = _true_value_hooks(model, host_copies)
    patched = []
    root = type(model).__name__
    for path, module in model.named_modules():
        hooks.append(module.register_load_state_dict_pre_hook(refuse_load))
        if not _PATCHED & module.__dict__.keys():
            refuse = _RefuseCopy(f"{root}.{path}" if path else root)
            module.__dict__.update(_apply=guarded_apply(module), __reduce_ex__=refuse,
                                   __deepcopy__=refuse)  # fmt: skip
            patched.append(module)

    def undo() -> None:
        for hook in hooks:
            hook.remove()
        for module in patched:
            for name in _PATCHED:
                module.__dict__.pop(name, None)

    return undo
