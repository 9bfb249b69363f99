"""Refusing changes to what a deployed model is made of: its submodules and its weights' slots.

Owns, on a model with a profile installed, four refusals that raise a `ConfigError` before
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
  its memory block);
- methods that install another offloader over the same weights (diffusers'
  `enable_group_offload`): it would move the memory blocks' contents in place of the weights.
And it runs the methods that rewrite weights' data from their current values while normally
keeping those values (`tie_weights` of transformers models, which sets an output embedding's
`bias.data = pad(bias.data, ...)` even when the bias already has its size) on the true values:
every profile tensor points at its true value during the call (a streamed one at its host
copy), and back at the data it had afterwards; a call that changed a value is refused after
the fact with the model as before. Run as it was, the pad read the memory block outside the
trap and the bias kept a copy of whatever it held (logits off by up to 7e34 on a small BERT
in allocation mode), even after `remove()`. `nn.Module.apply` runs the same way, so a function
that edits weights in place edits the true values (then every transfer is copied again from the
host copies); before, it edited whatever the memory blocks held, or crashed on the placeholders.
Replacing a submodule under a name it already has (swapping a layer, `set_output_embeddings`)
is left to the caller, as before.
Must not know: schedules, backends, profile files.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from flextensor_runtime.errors import ConfigError

__all__ = ["OFFLOADER_METHODS", "REBUILDING_METHODS", "TRUE_VALUE_METHODS", "TrueValue",
           "guard_structure"]  # fmt: skip

# methods (of transformers' PreTrainedModel) that rebuild weights from their current values
REBUILDING_METHODS = ("resize_token_embeddings", "resize_position_embeddings")
# methods (of diffusers' ModelMixin) that install another offloader over the same weights
OFFLOADER_METHODS = ("enable_group_offload",)
# arguments that, all None, make `resize_token_embeddings` only return the embeddings
_READ_ONLY_WHEN_NONE = {"resize_token_embeddings": ("new_num_tokens", "pad_to_multiple_of")}
# methods run on true values: transformers' `tie_weights` (sets `p.data = f(p.data)` keeping the
# values) and `nn.Module.apply` (its function may edit weights in place: the host copies then
# hold the edits, and every transfer is copied again from them)
TRUE_VALUE_METHODS = ("tie_weights", "apply")
_EDITS_IN_PLACE = frozenset(("apply",))
# a profile tensor's name, the tensor as it is now, and its true value (host copy if streamed)
TrueValue = tuple[str, torch.Tensor, torch.Tensor]
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


class _MethodPatch:
    """What every patch set as a module's instance attribute in place of a method keeps: the
    module (weakly: it holds the patch), the class's method, its name and the module's path."""

    def __init__(self, module: nn.Module, method: str, where: str) -> None:
        self.module = weakref.ref(module)  # the module holds this object: no cycle through it
        self.original = getattr(type(module), method)
        self.method, self.where = method, where


class _RefuseRebuild(_MethodPatch):
    """Set in place of a method in `REBUILDING_METHODS` or `OFFLOADER_METHODS`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module()
        if module is not None and self._only_reads(args, kwargs):
            return self.original(module, *args, **kwargs)
        if self.method in OFFLOADER_METHODS:
            raise ConfigError(
                f"{self.where}.{self.method}() while an offload profile is installed is not "
                "supported: the profile's traps already move its weights, and a second "
                "offloader would move the memory blocks' contents (other weights) in their "
                "place; use one offloader: call handle(model).remove() first, or keep the "
                "profile and leave the weights to it"
            )
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


