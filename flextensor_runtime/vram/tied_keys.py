"""Checkpoint keys of tied parameters: read a tie under the name its checkpoint saved it as.

Owns: `with_tied_keys(model, disk_map)`. A checkpoint saved from a model with tied weights
holds a shared parameter once: transformers' `save_pretrained` keeps
`model.embed_tokens.weight` and drops `lm_head.weight`. A disk-tier wrapper on the head
asks for its own name and was refused ("the checkpoint has no tensor 'lm_head.weight'"). The
map returned here answers a name of a tied parameter that the checkpoint lacks (and the names
of its inner tensor fields) with the name the checkpoint holds; every other lookup goes to the
map unchanged. Where no tie needs it, the map itself is returned.
Must not know: wrappers, placements, files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["TiedKeys", "tied_aliases", "with_tied_keys"]


def tied_aliases(model: nn.Module, disk_map: Any, prefix: str = "") -> dict[str, str]:
    """Name the checkpoint lacks -> name it holds, for each parameter reachable under several
    names (`prefix` is put in front of every name, as the wrappers' names have it)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(f"{prefix}.{name}" if prefix else name)
    aliases: dict[str, str] = {}
    for group in names.values():
        held = [n for n in group if n in disk_map]
        if len(group) > 1 and held:
            aliases.update({n: held[0] for n in group if n not in disk_map})
    return aliases


class TiedKeys(Mapping[str, torch.Tensor]):
    """`disk_map` with the names in `aliases` answered by the names they point to."""

    def __init__(self, disk_map: Any, aliases: Mapping[str, str]) -> None:
        self.disk_map = disk_map
        self.aliases = dict(aliases)

    def key(self, name: str) -> str:
        """The name `disk_map` holds for `name` (an inner field `lm_head.weight.scale` too)."""
        if name in self.aliases:
            return self.aliases[name]
        head, _, attr = name.rpartition(".")
        if head in self.aliases and name not in self.disk_map:
            return f"{self.aliases[head]}.{attr}"
        return name

    def load(self, name: str, torch_dtype: Any = None, device: Any = None) -> torch.Tensor:
        return self.disk_map.load(self.key(name), torch_dtype, device)  # type: ignore[no-any-return]

    def stored_layout(self, name: str) -> Any:
        return self.disk_map.stored_layout(self.key(name))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.disk_map[self.key(name)]  # type: ignore[no-any-return]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) in self.disk_map

    def __iter__(self) -> Iterator[str]:
        return iter(self.disk_map)

    def __len__(self) -> int:
        return len(self.disk_map)

    def __getattr__(self, name: str) -> Any:  # path, device, reopen_count, ... of the map
        if name in ("disk_map", "aliases"):
            raise AttributeError(name)
        return getattr(self.disk_map, name)

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __deepcopy__(self, memo: dict[int, Any]) -> TiedKeys:
        return self  # read-only and holding open files, like the map it wraps

    def __copy__(self) -> TiedKeys:
        return self


def with_tied_keys(model: nn.Module, disk_map: Any, prefix: str = "") -> Any:
    """`disk_map`, answering tied names the checkpoint lacks (see the module doc)."""
    if not hasattr(disk_map, "__contains__") or not callable(getattr(disk_map, "load", None)):
        return disk_map  # None, or not a map the wrappers could read (refused where used)
    aliases = tied_aliases(model, disk_map, prefix)
    return TiedKeys(disk_map, aliases) if aliases else disk_map
