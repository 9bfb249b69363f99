"""The lifecycle state machine shared by every VRAM wrapper.

Owns: the four stage placements, `state` (0 offloaded, 1 onloaded, 2 kept at computation
placement), moving the managed parameters between placements (copies, or DiskMap loads and meta
placeholders for the disk tier) with their inner tensor fields (the rule is `field_moves`'),
temporary compute tensors, and the `vram_limit` check.
Must not know: what the wrapped module computes (subclasses own forward), profile files.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError, VramManagementError
from flextensor_runtime.vram.field_moves import (
    carried_fields,
    fields_at,
    fields_placed,
    with_fields,
)
from flextensor_runtime.vram.placement import (
    DeviceLike,
    MemoryReader,
    Placement,
    StagePlacements,
    TorchMemoryReader,
    limit_bytes,
    resolve_stages,
)
from flextensor_runtime.vram.tensor_slots import managed_parameters, replace_parameters
from flextensor_runtime.vram.tied_moves import MoveKey, moved_before, record_move

__all__ = ["AutoTorchModule"]

STATE_OFFLOADED = 0
STATE_ONLOADED = 1
STATE_KEPT = 2


class AutoTorchModule(nn.Module):
    """Base state machine for modules that move between memory tiers.

    `state` is 0 while offloaded, 1 while onloaded (first or second prefetch stage) and 2 while
    kept at the computation placement. `stored` is the placement that holds the managed
    parameters now. Omitted stage dtypes/devices default to the computation ones. `vram_limit`
    is in GiB of accelerator memory used by this process (read through `memory_reader`, a
    `MemoryReader`; inject one to fake a reading). `vram_limit=None` never promotes.
    """

    _recurse_params = True  # subclasses that manage only direct parameters set False
    offload_dtype: torch.dtype | None
    offload_device: str
    onload_dtype: torch.dtype | None
    onload_device: str
    preparing_dtype: torch.dtype | None
    preparing_device: str
    computation_dtype: torch.dtype | None
    computation_device: str

    def __init__(
        self,
        offload_dtype: torch.dtype | None = None,
        offload_device: DeviceLike | None = None,
        onload_dtype: torch.dtype | None = None,
        onload_device: DeviceLike | None = None,
        preparing_dtype: torch.dtype | None = None,
        preparing_device: DeviceLike | None = None,
        computation_dtype: torch.dtype | None = None,
        computation_device: DeviceLike | None = None,
        vram_limit: float | None = None,
        memory_reader: MemoryReader | None = None,
    ) -> None:
        super().__init__()
        self.set_dtype_and_device(
            offload_dtype, offload_device, onload_dtype, onload_device,
            preparing_dtype, preparing_device, computation_dtype, computation_device,
            vram_limit,
        )  # fmt: skip
        self.state = STATE_OFFLOADED
        self.name = ""
        self.disk_map: Any = None
        self.memory_reader: MemoryReader = memory_reader or TorchMemoryReader()
        self.stored: Placement | None = None  # set by the subclass once it holds its weights

    def set_dtype_and_device(
        self,
        offload_dtype: torch.dtype | None = None,
        offload_device: DeviceLike | None = None,
        onload_dtype: torch.dtype | None = None,
        onload_device: DeviceLike | None = None,
        preparing_dtype: torch.dtype | None = None,
        preparing_device: DeviceLike | None = None,
        computation_dtype: torch.dtype | None = None,
        computation_device: DeviceLike | None = None,
        vram_limit: float | None = None,
    ) -> None:
        """Update lifecycle placement, defaulting omitted stages to computation placement."""
        bad = isinstance(vram_limit, bool) or not isinstance(vram_limit, (int, float, type(None)))
        if bad or (vram_limit is not None and not vram_limit >= 0):  # type: ignore[operator]
            raise ConfigError(
                f"vram_limit={vram_limit!r} is invalid; pass the device memory limit in GiB "
                "(a number >= 0) or None"
            )
        stages = resolve_stages(
            offload_dtype, offload_device, onload_dtype, onload_device,
            preparing_dtype, preparing_device, computation_dtype, computation_device,
        )  # fmt: skip
        self.stages: StagePlacements = stages
        for stage in ("offload", "onload", "preparing", "computation"):
            placement: Placement = getattr(stages, stage)
            setattr(self, f"{stage}_dtype", placement.dtype)
            setattr(self, f"{stage}_device", placement.device)
        self.vram_limit = vram_limit

    # -- single tensors -------------------------------------------------------------------
    def cast_to(
        self, weight: torch.Tensor, dtype: torch.dtype | None, device: DeviceLike
    ) -> torch.Tensor:
        """Copy one tensor to `dtype` and `device` without mutating the source."""
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ConfigError(
                f"cast_to dtype must be a torch.dtype, got {dtype!r} ({type(dtype).__name__}); "
                "pass e.g. torch.bfloat16"
            )
        if dtype is None or not weight.is_floating_point():
            dtype = weight.dtype
        out = torch.empty_like(weight, dtype=dtype, device=device)
        out.copy_(weight, non_blocking=weight.is_pinned())
        return out

    def check_free_vram(self, required_bytes: int = 0) -> bool:
        """Return whether this process's accelerator usage plus `required_bytes` stays below
        `vram_limit`; False when no limit is set (there is nothing to promote into)."""
        if self.vram_limit is None:
            return False
        device = self.stages.computation.torch_device()
        used = self.memory_reader.used_bytes(device)
        return used + required_bytes < limit_bytes(self.vram_limit)

    def holds(self, wanted: Placement) -> bool:
        """Whether the stored parameters already are at `wanted` (a None dtype: any dtype)."""
        return self.stored is not None and self.stored.satisfies(wanted)

    def param_name(self, name: str) -> str:
        """Return the fully qualified checkpoint key for a local parameter name."""
        return f"{self.name}.{name}" if self.name else name

    # -- managed parameters (subclasses choose the root) ----------------------------------
    def _managed_root(self) -> nn.Module:
        raise VramManagementError(
            f"{type(self).__name__} manages no module: AutoTorchModule is the base state "
            "machine; use AutoWrappedLinear or AutoWrappedModule, or override _managed_root"
        )

    def _managed(self) -> dict[str, torch.Tensor]:
        return managed_parameters(self._managed_root(), self._recurse_params)

    def _placement_dtype(self, name: str, placement: Placement) -> torch.dtype | None:
        """The dtype a managed tensor takes at `placement` (subclasses may exempt tensors)."""
        return placement.dtype

    def _materialize(
        self, target: Placement, names: Collection[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Managed tensors (those in `names`, default all) as new tensors at `target`; the
        stored ones are left untouched."""
        assert self.stored is not None and not target.on_disk
        device = target.torch_device()
        if self.stored.on_disk:
            return self._load_disk(target, names)
        managed = self._managed()
        return {
            n: self.cast_to(managed[n].detach(), self._placement_dtype(n, target), device)
            for n in (managed if names is None else names)
        }

    def _load_disk(
        self, target: Placement, names: Collection[str] | None = None
    ) -> dict[str, torch.Tensor]:
        if self.disk_map is None:
            raise VramManagementError(
                f"module {self.name!r} is on the disk tier but has no disk_map: pass disk_map= "
                "to enable_vram_management or the wrapper"
            )
        device = target.torch_device()
        return {
            n: self.disk_map.load(self.param_name(n), self._placement_dtype(n, target), device)
            for n in (self._managed() if names is None else names)
        }

    def _read_field(
        self, name: str, attr: str, inner: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        """A meta inner tensor field of managed parameter `name`, read from the disk map (key
        `<parameter key>.<attr>`) on `device` in the field's own dtype."""
        if self.disk_map is None:
            raise VramManagementError(
                f"module {self.name!r}: inner tensor field {self.param_name(name)}.{attr} is on "
                "the meta device and there is no disk_map: pass disk_map= so it can be read"
            )
        dtype = inner.dtype if inner.is_floating_point() else None
        return self.disk_map.load(f"{self.param_name(name)}.{attr}", dtype, device)

    def _with_fields(
        self, tensors: dict[str, torch.Tensor], target: Placement, pin: bool = False
    ) -> dict[str, torch.Tensor]:
        """`tensors` (new versions of managed parameters, by name) as parameters that carry
        those parameters' inner tensor fields at `target`, in their own dtype (`field_moves`)."""
        managed = self._managed()
        params = {n: managed[n] for n in tensors}
        device = None if target.on_disk else target.torch_device()
        copies = fields_at(params, device, pin, self._read_field)
        return {n: with_fields(t.detach(), params[n], copies) for n, t in tensors.items()}

    def _in_place(self, target: Placement) -> bool:
        """Whether the stored parameters, already at `target`, need no new copies: pinned where
        `_pin_host` wants (else every per-call copy to the GPU is a synchronous one) and with
        their inner tensor fields beside them (`Module.to()` leaves fields where they were)."""
        managed = self._managed()
        pin = self._pin_host(target)
        if pin and not all(p.is_pinned() for p in managed.values()):
            return False
        host = torch.device("cpu")
        return fields_placed(managed, host if target.on_disk else target.torch_device(), pin)

    def _move_stored(self, target: Placement) -> None:
        """Make `target` the placement of the stored parameters (no-op when already there)."""
        if self.holds(target):
            if not self._in_place(target):
                managed = self._managed()
                self._replace_stored(target, lambda names: {n: managed[n] for n in names})
            return
        if self.stored is None and not self._managed():  # nothing to move (base: raises)
            return
        if target.on_disk:
            managed = self._managed()
            self._replace_stored(
                target,
                lambda names: {n: torch.empty_like(managed[n], device="meta") for n in names},
            )
        else:
            self._replace_stored(target, lambda names: self._materialize(target, names))
        self.stored = target

    def _replace_stored(
        self, target: Placement, make: Callable[[list[str]], dict[str, torch.Tensor]]
    ) -> None:
        """Replace the stored parameters with their versions at `target`, made by `make(names)`
        (pinned where `_pin_host`), each carrying its inner tensor fields moved with it; a
        parameter a tied wrapper already moved to the same placement takes that wrapper's new
        parameter, so ties hold and nothing is copied twice."""
        pin = self._pin_host(target)
        managed = self._managed()
        keys = {
            n: MoveKey.of(p, self._placement_dtype(n, target), target.device, pin)
            for n, p in managed.items()
        }
        new: dict[str, torch.Tensor] = {}
        for name, param in managed.items():
            shared = moved_before(param, keys[name])
            if shared is not None:
                new[name] = shared
        made: dict[str, torch.Tensor] = {}
        for name, tensor in make([n for n in managed if n not in new]).items():
            tensor = tensor.detach()
            made[name] = tensor.pin_memory() if pin and not tensor.is_pinned() else tensor
        for name, moved in self._with_fields(made, target, pin).items():
            assert isinstance(moved, nn.Parameter)
            record_move(managed[name], keys[name], moved)
            new[name] = moved
        replace_parameters(self._managed_root(), new, self._recurse_params)

    def _pin_host(self, target: Placement) -> bool:
        """Host placements are pinned when computing on CUDA, so per-call copies are async."""
        computes_on_cuda = self.stages.computation.device.startswith("cuda")
        return target.device == "cpu" and computes_on_cuda and torch.cuda.is_available()

    def _placed(self, name: str, param: nn.Parameter) -> nn.Parameter:
        """`param` at the stored placement: itself when it is there already, else a copy."""
        return self._moved({name: param}).get(name, param)

    def _moved(self, params: Mapping[str, torch.Tensor]) -> dict[str, nn.Parameter]:
        """Copies at the stored placement of those of `params` (by managed name) that are not
        there (device, dtype where the placement sets one, pinned where `_pin_host`)."""
        target = self.stored
        assert target is not None and not target.on_disk
        device, pin = target.torch_device(), self._pin_host(target)
        made: dict[str, torch.Tensor] = {}
        for n, p in params.items():
            dtype = self._placement_dtype(n, target)
            exact = dtype is None or not p.is_floating_point() or p.dtype == dtype
            if str(p.device) == target.device and exact and (p.is_pinned() or not pin):
                continue
            copy_ = self.cast_to(p.detach(), dtype, device)
            made[n] = copy_.pin_memory() if pin and not copy_.is_pinned() else copy_
        if not made:
            return {}
        fields = fields_at({n: params[n] for n in made}, device, pin, self._read_field)
        return {n: with_fields(t, params[n], fields) for n, t in made.items()}

    def _refuse_disk_write(self, name: str, value: object, where: str) -> None:
        """A parameter (or a submodule) written while the weights are on the disk tier would
        be ignored (each use reads the disk map): a `ConfigError` naming the fix."""
        raise ConfigError(
            f"setting {name!r} {where}: its weights are on the disk tier, read from its "
            f"disk_map at each use, so a new {type(value).__name__} would be ignored; call "
            "wrapper.load_from_disk(dtype, device) first to take them off the disk tier, or "
            "write the weights into the checkpoint"
        )

    def compute_tensors(self) -> dict[str, torch.Tensor]:
        """Managed tensors at computation placement: the stored ones when already there,
        otherwise a temporary copy, as parameters that carry their inner tensor fields (the
        stored placement and `state` do not change)."""
        target = self.stages.computation
        if self.holds(target):
            return self._managed()
        return self._with_fields(self._materialize(target), target)

    def stored_bytes_at(self, target: Placement) -> int:
        """Bytes the managed parameters, and their inner tensor fields (in their own dtype),
        would occupy at `target`."""
        total = 0
        fields: dict[int, torch.Tensor] = {}
        for name, p in self._managed().items():
            dtype = self._placement_dtype(name, target) or p.dtype
            itemsize = dtype.itemsize if p.is_floating_point() else p.element_size()
            total += p.numel() * itemsize
            fields.update((id(inner), inner) for _, inner in carried_fields(p))
        return total + sum(f.numel() * f.element_size() for f in fields.values())

    # -- transitions ----------------------------------------------------------------------
    def _settle_state(self) -> None:
        """`state` for where the stored weights are after a move outside the four transitions
        (`load_from_disk` in place): 2 at the computation placement, 0 on the disk tier or at
        the offload placement, else 1 (out of the resting tier, not yet at computation)."""
        assert self.stored is not None
        if self.holds(self.stages.computation):
            self.state = STATE_KEPT
        elif self.stored.on_disk or self.holds(self.stages.offload):
            self.state = STATE_OFFLOADED
        else:
            self.state = STATE_ONLOADED

    def offload(self) -> None:
        """Move managed parameters to the inactive placement and set state 0."""
        self._move_stored(self.stages.offload)
        self.state = STATE_OFFLOADED

    def onload(self) -> None:
        """Move managed parameters to the first prefetch placement and set state 1."""
        self._move_stored(self.stages.onload)
        self.state = STATE_ONLOADED

    def preparing(self) -> None:
        """Second-stage prefetch: move to the preparing placement (materializing only when
        leaving disk); state 2 when that is the computation placement, else 1."""
        self._move_stored(self.stages.preparing)
        self.state = STATE_KEPT if self.holds(self.stages.computation) else STATE_ONLOADED

    def keep(self) -> None:
        """Keep managed parameters at computation placement and set state 2."""
        self._move_stored(self.stages.computation)
        self.state = STATE_KEPT

    def promote_if_room(self) -> None:
        """Promote to the preparing placement when `vram_limit` leaves room for it; otherwise
        stay where the weights are (the caller then computes from a temporary copy)."""
        target = self.stages.preparing
        if self.vram_limit is None or target.on_disk:
            return
        if self.holds(target) or self.holds(self.stages.computation):
            return
        if self.check_free_vram(self.stored_bytes_at(target)):
            self.preparing()