class _OnTrueValues(_MethodPatch):
    """Set as a module's instance attribute in place of a method in `TRUE_VALUE_METHODS`: runs
    it with each profile tensor pointing at its true value, then points each back at the data
    it had (and, for `apply`, has every transfer copied again from the host copies, which now
    hold its in-place edits); refuses the call when it replaced a value (the model is then as
    before). `busy` is shared by every patch of one model: nested calls (`apply` calls each
    child's `apply`) run as they are, inside the outermost one."""

    def __init__(self, module: nn.Module, method: str, where: str, on: _TrueValueCalls) -> None:
        super().__init__(module, method, where)
        self.on = on

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        on = self.on
        if on.busy:
            return self.original(self.module(), *args, **kwargs)
        values = on.values()
        had = [(tensor, tensor.data) for _, tensor, _ in values]
        for _, tensor, true in values:
            tensor.data = true
        on.busy = True
        try:
            result = self.original(self.module(), *args, **kwargs)
            changed = [name for name, tensor, true in values if _changed(tensor, true)]
        finally:
            on.busy = False
            for tensor, data in had:
                tensor.data = data
            if self.method in _EDITS_IN_PLACE:
                on.refill()
        if changed:
            more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
            raise ConfigError(
                f"{self.where}.{self.method}() changed {', '.join(changed[:3])}{more} while an "
                "offload profile is installed, which is not supported (a profile weight's data "
                "may be edited in place but not replaced while installed); the change was "
                f"undone: call handle(model).remove(), then {self.method}(), then "
                "offload_from_profile(model, path) again (or compile a profile for the changed "
                "model with `ftc profile`)"
            )
        return result


class _TrueValueCalls:
    """What the `_OnTrueValues` patches of one model share: the true values, the refill of
    every transfer from the host copies, and whether one of them is running."""

    def __init__(
        self, values: Callable[[], Sequence[TrueValue]], refill: Callable[[], None]
    ) -> None:
        self.values, self.refill = values, refill
        self.busy = False


def _changed(tensor: torch.Tensor, true: torch.Tensor) -> bool:
    """Whether `tensor` no longer holds the values of `true` (new data with other values)."""
    same = (tensor.data_ptr(), tensor.shape, tensor.stride()) == (
        true.data_ptr(), true.shape, true.stride())  # fmt: skip
    if same or tensor.device.type == "meta":
        return False
    if tensor.shape != true.shape or tensor.dtype != true.dtype:
        return True
    return not torch.equal(tensor.detach().to(true.device), true)


def _patch_methods(model: nn.Module, on: _TrueValueCalls) -> Callable[[], None]:
    """Put a `_RefuseRebuild` (or an `_OnTrueValues`) on every module of `model` whose class has
    a method of `REBUILDING_METHODS` or `OFFLOADER_METHODS` (or `TRUE_VALUE_METHODS`)."""
    patched: list[tuple[nn.Module, str, object]] = []
    root = type(model).__name__
    for path, module in model.named_modules():
        where = f"{root}.{path}" if path else root
        for method in (*REBUILDING_METHODS, *OFFLOADER_METHODS, *TRUE_VALUE_METHODS):
            if not callable(getattr(type(module), method, None)) or method in module.__dict__:
                continue
            patch: object = (
                _OnTrueValues(module, method, where, on) if method in TRUE_VALUE_METHODS
                else _RefuseRebuild(module, method, where)
            )  # fmt: skip
            module.__dict__[method] = patch
            patched.append((module, method, patch))

    def undo() -> None:
        for module, method, patch in patched:
            if module.__dict__.get(method) is patch:
                del module.__dict__[method]

    return undo


def guard_structure(
    model: nn.Module,
    placements: Callable[[], Mapping[int, str]],
    values: Callable[[], Sequence[TrueValue]],
    refill: Callable[[], None],
) -> Callable[[], None]:
    """Refuse adding a submodule to any module of `model` (as it is now), replacing its profile
    weights' parameter objects, and the methods that rebuild weights, and run `tie_weights` and
    `apply` on true values; `placements()` maps `id()` of each profile parameter, as it is now,
    to its placement, `values()` gives each profile tensor's `TrueValue`, `refill()` has every
    transfer copied again from the host copies (after `apply`). Returns the undo."""
    members: weakref.WeakSet[nn.Module] = weakref.WeakSet(model.modules())
    undo_methods = _patch_methods(model, _TrueValueCalls(values, refill))
    modules = register_module_module_registration_hook(_refuse_module(model, members))
    params = register_module_parameter_registration_hook(
        _refuse_parameter(model, members, placements)
    )

    def undo() -> None:
        params.remove()
        modules.remove()
        undo_methods()

    return undo
