"""Binding a profile to a model: every profile tensor and trap resolved to live objects.

Owns: the fingerprint comparison that raises `ProfileMismatchError` (missing, extra, reshaped,
re-typed and re-tied tensors, trap modules absent from the model), and the `TensorRef` records
that know every place a tensor object is referenced from (so its data can be swapped, or the
object replaced when it lives on the meta device) and whether other code swapped it since.
Must not know: schedules, backends, files. Binding never changes the model.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ProfileMismatchError
from flextensor_runtime.model_tensors import TensorDiff, diff_tensors, model_tensor_entries
from flextensor_runtime.profile import Profile, TensorEntry

__all__ = ["Binding", "TensorRef", "bind_profile"]

Place = tuple[MutableMapping[str, torch.Tensor], str]


@dataclass
class TensorRef:
    """One distinct tensor object of the model and every (container, key) that references it."""

    tensor: torch.Tensor
    places: list[Place] = field(default_factory=list)
    current: torch.Tensor | None = None  # the data `set_data` last pointed the tensor at

    def set_data(self, data: torch.Tensor) -> None:
        """Point the tensor at `data`; a meta tensor is replaced by a new object everywhere."""
        old = self.tensor
        self.current = data
        if old.device.type != "meta" and data.device.type != "meta":
            old.data = data
            return
        new: torch.Tensor
        if isinstance(old, nn.Parameter):
            new = nn.Parameter(data, requires_grad=old.requires_grad)
            new.__dict__ = old.__dict__  # inner tensor fields (and refs into them) carry over
        else:
            new = data
        for container, key in self.places:
            container[key] = new
        self.tensor = new

    def replaced_by_user(self) -> bool:
        """Whether other code pointed the tensor at other data since `set_data` last did (e.g.
        `p.data = bigger` in transformers' `resize_token_embeddings`)."""
        t, cur = self.tensor, self.current
        if cur is None:
            return False
        return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) != (
            cur.data_ptr(), cur.shape, cur.stride(), cur.dtype, cur.device)  # fmt: skip


@dataclass
class Binding:
    """A profile resolved against one model (no changes made to it)."""

    refs: dict[str, TensorRef]  # profile tensor name -> ref (tied names share one ref)
    modules: dict[str, nn.Module]  # trap name -> module, for module and named gap traps
    extra: tuple[str, ...]  # model tensors the profile does not list (strict=False only)


def _places(model: nn.Module) -> dict[int, list[Place]]:
    places: dict[int, list[Place]] = {}
    for module in model.modules():
        for container in (module._parameters, module._buffers):
            for key, t in container.items():
                if t is None:
                    continue
                places.setdefault(id(t), []).append((container, key))  # type: ignore[arg-type]
                if isinstance(t, nn.Parameter):
                    for attr, inner in vars(t).items():
                        if isinstance(inner, torch.Tensor) and not attr.startswith("_"):
                            places.setdefault(id(inner), []).append((vars(t), attr))
    return places


def _named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = p
        for attr, inner in vars(p).items():
            if isinstance(inner, torch.Tensor) and not attr.startswith("_"):
                out[f"{name}.{attr}"] = inner
    for name, b in model.named_buffers(remove_duplicate=False):
        out[name] = b
    return out


def _check_fingerprint(profile: Profile, actual: list[TensorEntry], strict: bool) -> None:
    expected = list(profile.all_tensors())
    diff = diff_tensors(expected, actual)
    exp_ties = {e.name: e.tie for e in expected}
    retied = [
        f"{a.name} (profile: {exp_ties[a.name]}, model: {a.tie})"
        for a in actual
        if a.name in exp_ties and exp_ties[a.name] != a.tie
    ]
    problems = []
    if diff.missing or diff.reshaped or diff.retyped or diff.relaid or (strict and diff.extra):
        problems.append(diff.summary() if strict else _without_extra(diff))
    if retied:
        more = f" (+{len(retied) - 3} more)" if len(retied) > 3 else ""
        problems.append(f"{len(retied)} tied differently: {', '.join(retied[:3])}{more}")
    if problems and diff.extra and all(n.startswith("_orig_mod.") for n in diff.extra):
        raise ProfileMismatchError(
            "the model is a torch.compile wrapper (its tensors are named `_orig_mod.*`, the "
            "profile's are not); deploy on the model before compiling it and compile the "
            "deployed model, or deploy on `compiled._orig_mod`"
        )
    if problems:
        # A streamed tensor becomes a view with the profile's strides: another layout would be
        # restored transposed by remove(), so it is refused like another shape.
        layout = (" (or store those tensors as compiled, e.g. `p.data = p.data.contiguous()`)"
                  if diff.relaid else "")  # fmt: skip
        raise ProfileMismatchError(
            f"the profile was compiled for a different model: {'; '.join(problems)}; "
            f"recompile it for this model with `ftc profile`{layout}"
        )


def _without_extra(diff: TensorDiff) -> str:
    return replace(diff, extra=()).summary()


def _trap_modules(profile: Profile, model: nn.Module) -> dict[str, nn.Module]:
    named = dict(model.named_modules(remove_duplicate=False))
    modules: dict[str, nn.Module] = {}
    absent = []
    for trap in profile.traps:
        if trap.kind == "manual":
            continue
        module = named.get(trap.name)
        if module is not None:
            modules[trap.name] = module
        elif trap.kind == "module":
            absent.append(trap.name)
    if absent:
        more = f" (+{len(absent) - 3} more)" if len(absent) > 3 else ""
        raise ProfileMismatchError(
            f"the profile traps {count_of(len(absent), 'module')} this model lacks: "
            f"{', '.join(absent[:3])}{more}; recompile it for this model with `ftc profile`"
        )
    return modules


def bind_profile(profile: Profile, model: nn.Module, strict: bool = True) -> Binding:
    """Resolve every profile tensor and trap against `model`, or raise `ProfileMismatchError`."""
    actual = model_tensor_entries(model)
    _check_fingerprint(profile, actual, strict)
    modules = _trap_modules(profile, model)
    named = _named_tensors(model)
    places = _places(model)
    by_object: dict[int, TensorRef] = {}
    refs: dict[str, TensorRef] = {}
    for entry in profile.all_tensors():
        t = named[entry.name]
        ref = by_object.get(id(t))
        if ref is None:
            ref = by_object[id(t)] = TensorRef(t, list(places.get(id(t), [])))
        refs[entry.name] = ref
    listed = {e.name for e in profile.all_tensors()}
    extra = tuple(sorted(a.name for a in actual if a.name not in listed))
    return Binding(refs=refs, modules=modules, extra=extra)
