"""Refusing new submodules on a deployed model.

Owns: one module-registration hook (torch's, process-wide, removed by the undo) that raises a
`ConfigError` when code adds a submodule under a name a module of a model with a profile
installed does not have yet. Code that adds modules built from existing weights (diffusers'
`fuse_qkv_projections` concatenates `to_q`, `to_k`, `to_v` into a new `to_qkv`) reads streamed
weights outside their traps, i.e. memory blocks holding whichever transfer ran last: the outputs
were silently wrong. The hook runs before the attribute is set, so the model is unchanged.
Replacing a submodule under a name it already has (swapping a layer, `set_output_embeddings`)
is left to the caller, as before.
Must not know: schedules, backends, profile files.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from flextensor_runtime.errors import ConfigError

__all__ = ["guard_structure"]


def _path(model: nn.Module, module: nn.Module, name: str) -> str:
    where = next((p for p, m in model.named_modules() if m is module), None)
    root = type(model).__name__
    return f"{root}.{where}.{name}" if where else f"{root}.{name}"


def guard_structure(model: nn.Module) -> Callable[[], None]:
    """Refuse adding a submodule to any module of `model` (as it is now); returns the undo."""
    members: weakref.WeakSet[nn.Module] = weakref.WeakSet(model.modules())

    def refuse(module: nn.Module, name: str, value: Any) -> None:
        if module not in members or name in module._modules:
            return
        raise ConfigError(
            f"adding {_path(model, module, name)} ({type(value).__name__}) while an offload "
            "profile is installed is not supported: the profile was compiled for the model as "
            "it was, and code that builds modules from its weights (e.g. "
            "fuse_qkv_projections) would read streamed weights outside their traps, from memory "
            "blocks holding other weights; call handle(model).remove(), change the model, then "
            "compile a profile for it with `ftc profile`"
        )

    return register_module_module_registration_hook(refuse).remove
