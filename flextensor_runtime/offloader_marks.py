"""How one offloader finds another that already manages a model, a part of it, or a whole it is
part of, before it changes anything.

Owns: the member mark (set on every submodule of a model an offloader is installed on: a weak
reference to that model, which a deep copy or a pickle does not carry, so a copy of a module is
nobody's member), and `find_managed`, the walk over a model's modules that every installer runs,
with the wording of where it found the other offloader.
Must not know: which offloaders exist or what they do (callers say how to find their root).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["Managed", "MemberMark", "find_managed", "mark_members", "marked_root", "unmark_members"]


class MemberMark:
    """A weak reference from a submodule to the model an offloader is installed on."""

    __slots__ = ("ref",)

    def __init__(self, root: nn.Module | None = None) -> None:
        self.ref = None if root is None else weakref.ref(root)

    def root(self) -> nn.Module | None:
        return None if self.ref is None else self.ref()

    def __deepcopy__(self, memo: dict[int, Any]) -> MemberMark:
        return MemberMark()  # a copy of a module is not managed by the original's offloader

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (MemberMark, ())


def mark_members(model: nn.Module, attr: str) -> list[nn.Module]:
    """Mark every submodule of `model` (not `model`) under `attr`; return the marked modules."""
    members = [m for m in model.modules() if m is not model]
    for module in members:
        module.__dict__[attr] = MemberMark(model)
    return members


def unmark_members(modules: Iterable[nn.Module], attr: str, model: nn.Module) -> None:
    """Drop the marks under `attr` that point at `model` (a mark set since by another install
    of the same kind on another model stays)."""
    for module in modules:
        if marked_root(module, attr) is model:
            del module.__dict__[attr]


def marked_root(module: nn.Module, attr: str) -> nn.Module | None:
    """The model the mark under `attr` points at, while it is alive; None without a mark."""
    mark = module.__dict__.get(attr)
    return mark.root() if isinstance(mark, MemberMark) else None


@dataclass(frozen=True)
class Managed:
    """A module of the model being installed on (`name` its path, "" the model itself) that
    another offloader manages, and the model that offloader is installed on (`root`)."""

    name: str
    module: nn.Module
    root: nn.Module

    def where(self, has: str) -> str:
        """Where it was found, for an error: "it has X", "its submodule 'a' has X", or "it is
        part of a T that has X (as 'path')"."""
        here = f"its submodule {self.name!r}" if self.name else "it"
        if self.root is self.module:
            return f"{here} has {has}"
        path = next((n for n, m in self.root.named_modules() if m is self.module), "")
        return f"{here} is part of a {type(self.root).__name__} that has {has} (as {path!r})"

    @property
    def target(self) -> str:
        """What a fix is applied to, when it is not the model being installed on: "" (that
        model), "that submodule", or "that T" (the model the found module is part of)."""
        if self.root is not self.module:
            return f"that {type(self.root).__name__}"
        return "that submodule" if self.name else ""


def find_managed(
    model: nn.Module, root_of: Callable[[nn.Module], nn.Module | None]
) -> Managed | None:
    """The first module of `model` (itself included) for which `root_of` names the model an
    offloader is installed on (the module itself, or a model it is a submodule of); None when
    no module of `model` is managed."""
    for name, module in model.named_modules():
        root = root_of(module)
        if root is not None:
            return Managed(name, module, root)
    return None
