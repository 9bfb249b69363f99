"""Refusing to run a module whose streamed weights belong to a manual trap outside that trap.

Owns: forward pre-hooks on the modules that own a manual trap's streamed tensors: when such a
module is called while none of the traps reading its weights' transfers is running (the code
lacks `with offload_block(name):`), one `ConfigError` line names the module, the trap and the
fix. Without it the module silently read whatever the memory block held. Modules driven by a
trap of their own are not hooked (their trap runs first).
Must not know: schedules on disk, backends, how copies are made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import Profile, TensorEntry
from flextensor_runtime.schedule import Tables
from flextensor_runtime.traps import Runtime

__all__ = ["guard_manual_traps"]


def _owner(e: TensorEntry) -> str:
    """The path of the module that holds `e` ("" for the root)."""
    parts = e.name.split(".")
    return ".".join(parts[: -2 if e.kind == "inner" else -1])


def _needs(profile: Profile, tables: Tables) -> dict[str, tuple[str, set[int]]]:
    """Owner path -> (manual trap name, transfers its streamed tensors come from)."""
    carrier = {e.name: p.index for p in tables.transfers for e in p.entries}
    needs: dict[str, tuple[str, set[int]]] = {}
    for trap in profile.traps:
        if trap.kind != "manual":
            continue
        for e in trap.tensors:
            k = carrier.get(e.tie or e.name) if e.placement != "resident" else None
            if k is not None:
                needs.setdefault(_owner(e), (trap.name, set()))[1].add(k)
    return needs


def guard_manual_traps(
    model: nn.Module, profile: Profile, tables: Tables, runtime: Runtime, trapped: set[int]
) -> Callable[[], None]:
    """Hook the owners of manual traps' streamed tensors (not those in `trapped`, the ids of
    modules with a trap of their own). Returns the undo."""
    hooks = []
    active = runtime.active
    for path, (trap, ks) in _needs(profile, tables).items():
        module = model.get_submodule(path)
        if id(module) in trapped:
            continue
        needed = tuple(sorted(ks))

        def check(m: nn.Module, args: Any, path: str = path, trap: str = trap,
                  needed: tuple[int, ...] = needed) -> None:  # fmt: skip
            if not all(active[k] for k in needed):
                raise ConfigError(
                    f"module {path or type(m).__name__!r} ran outside offload_block({trap!r}): "
                    "its streamed weights are only present inside that block; wrap the code "
                    f"that calls it in `with offload_block({trap!r}):`"
                )

        hooks.append(module.register_forward_pre_hook(check))

    def undo() -> None:
        for hook in hooks:
            hook.remove()

    return undo
