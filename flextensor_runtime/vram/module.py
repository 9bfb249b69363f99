"""`AutoWrappedModule` and `AutoWrappedNonRecurseModule`: arbitrary modules in the VRAM lifecycle.

Owns: managing all parameters of a subtree (or only a module's direct ones), keeping buffers
resident at the computation device, disk materialisation and meta placeholders, compute copies
(swapped in for one call, or cloned; each carries its parameter's inner tensor fields, moved as
`field_moves` says), and attribute reads and writes falling through to the wrapped module
(a parameter written through the wrapper is moved to the stored placement).
Must not know: how modules are chosen for wrapping (see `enable`), Linear specifics.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.autotorch import STATE_OFFLOADED, AutoTorchModule
from flextensor_runtime.vram.field_moves import fields_at, with_fields
from flextensor_runtime.vram.fp8 import is_float8
from flextensor_runtime.vram.placement import DISK, DeviceLike, Placement
from flextensor_runtime.vram.tensor_slots import (
    managed_parameters,
    replace_parameters,
    swapped_parameters,
)
from flextensor_runtime.vram.wrapper_init import check_checkpoint, check_options, initial_placement

__all__ = ["AutoWrappedModule", "AutoWrappedNonRecurseModule"]


class AutoWrappedModule(AutoTorchModule):
    """Wrap an arbitrary module with staged CPU/GPU/disk weight movement.

    Every parameter of the subtree is managed; buffers are moved once to the computation
    device (floating ones cast to the computation dtype) and stay resident. A forward promotes
    when `vram_limit` allows, then runs the module directly when the stored placement is the
    computation placement, or with computation copies swapped in for that call only. Attribute
    reads, writes and deletions fall through to the wrapped module, except the wrapper's own.
    """

    def __init__(
        self,
        module: nn.Module,
        offload_dtype: torch.dtype | None = None,
        offload_device: DeviceLike | None = None,
        onload_dtype: torch.dtype | None = None,
        onload_device: DeviceLike | None = None,
        preparing_dtype: torch.dtype | None = None,
        preparing_device: DeviceLike | None = None,
        computation_dtype: torch.dtype | None = None,
        computation_device: DeviceLike | None = None,
        vram_limit: float | None = None,
        name: str = "",
        disk_map: Any = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise ConfigError(
                f"{type(self).__name__} wraps an nn.Module, got {type(module).__name__}: pass "
                "the module to manage"
            )
        check_options(kwargs)
        if is_float8(computation_dtype):
            raise ConfigError(
                f"computation_dtype={computation_dtype} is only supported by AutoWrappedLinear: "
                "wrap this module class with a float computation dtype"
            )
        super().__init__(
            offload_dtype, offload_device, onload_dtype, onload_device,
            preparing_dtype, preparing_device, computation_dtype, computation_device,
            vram_limit, kwargs.get("memory_reader"),
        )  # fmt: skip
        self.module = module
        self.training = module.training  # the wrapper stands where the module stood
        self.name = name
        self.disk_map = disk_map
        self._settle_buffers()
        self.stored = initial_placement(self._managed(), disk_map, name, self.stages)
        if self.stored is None:  # nothing to manage: always at computation placement
            self.stored = self.stages.computation
        self.offload()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self._modules.get("module")
            if module is None:
                raise
            return getattr(module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """A write of one of the wrapper's own attributes stays on the wrapper; any other goes
        to the wrapped module, as reads do (a flag, a submodule, a parameter), so the module
        sees it. A parameter is moved to the stored placement first (see `_write_through`)."""
        module = self.__dict__.get("_modules", {}).get("module")
        if module is None or self._owns(name):
            super().__setattr__(name, value)
        else:
            self._write_through(module, name, value)

    def __delattr__(self, name: str) -> None:
        module = self._modules.get("module")
        if module is None or self._owns(name):
            super().__delattr__(name)
        else:
            delattr(module, name)

    def _owns(self, name: str) -> bool:
        """Whether `name` is the wrapper's own: set on it (its options, `state`, `stored`,
        `module`), or defined by its class (methods such as `forward`, properties)."""
        own = (self.__dict__, self._parameters, self._buffers, self._modules)
        return any(name in d for d in own) or hasattr(type(self), name)

    def _write_through(self, module: nn.Module, name: str, value: Any) -> None:
        """Set `name` on the wrapped module. A parameter (or a submodule, whose parameters the
        wrapper manages too) is moved to the stored placement, so forwards and transitions see
        it where they expect the managed weights; refused on the disk tier, whose weights are
        read from the disk map at each use and would ignore it."""
        if not isinstance(value, (nn.Parameter, nn.Module)):
            setattr(module, name, value)
            if isinstance(value, torch.Tensor) and name in module._buffers:
                self._settle_buffers()
            return
        assert self.stored is not None
        if self.stored.on_disk and self._managed():
            where = f"through the wrapper of {self.name or type(module).__name__!r}"
            self._refuse_disk_write(name, value, where)
        if isinstance(value, nn.Parameter):
            value = self._placed(name, value)
        had, previous = hasattr(module, name), getattr(module, name, None)
        setattr(module, name, value)
        try:
            self._settle_parameters()
            self._settle_buffers()
        except BaseException:  # e.g. a meta parameter: the module keeps what it had
            if had:
                setattr(module, name, previous)
            else:
                delattr(module, name)
            raise

    def _settle_parameters(self) -> None:
        """Move the managed parameters that are not at the stored placement there."""
        moved = self._moved(self._managed())
        if moved:
            replace_parameters(self.module, moved, self._recurse_params)

    def _managed_root(self) -> nn.Module:
        return self.module

    def _settle_buffers(self) -> None:
        """Move real buffers to the computation device; they are never offloaded."""
        target = self.stages.computation
        device = target.torch_device()
        holders = self.module.modules() if self._recurse_params else [self.module]
        for holder in holders:
            for key, buf in holder._buffers.items():
                if buf is None or buf.device.type == "meta":
                    continue
                cast = buf.is_floating_point() and target.dtype is not None
                holder._buffers[key] = buf.to(device, target.dtype if cast else buf.dtype)

    def _move_stored(self, target: Placement) -> None:
        if self.stored is not None and not self._managed():
            return  # no parameters: placement never changes
        super()._move_stored(target)

    # -- reference methods ----------------------------------------------------------------
    def load_from_disk(
        self, torch_dtype: torch.dtype | None, device: DeviceLike, copy_module: bool = False
    ) -> nn.Module:
        """Materialize disk-backed parameters onto `device`; buffers stay resident.

        Non-persistent buffers cannot be rebuilt from a state dict and are never replaced.
        In place (the default) this is a transition: `stored` becomes `dtype`/`device` and
        `state` follows it (2 at the computation placement, 0 at the offload placement, else 1).
        `copy_module=True` returns a clone so the stored module, `stored` and `state` stay.
        """
        target = Placement.on(torch_dtype, device)
        tensors = self._with_fields(self._load_disk(target), target)
        if copy_module:
            return self._clone_with(tensors)
        replace_parameters(self.module, tensors, self._recurse_params)
        self.stored = target
        self._settle_state()
        return self.module

    def offload_to_disk(self, model: nn.Module) -> None:
        """Replace disk-backed parameters of `model` with meta placeholders, retaining buffers.

        For the stored module (`self.module`, or the wrapper itself) this is a transition: the
        weights go to the disk tier, `stored` becomes it and `state` 0, so the next forward or
        transition reads them back through `disk_map`. It is refused, before anything changes,
        when they could not be read back (no `disk_map`, or one without these tensors). Any
        other module (a clone from `computation()` or `load_from_disk(copy_module=True)`) only
        has its parameters replaced; the wrapper is untouched.
        """
        if model is self or model is self.module:
            self._drop_to_disk()
            return
        params = managed_parameters(model, self._recurse_params)
        stored = {id(p) for p in self._managed().values()}
        if any(id(p) in stored for p in params.values()):
            raise ConfigError(
                f"offload_to_disk: {type(model).__name__} shares weights with the stored module "
                f"of {self.name or type(self).__name__!r} but is not that module, so only part of "
                "them would be dropped; pass the wrapper's module (wrapper.module) or a clone"
            )
        fields = fields_at(params, None)  # the disk tier: real fields wait in host memory
        meta = {n: with_fields(torch.empty_like(p, device="meta"), p, fields)
                for n, p in params.items()}  # fmt: skip
        replace_parameters(model, meta, self._recurse_params)

    def _drop_to_disk(self) -> None:
        """Move the stored weights to the disk tier (a disk stage's placement, if one is)."""
        managed = self._managed()
        if not managed:
            return  # nothing to drop: the placement never changes
        if not callable(getattr(self.disk_map, "load", None)):
            raise ConfigError(
                f"offload_to_disk: module {self.name!r} has no disk_map, so its weights could "
                "never be read back; pass disk_map=DiskMap(checkpoint, device) to the wrapper "
                "(or enable_vram_management), or use offload()"
            )
        check_checkpoint(managed, self.disk_map, self.name)
        stages = (self.stages.offload, self.stages.onload, self.stages.preparing)
        self._move_stored(next((s for s in stages if s.on_disk), Placement(None, DISK)))
        self.state = STATE_OFFLOADED

    def cast_to(self, weight: Any, dtype: torch.dtype | None, device: DeviceLike) -> Any:
        """A tensor: copy it. A module: a clone at `dtype`/`device` (inner tensor fields go to
        `device` in their own dtype); the stored one is untouched."""
        if not isinstance(weight, nn.Module):
            return super().cast_to(weight, dtype, device)
        params = managed_parameters(weight, self._recurse_params)
        fields = fields_at(params, torch.device(device))
        tensors = {n: with_fields(super(AutoWrappedModule, self).cast_to(p.detach(), dtype, device),
                                  p, fields) for n, p in params.items()}  # fmt: skip
        return _clone_module(weight, params, tensors)

    def computation(self) -> nn.Module:
        """Return a module at compute placement without permanently leaving the current state.

        Reuses `self.module` when the placement already matches; otherwise a clone.
        """
        if self.holds(self.stages.computation):
            return self.module
        return self._clone_with(self.compute_tensors())

    def _clone_with(self, tensors: dict[str, torch.Tensor]) -> nn.Module:
        return _clone_module(self.module, self._managed(), tensors)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Promote to preparing when VRAM headroom allows, then run at computation placement."""
        self.promote_if_room()
        if self.holds(self.stages.computation):
            return self.module(*args, **kwargs)
        with swapped_parameters(self.module, self.compute_tensors(), self._recurse_params):
            return self.module(*args, **kwargs)


class AutoWrappedNonRecurseModule(AutoWrappedModule):
    """Manage only a module's direct parameters while its children are wrapped separately.

    Its compute path swaps computation copies of the direct parameters in place for one call
    and never deep-copies the module (disk-backed children hold open checkpoint readers).
    """

    _recurse_params = False

    def cast_to(self, weight: Any, dtype: torch.dtype | None, device: DeviceLike) -> Any:
        """A module is returned unchanged: the architecture owns parameter casts."""
        if isinstance(weight, nn.Module):
            return weight
        return super().cast_to(weight, dtype, device)

    def computation(self) -> nn.Module:
        """Materialize the direct parameters in place at computation placement (keep)."""
        self.keep()
        return self.module


def _clone_module(
    module: nn.Module, params: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]
) -> nn.Module:
    """Deep-copy `module` with `tensors` in place of `params` (the old tensors are not copied;
    a parameter in `tensors` is used as it is, with the inner tensor fields it carries)."""
    memo: dict[int, Any] = {
        id(params[n]): t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
        for n, t in tensors.items()
    }
    return copy.deepcopy(module, memo)
