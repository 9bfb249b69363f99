"""The tensors of a model as the profile names them: parameters, buffers, inner tensor fields, ties.

Owns: enumerating a model's tensors into `TensorEntry` records (all resident, no placement),
detecting tied weights (same Parameter object, or the same storage bytes), naming inner tensor
fields (`<param>.<attr>`, e.g. `lm_head.weight.scale` for FP8), and comparing two tensor lists
(what `ProfileMismatchError` reports). Works on meta-device models (no data is read).
Must not know: plans, blocks, the wire format's encoding, the compiler.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from flextensor_runtime.profile import TensorEntry

__all__ = [
    "TensorDiff",
    "diff_tensors",
    "dtype_name",
    "inner_fields",
    "iter_model_tensors",
    "model_tensor_entries",
    "owner_path",
]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the profile's dtype spelling)."""
    return str(dtype).removeprefix("torch.")


def owner_path(name: str, kind: str) -> str:
    """The path of the module that holds the tensor `name` ("" for the root): its parent, or for
    an inner field (`w.scale`, named after its parameter) the parameter's parent."""
    parts = name.split(".")
    return ".".join(parts[: -2 if kind == "inner" else -1])


def _storage_key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    if t.device.type == "meta":
        return None
    ptr = t.untyped_storage().data_ptr()
    if ptr == 0:
        return None
    return (ptr, int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))


def inner_fields(param: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(attribute, tensor) for each public tensor attribute a parameter carries (an FP8
    `weight.scale`), by name; `Module.to()` and `.cuda()` leave these where they are."""
    attrs = getattr(param, "__dict__", {})
    for attr in sorted(attrs):
        value = attrs[attr]
        if isinstance(value, torch.Tensor) and not attr.startswith("_"):
            yield attr, value


def iter_model_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, str]]:
    """Yield (name, tensor, kind) for every parameter, inner tensor field and buffer, tied
    aliases included (in registration order)."""
    for name, param in model.named_parameters(remove_duplicate=False):
        yield name, param, "parameter"
        for attr, inner in inner_fields(param):
            yield f"{name}.{attr}", inner, "inner"
    for name, buf in model.named_buffers(remove_duplicate=False):
        yield name, buf, "buffer"


def model_tensor_entries(model: nn.Module) -> list[TensorEntry]:
    """Every model tensor as a resident `TensorEntry`; aliases carry `tie` = canonical name."""
    by_id: dict[int, str] = {}
    by_storage: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    entries: list[TensorEntry] = []
    for name, t, kind in iter_model_tensors(model):
        key = _storage_key(t)
        canonical = by_id.get(id(t)) or (by_storage.get(key) if key is not None else None)
        if canonical is None:
            by_id[id(t)] = name
            if key is not None:
                by_storage[key] = name
        entries.append(
            TensorEntry(
                name=name,
                bytes=t.numel() * t.element_size(),
                dtype=dtype_name(t.dtype),
                shape=tuple(t.shape),
                stride=tuple(t.stride()),
                tie=canonical,
                kind=kind,
            )
        )
    return entries


@dataclass(frozen=True)
class TensorDiff:
    """How a model's tensors differ from the ones a profile was compiled for."""

    missing: tuple[str, ...]  # in the profile, not in the model
    extra: tuple[str, ...]  # in the model, not in the profile
    reshaped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # name, profile, model
    retyped: tuple[tuple[str, str, str], ...]  # name, profile dtype, model dtype
    # name, profile stride, model stride: same shape, other memory layout (e.g. transposed)
    relaid: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.missing or self.extra or self.reshaped or self.retyped or self.relaid)

    def summary(self, first: int = 3) -> str:
        """One line: counts and the first few names of each kind of difference."""
        parts = []
        for label, items in (
            ("missing", [m for m in self.missing]),
            ("extra", [e for e in self.extra]),
            ("reshaped", [f"{n} {list(a)}->{list(b)}" for n, a, b in self.reshaped]),
            ("re-typed", [f"{n} {a}->{b}" for n, a, b in self.retyped]),
            (
                "laid out differently",
                [f"{n} stride {list(a)}->{list(b)}" for n, a, b in self.relaid],
            ),
        ):
            if items:
                more = f" (+{len(items) - first} more)" if len(items) > first else ""
                parts.append(f"{len(items)} {label}: {', '.join(items[:first])}{more}")
        return "; ".join(parts) if parts else "no differences"


def diff_tensors(expected: Iterable[TensorEntry], actual: Iterable[TensorEntry]) -> TensorDiff:
    """Compare the profile's tensor list (`expected`) with a model's (`actual`)."""
    exp = {e.name: e for e in expected}
    act = {a.name: a for a in actual}
    common = sorted(exp.keys() & act.keys())
    return TensorDiff(
        missing=tuple(sorted(exp.keys() - act.keys())),
        extra=tuple(sorted(act.keys() - exp.keys())),
        reshaped=tuple(
            (n, exp[n].shape, act[n].shape) for n in common if exp[n].shape != act[n].shape
        ),
        retyped=tuple(
            (n, exp[n].dtype, act[n].dtype) for n in common if exp[n].dtype != act[n].dtype
        ),
        relaid=tuple(
            (n, exp[n].stride, act[n].stride)
            for n in common
            if exp[n].shape == act[n].shape and not _same_layout(exp[n], act[n])
        ),
    )


def _same_layout(a: TensorEntry, b: TensorEntry) -> bool:
    """Equal strides on every dimension that has more than one element (a size-1 dimension's
    stride never addresses anything)."""
    if len(a.stride) != len(b.stride):
        return False
    return all(x == y for size, x, y in zip(a.shape, a.stride, b.stride, strict=True) if size > 1)
