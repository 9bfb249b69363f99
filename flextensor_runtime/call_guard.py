"""Refusing to run a module whose streamed weights are not present (its trap is not running).

Owns: a check in front of the forward of each module that owns a trap's streamed tensors but
has no trap of its own: a child of a module trap (`blocks.3.up` under the trap `blocks.3`), or a module
driven by a manual trap. Called while a transfer its weights come from is not held by a running
trap (a direct call of the child, or code that lacks `with offload_block(name):`), it raises one
`ConfigError` line naming the module, the trap and the fix. Without it the module silently read
whatever the memory block held. Modules driven by a trap of their own are not hooked (their trap
runs first). When `offload_block` without `model=` resolved to another deployed model, the
message says so. The per-call cost is one Python call and one lookup per transfer the module reads (usually one).
Must not know: schedules on disk, backends, how copies are made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.manual import current_model
from flextensor_runtime.model_tensors import owner_path
from flextensor_runtime.profile import Profile, Trap
from flextensor_runtime.schedule import Tables
from flextensor_runtime.traps import Runtime

__all__ = ["guard_owner_calls"]


@dataclass
class _Need:
    """A hooked module: its path, the trap it belongs to, the transfers its weights come from."""

    path: str
    trap: Trap
    transfers: set[int] = field(default_factory=set)


def _needs(model: nn.Module, profile: Profile, tables: Tables, trapped: set[int]) -> list[_Need]:
    """One entry per module (by object: a module shared by two paths is hooked once) that owns
    streamed tensors and is not in `trapped`."""
    carrier = {e.name: p.index for p in tables.transfers for e in p.entries}
    needs: dict[int, _Need] = {}
    for trap in profile.traps:
        for e in trap.tensors:
            k = carrier.get(e.tie or e.name) if e.placement != "resident" else None
            if k is None:
                continue
            path = owner_path(e.name, e.kind)
            module = model.get_submodule(path)
            if id(module) not in trapped:
                needs.setdefault(id(module), _Need(path, trap)).transfers.add(k)
    return list(needs.values())


def _message(m: nn.Module, need: _Need, model: nn.Module) -> str:
    name, trap = need.path or type(m).__name__, need.trap.name
    if need.trap.kind == "manual":
        other = current_model.get()
        if other is not model:  # an offload_block without model= entered no trap of this one
            what = "none here" if other is None else f"another {type(other).__name__} object"
            return (
                f"module {name!r} ran outside offload_block({trap!r}) on its model: wrap the "
                f"code that calls it in `with offload_block({trap!r}, model=model):` (without "
                f"model= it uses the model most recently deployed in this context: {what})"
            )
        return (
            f"module {name!r} ran outside offload_block({trap!r}): its streamed weights are only "
            f"present inside that block; wrap the code that calls it in "
            f"`with offload_block({trap!r}):`"
        )
    return (
        f"module {name!r} was called outside its trap {trap!r}: its streamed weights are only "
        f"present while that trap runs; call the module {trap!r} or the whole model instead, or "
        "`handle(model).remove()` first"
    )


def _check(active: list[int], need: _Need, model: nn.Module) -> Callable[[nn.Module, Any], None]:
    """The check: one list lookup per transfer (the common case is one transfer)."""
    if len(need.transfers) == 1:
        (k,) = need.transfers

        def check_one(m: nn.Module, args: Any) -> None:
            if not active[k]:
                raise ConfigError(_message(m, need, model))

        return check_one
    needed = tuple(sorted(need.transfers))

    def check(m: nn.Module, args: Any) -> None:
        if not all(active[k] for k in needed):
            raise ConfigError(_message(m, need, model))

    return check


def _guarded(module: nn.Module, check: Callable[[nn.Module, Any], None]) -> Callable[[], None]:
    """Put `check` in front of `module`'s forward (an instance attribute, as a trap's forward is:
    a forward pre-hook would send every call of the module down torch's slower hooked path).
    Returns the undo, which puts back an instance-level forward other code had set."""
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        check(module, args)
        return original(*args, **kwargs)

    forward._ft_original_forward_func = original  # type: ignore[attr-defined]
    forward.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature: the original's
    module.forward = forward  # type: ignore[method-assign]

    def undo() -> None:
        del module.__dict__["forward"]
        if had:
            module.__dict__["forward"] = previous

    return undo


def guard_owner_calls(
    model: nn.Module, profile: Profile, tables: Tables, runtime: Runtime, trapped: set[int]
) -> Callable[[], None]:
    """Guard the owners of streamed tensors (not those in `trapped`, the ids of modules with a
    trap of their own). Returns the undo."""
    undos = [
        _guarded(model.get_submodule(need.path), _check(runtime.active, need, model))
        for need in _needs(model, profile, tables, trapped)
    ]

    def undo() -> None:
        for one in reversed(undos):
            one()

    return undo
