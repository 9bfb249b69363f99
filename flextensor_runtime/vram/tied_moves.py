"""Keeping tied weights tied when VRAM wrappers move them.

A parameter shared by two wrapped modules (an embedding and its output head) is managed by
each wrapper separately. When one wrapper moves it to a new placement (a cast, another device,
pinned host memory, the disk tier's meta placeholder), the old parameter records what it
became; a tied wrapper moving the same parameter to the same placement then takes that new
parameter instead of making a second copy, so the tie (one tensor, one storage) holds.

Owns: the move record on a parameter (the placement key, the parameter's version when it was
copied, and a weak reference to the new parameter) and the lookup.
Must not know: wrappers, stages or disk maps.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["MoveKey", "moved_before", "record_move"]

_ATTR = "_flextensor_moved_to"


@dataclass(frozen=True)
class MoveKey:
    """Where a move puts one tensor: its dtype, device (or "disk") and whether it is pinned."""

    dtype: torch.dtype
    device: str
    pinned: bool

    @classmethod
    def of(
        cls, param: torch.Tensor, dtype: torch.dtype | None, device: str, pinned: bool
    ) -> MoveKey:
        """The key of moving `param` to `dtype` (None, or a non-floating tensor: its own)."""
        keep = dtype is None or not param.is_floating_point()
        return cls(param.dtype if keep else dtype, device, pinned)  # type: ignore[arg-type]


class _Moves:
    """The record kept on a moved parameter. Neither pickled nor deep-copied with it: a copy
    of the parameter was never moved. It pickles as an empty OrderedDict, a type that
    `torch.load(weights_only=True)` accepts, so a saved parameter still loads."""

    __slots__ = ("by_key",)

    def __init__(self) -> None:
        self.by_key: dict[MoveKey, tuple[int, weakref.ref[nn.Parameter]]] = {}

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (OrderedDict, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> _Moves:
        return _Moves()


def _version(tensor: torch.Tensor) -> int:
    return 0 if tensor.is_inference() else tensor._version  # inference tensors have none


def moved_before(param: torch.Tensor, key: MoveKey) -> nn.Parameter | None:
    """The parameter `param` was already moved to at `key`, if it is alive and `param` was not
    edited in place since (then its values would be stale)."""
    moves = param.__dict__.get(_ATTR)
    if not isinstance(moves, _Moves) or key not in moves.by_key:
        return None
    version, ref = moves.by_key[key]
    new = ref()
    return new if new is not None and version == _version(param) else None


def record_move(param: torch.Tensor, key: MoveKey, new: nn.Parameter) -> None:
    """Remember that `param` became `new` at `key` (weakly: the record keeps nothing alive)."""
    moves = param.__dict__.get(_ATTR)
    if not isinstance(moves, _Moves):
        moves = _Moves()
        param.__dict__[_ATTR] = moves
    moves.by_key[key] = (_version(param), weakref.ref(new))
