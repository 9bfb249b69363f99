"""Inner tensor fields of a parameter that is copied or moved: which go with it, and where.

Owns: which inner tensor fields (`model_tensors.inner_fields`: an FP8 `weight.scale`) a copy of
a parameter carries, the new parameter that carries them (`with_fields`, used by layer-wise
offload and the VRAM wrappers), and the VRAM wrappers' rule for them (`fields_at`): a field goes
where its parameter goes (the same device, pinned when the parameter's host copy is) and keeps
its own dtype, since a placement dtype is a weight format and a scale cast to bfloat16 or float8
loses the precision it exists for. On the disk tier the parameter is a meta placeholder while
its real fields wait in host memory (a checkpoint saved from a state dict does not hold them); a
field that is itself on the meta device is read from the checkpoint when its parameter is.
Must not know: wrapper stages or state, layer windows, disk maps (callers pass a reader).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from flextensor_runtime.model_tensors import inner_fields

__all__ = ["FieldReader", "carried_fields", "fields_at", "fields_placed", "with_fields"]

# (managed parameter name, field attribute, the meta field, device) -> the field read there
FieldReader = Callable[[str, str, torch.Tensor, torch.device], torch.Tensor]


def _subclass_inner(param: torch.Tensor) -> set[str]:
    """A tensor subclass's own inner tensors (its `__tensor_flatten__` names); none for a tensor."""
    if not is_traceable_wrapper_subclass(param):
        return set()
    return set(param.__tensor_flatten__()[0])  # type: ignore[attr-defined]


def carried_fields(param: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The inner tensor fields (`model_tensors.inner_fields`) that must be moved next to
    `param`: all of them, less a tensor subclass's own inner tensors (its
    `__tensor_flatten__` names), which the subclass copies itself when `param` is copied."""
    own = _subclass_inner(param)
    return [(attr, inner) for attr, inner in inner_fields(param) if attr not in own]


def with_fields(
    data: torch.Tensor,
    param: torch.Tensor,
    copies: Mapping[int, torch.Tensor],
    requires_grad: bool = False,
) -> nn.Parameter:
    """`data` (a copy of `param`) as a parameter that carries `param`'s attributes, each inner
    tensor field as its copy in `copies` (by id of the field; fields without one are carried
    as they are), so an FP8 `weight.scale` goes where its weight goes. Not carried: a tensor
    subclass's own inner tensors (`data` has its own) and our bookkeeping (`_flextensor_*`,
    which describes `param`, not the copy)."""
    new = nn.Parameter(data, requires_grad=requires_grad)
    own = _subclass_inner(param)
    for attr, value in vars(param).items():
        if attr not in own and not attr.startswith("_flextensor"):
            moved = copies.get(id(value)) if isinstance(value, torch.Tensor) else None
            new.__dict__[attr] = value if moved is None else moved
    return new


def _placed(inner: torch.Tensor, device: torch.device, pin: bool) -> bool:
    return str(inner.device) == str(device) and (inner.is_pinned() or not pin)


def _field_at(
    name: str,
    attr: str,
    inner: torch.Tensor,
    device: torch.device | None,
    pin: bool,
    read: FieldReader | None,
) -> torch.Tensor:
    if inner.device.type == "meta":
        if device is None or read is None:
            return inner  # a placeholder on the disk tier, or nothing to read it with
        return read(name, attr, inner, device)
    target = torch.device("cpu") if device is None else device
    if _placed(inner, target, pin):
        return inner
    moved = inner.detach().to(target, non_blocking=inner.is_pinned())
    return moved.pin_memory() if pin and not moved.is_pinned() else moved


def fields_at(
    params: Mapping[str, torch.Tensor],
    device: torch.device | None,
    pin: bool = False,
    read: FieldReader | None = None,
) -> dict[int, torch.Tensor]:
    """id(field) -> each inner field of `params` (by name) at `device`, in its own dtype: the
    field itself when it is already there, else one copy per field (so a field two parameters
    share stays shared), pinned when `pin`. `device=None` is the disk tier: real fields go to
    host memory. A meta field stays meta on the disk tier, and elsewhere is `read` (left meta
    without a reader)."""
    copies: dict[int, torch.Tensor] = {}
    for name, param in params.items():
        for attr, inner in carried_fields(param):
            if id(inner) not in copies:
                copies[id(inner)] = _field_at(name, attr, inner, device, pin, read)
    return copies


def fields_placed(params: Mapping[str, torch.Tensor], device: torch.device, pin: bool) -> bool:
    """Whether every real inner field of `params` already is on `device` (pinned when `pin`),
    so a wrapper whose parameters are in place need not move anything."""
    return all(
        inner.device.type == "meta" or _placed(inner, device, pin)
        for param in params.values()
        for _, inner in carried_fields(param)
    )
