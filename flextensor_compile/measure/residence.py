"""Where a model's tensors live while it is profiled, and putting every one back afterwards.

Owns: moving a module's parameters (their data, so the Parameter objects stay), the inner tensor
fields parameters carry (an FP8 `weight.scale`: `Module.to()` leaves those behind) and buffers to
a device, remembering each original tensor, and restoring exactly those originals (their device,
pinned or memory-mapped storage and values) for one module or for all. A tensor reached twice
(a tied parameter, a buffer or inner field shared by two owners) moves once. Counting the bytes
a placement would still move.
Must not know: traps, timing, clocks, the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from flextensor_runtime.model_tensors import inner_fields

__all__ = ["Residence", "bytes_to_move"]


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """Every distinct tensor of `module` (parameters, their inner fields, buffers)."""
    seen: set[int] = set()
    for p in module.parameters():
        for t in (p, *(v for _, v in inner_fields(p))):
            if id(t) not in seen:
                seen.add(id(t))
                yield t
    for b in module.buffers():
        if id(b) not in seen:
            seen.add(id(b))
            yield b


def bytes_to_move(module: nn.Module, device: torch.device) -> int:
    """Bytes of `module`'s distinct tensors not on `device` yet (ties counted once)."""
    return sum(t.numel() * t.element_size() for t in _tensors(module) if t.device != device)


@dataclass
class Residence:
    """Moves modules' own tensors to `device` and puts the originals back."""

    device: torch.device
    _placed: dict[int, torch.Tensor] = field(default_factory=dict)  # id(original) -> its copy
    _params: dict[int, tuple[nn.Parameter, torch.Tensor, dict[str, torch.Tensor]]] = field(
        default_factory=dict
    )
    _buffers: dict[tuple[int, str], tuple[nn.Module, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.device.type == "cuda" and self.device.index is None:  # as tensors report it
            self.device = torch.device("cuda", torch.cuda.current_device())

    def placed(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as it sits on the device (the original when it is there already)."""
        return tensor.to(self.device)

    def _once(self, tensor: torch.Tensor) -> torch.Tensor:
        """One placed copy per original tensor (a buffer or field shared by two owners)."""
        if id(tensor) not in self._placed:
            self._placed[id(tensor)] = self.placed(tensor)
        return self._placed[id(tensor)]

    def move(self, module: nn.Module, recurse: bool = True) -> None:
        """Put `module`'s tensors (and, with `recurse`, its submodules') on the device."""
        for m in module.modules() if recurse else (module,):
            for param in m._parameters.values():
                if param is not None and id(param) not in self._params:
                    fields = dict(inner_fields(param))
                    self._params[id(param)] = (param, param.data, fields)
                    param.data = self.placed(param.data)
                    for name, value in fields.items():
                        setattr(param, name, self._once(value))
            for name, buf in m._buffers.items():
                if buf is not None and (id(m), name) not in self._buffers:
                    self._buffers[(id(m), name)] = (m, buf)
                    m._buffers[name] = self._once(buf)

    def restore(self, module: nn.Module | None = None) -> None:
        """Put back the originals of `module`'s tensors (its submodules' too), or of all."""
        if module is None:
            params, buffers = list(self._params), list(self._buffers)
        else:
            ids = {id(p) for p in module.parameters()}
            mods = {id(m) for m in module.modules()}
            params = [k for k in self._params if k in ids]
            buffers = [k for k in self._buffers if k[0] in mods]
        for key in params:
            param, data, fields = self._params.pop(key)
            param.data = data
            for name, value in fields.items():
                setattr(param, name, value)
                self._placed.pop(id(value), None)
        for bkey in buffers:
            owner, buf = self._buffers.pop(bkey)
            owner._buffers[bkey[1]] = buf
            self._placed.pop(id(buf), None)
