"""Refusing changes to what a deployed model is made of: its submodules and its weights' slots.

Owns, on a model with a profile installed, three refusals that raise a `ConfigError` before
anything changes (torch's process-wide registration hooks and instance attributes, all removed
by the undo):
- adding a submodule under a name a module does not have yet: code that adds modules built from
  existing weights (diffusers' `fuse_qkv_projections` concatenates `to_q`, `to_k`, `to_v` into a
  new `to_qkv`) read streamed weights outside their traps, i.e. memory blocks holding whichever
  transfer ran last: the outputs were silently wrong;
- putting another parameter object where a profile weight is (`lm_head.weight =
  nn.Parameter(...)`, a new tie), or a streamed weight under a name the profile does not give it
  (its owner's trap would not load it there);
- methods that rebuild weights from their current values and replace their data
  (`resize_token_embeddings`, `resize_position_embeddings` of transformers models): they read
  streamed weights outside their traps, and `p.data = new` reaches no hook (in the
  `raw_block_transfer` and `strategy` modes the next trap entry even points the weight back at
  its memory block).
Replacing a submodule under a name it already has (swapping a layer, `set_output_embeddings`)
is left to the caller, as before.
Must not know: schedules, backends, profile files.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from flextensor_runtime.errors import ConfigError

__all__ = ["REBUILDING_METHODS", "guard_structure"]

# methods (of transformers' PreTrainedModel) that rebuild weights from their current values
REBUILDING_METHODS = ("resize_token_embeddings", "resize_position_embeddings")
# arguments that, all None, make `resize_token_embeddings` only return the embeddings
_READ_ONLY_WHEN_NONE = {"resize_token_embeddings": ("new_num_tokens", "pad_to_multiple_of")}
_FIX = "call handle(model).remove(), change the model, then compile a profile for it with `ftc profile`"


def _path(model: nn.Module, module: nn.Module, name: str) -> str:
    where = next((p for p, m in model.named_modules() if m is module), None)
    root = type(model).__name__
    return f"{root}.{where}.{name}" if where else f"{root}.{name}"


def _refuse_module(model: nn.Module, members: weakref.WeakSet[nn.Module]) -> Callable[..., None]:
    def refuse(module: nn.Module, name: str, value: Any) -> None:
        if module not in members or name in module._modules:
            return
        raise ConfigError(
            f"adding {_path(model, module, name)} ({type(value).__name__}) while an offload "
            "profile is installed is not supported: the profile was compiled for the model as "
            "it was, and code that builds modules from its weights (e.g. "
            "fuse_qkv_projections) would read streamed weights outside their traps, from memory "
            f"blocks holding other weights; {_FIX}"
        )

    return refuse


def _refuse_parameter(
    model: nn.Module,
    members: weakref.WeakSet[nn.Module],
    placements: Callable[[], Mapping[int, str]],
) -> Callable[..., None]:
    def refuse(module: nn.Module, name: str, value: Any) -> None:
        if module not in members:
            return
        current = module._parameters.get(name)
        if current is value:
            return  # re-registering the same object (tie_weights on tied weights) changes nothing
        placed = placements()
        held = placed.get(id(current)) if current is not None else None
        if held is None and placed.get(id(value)) not in ("streamed", "disk"):
            return  # neither replaces a profile weight nor moves a streamed one
        where = _path(model, module, name)
        what = (f"replacing the {held} weight {where} with another parameter" if held
                else f"setting {where} to a streamed weight")  # fmt: skip
        raise ConfigError(
            f"{what} while an offload profile is installed is not supported: the profile's "
            "weights are read-only while installed (streamed ones are views into memory blocks "
            "their own trap refills, and outside it hold other weights); call "
            "handle(model).remove(), change the weights, "
            "then offload_from_profile(model, path) again (or compile a profile for the changed "
            "model with `ftc profile`)"
        )

    return refuse


class _RefuseRebuild:
    """Set as a module's instance attribute in place of a method in `REBUILDING_METHODS`."""

    def __init__(self, module: nn.Module, method: str, where: str) -> None:
        self.module = weakref.ref(module)  # the module holds this object: no cycle through it
        self.original = getattr(type(module), method)
        self.method, self.where = method, where

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module()
        if module is not None and self._only_reads(args, kwargs):
            return self.original(module, *args, **kwargs)
        raise ConfigError(
            f"{self.where}.{self.method}() while an offload profile is installed is not "
            "supported: it rebuilds weights from their current values (streamed weights hold "
            "other weights outside their traps) and changes shapes the profile was compiled for; "
            f"resize before deploying: call handle(model).remove(), then {self.method}(...), "
            "then compile a profile for the resized model with `ftc profile` and deploy that"
        )

    def _only_reads(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        names = _READ_ONLY_WHEN_NONE.get(self.method)
        if names is None:
            return False
        try:
            bound = inspect.signature(self.original).bind(None, *args, **kwargs)
        except TypeError:
            return False
        return all(bound.arguments.get(n) is None for n in names)


def _refuse_rebuilds(model: nn.Module) -> Callable[[], None]:
    """Put a `_RefuseRebuild` on every module of `model` whose class has such a method."""
    patched: list[tuple[nn.Module, str, _RefuseRebuild]] = []
    root = type(model).__name__
    for path, module in model.named_modules():
        for method in REBUILDING_METHODS:
            if not callable(getattr(type(module), method, None)) or method in module.__dict__:
                continue
            refusal = _RefuseRebuild(module, method, f"{root}.{path}" if path else root)
            module.__dict__[method] = refusal
            patched.append((module, method, refusal))

    def undo() -> None:
        for module, method, refusal in patched:
            if module.__dict__.get(method) is refusal:
                del module.__dict__[method]

    return undo


def guard_structure(
    model: nn.Module, placements: Callable[[], Mapping[int, str]]
) -> Callable[[], None]:
    """Refuse adding a submodule to any module of `model` (as it is now), replacing its profile
    weights' parameter objects, and the methods that rebuild weights; `placements()` maps
    `id()` of each profile parameter, as it is now, to its placement. Returns the undo."""
    members: weakref.WeakSet[nn.Module] = weakref.WeakSet(model.modules())
    undo_methods = _refuse_rebuilds(model)
    modules = register_module_module_registration_hook(_refuse_module(model, members))
    params = register_module_parameter_registration_hook(
        _refuse_parameter(model, members, placements)
    )

    def undo() -> None:
        params.remove()
        modules.remove()
        undo_methods()

    return undo
