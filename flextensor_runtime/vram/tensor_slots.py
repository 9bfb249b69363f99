"""Finding and replacing the parameters a wrapper manages, permanently or for one call.

Owns: the list of a module's parameters (shared ones once, under their first name), replacing
them while keeping ties between modules, and the temporary swap used by compute copies.
Must not know: placements, disk maps or wrapper state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["managed_parameters", "replace_parameters", "swapped_parameters"]


def _slots(root: nn.Module, recurse: bool) -> Iterator[tuple[str, nn.Module, str, torch.Tensor]]:
    modules = root.named_modules(remove_duplicate=False) if recurse else [("", root)]
    for prefix, module in modules:
        for local, param in module._parameters.items():
            if param is not None:
                yield (f"{prefix}.{local}" if prefix else local), module, local, param


def managed_parameters(root: nn.Module, recurse: bool = True) -> dict[str, torch.Tensor]:
    """Qualified name -> parameter; a parameter shared by several modules appears once."""
    seen: set[int] = set()
    found: dict[str, torch.Tensor] = {}
    for name, _, _, param in _slots(root, recurse):
        if id(param) not in seen:
            seen.add(id(param))
            found[name] = param
    return found


def _install(
    root: nn.Module, new_by_name: Mapping[str, torch.Tensor], recurse: bool
) -> dict[tuple[int, str], torch.Tensor]:
    """Put `new_by_name` in place (ties kept); return what each slot held before."""
    by_id = {id(p): new_by_name[n] for n, p in managed_parameters(root, recurse).items()
             if n in new_by_name}  # fmt: skip
    previous: dict[tuple[int, str], torch.Tensor] = {}
    for _, module, local, param in _slots(root, recurse):
        new = by_id.get(id(param))
        if new is not None:
            previous[(id(module), local)] = param
            module._parameters[local] = new  # type: ignore[assignment]
    return previous


def replace_parameters(
    root: nn.Module, new_by_name: Mapping[str, torch.Tensor], recurse: bool = True
) -> None:
    """Permanently replace parameters by qualified name with new `nn.Parameter`s."""
    wrapped = {
        name: t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
        for name, t in new_by_name.items()
    }
    _install(root, wrapped, recurse)


@contextmanager
def swapped_parameters(
    root: nn.Module, new_by_name: Mapping[str, torch.Tensor], recurse: bool = True
) -> Iterator[None]:
    """Use `new_by_name` as the parameters for the duration of the block, then restore them.
    A parameter in `new_by_name` is used as it is (with the attributes it carries)."""
    wrapped = {
        n: t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
        for n, t in new_by_name.items()
    }
    modules = {id(m): m for m in root.modules()} if recurse else {id(root): root}
    previous = _install(root, wrapped, recurse)
    try:
        yield
    finally:
        for (module_id, local), param in previous.items():
            modules[module_id]._parameters[local] = param  # type: ignore[assignment]
