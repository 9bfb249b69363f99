"""`AutoWrappedLinear`: a Linear whose weights move through the VRAM lifecycle stages.

Owns: the Linear's weight/bias as managed parameters (with their inner tensor fields, which
follow them through every transition; the GEMM itself does not read them; a parameter written
on the wrapper is moved to the stored placement), disk loading of
`name.weight` / `name.bias`, the dense or FP8 GEMM, and LoRA on the output.
Must not know: how modules are chosen for wrapping (see `enable`), profile files.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flextensor_runtime.errors import ConfigError, VramManagementError
from flextensor_runtime.vram.autotorch import AutoTorchModule
from flextensor_runtime.vram.fp8 import fp8_matmul, is_float8
from flextensor_runtime.vram.lora import LoraAdapter, LoraMerger, apply_loras, check_adapter
from flextensor_runtime.vram.placement import DeviceLike, Placement
from flextensor_runtime.vram.tensor_slots import replace_parameters
from flextensor_runtime.vram.wrapper_init import check_options, initial_placement

__all__ = ["AutoWrappedLinear"]

# nn.Module's per-instance forward hook registries (what `register_forward_(pre_)hook` fills)
_FORWARD_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


class AutoWrappedLinear(AutoTorchModule):
    """Linear-layer wrapper with staged placement, disk loading, FP8, and LoRA support.

    The wrapped Linear's `weight`/`bias` parameters are reused (not copied) and the wrapper
    starts offloaded. Options in `kwargs`: `memory_reader` (see `AutoTorchModule`) and
    `fp8_backend` ("auto", "scaled_mm" or "dequantize"). A float8 placement dtype applies to
    the weight only; the bias keeps its dtype.
    """

    def __init__(
        self,
        module: nn.Linear,
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
        if not isinstance(module, nn.Linear):
            raise ConfigError(
                f"AutoWrappedLinear wraps an nn.Linear, got {type(module).__name__}: map this "
                "class to AutoWrappedModule in module_map"
            )
        if type(module).forward is not nn.Linear.forward:
            cls = type(module).__name__
            raise ConfigError(
                f"AutoWrappedLinear runs nn.Linear's own computation, but {cls} overrides forward "
                f"(what it adds would be skipped): map {cls} to AutoWrappedModule in module_map, "
                "listed before nn.Linear"
            )
        check_options(kwargs)
        super().__init__(
            offload_dtype, offload_device, onload_dtype, onload_device,
            preparing_dtype, preparing_device, computation_dtype, computation_device,
            vram_limit, kwargs.get("memory_reader"),
        )  # fmt: skip
        self.in_features = module.in_features
        self.out_features = module.out_features
        self.weight = module.weight
        self.bias = module.bias
        self.name = name
        self.disk_map = disk_map
        self.fp8_backend: str = kwargs.get("fp8_backend", "auto")
        self.loras: list[LoraAdapter] = []
        self.lora_merger: LoraMerger | None = None
        self._take_hooks(module)
        self.stored = initial_placement(self._managed(), disk_map, name, self.stages)
        self.offload()

    def __setattr__(self, name: str, value: Any) -> None:
        """A parameter written on the wrapper once it holds its weights (`wrapper.weight =
        nn.Parameter(t)`, `wrapper.bias = ...`) is moved to the stored placement first (kept as
        the same object when it is there already), as `AutoWrappedModule` does, so forwards and
        transitions find it where `stored` says; refused on the disk tier, where it would be
        ignored. Anything else is set as on any module."""
        stored: Placement | None = self.__dict__.get("stored")
        if isinstance(value, nn.Parameter) and stored is not None:
            if stored.on_disk:
                self._refuse_disk_write(name, value, f"on AutoWrappedLinear {self.name!r}")
            value = self._placed(name, value)
        super().__setattr__(name, value)

    def _take_hooks(self, module: nn.Linear) -> None:
        """The wrapper replaces `module`: its forward hooks (a pre-hook that scales the input,
        a hook capturing activations) and its train/eval mode carry over. The hook dicts are
        shared, not copied, so the handles their callers hold still remove them."""
        for attr in _FORWARD_HOOK_DICTS:
            if attr in module.__dict__:
                object.__setattr__(self, attr, module.__dict__[attr])
        self.training = module.training

    def _managed_root(self) -> nn.Module:
        return self

    def _placement_dtype(self, name: str, placement: Placement) -> torch.dtype | None:
        if name == "bias" and is_float8(placement.dtype):
            return None
        return placement.dtype

    def load_from_disk(
        self, torch_dtype: torch.dtype | None, device: DeviceLike, assign: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Fetch `name.weight` / `name.bias` from the disk map at `torch_dtype` on `device`.

        `assign=True` is a transition: `stored` becomes `torch_dtype`/`device` and `state`
        follows it (2 at the computation placement, 0 at the offload placement, else 1).
        `assign=False` returns the tensors without mutating this module, so a temporary compute
        copy leaves the stored weights on meta (and `stored` and `state` as they were).
        """
        target = Placement.on(torch_dtype, device)
        tensors = self._with_fields(self._load_disk(target), target)
        if assign:
            replace_parameters(self, tensors, recurse=False)
            self.stored = target
            self._settle_state()
        return tensors["weight"], tensors.get("bias")

    def computation(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return weight/bias at compute placement without permanently leaving the state."""
        tensors = self.compute_tensors()
        return tensors["weight"], tensors.get("bias")

    def fp8_linear(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Row-wise scaled FP8 matmul via `torch._scaled_mm` (or the dequantise path)."""
        assert self.computation_dtype is not None
        return fp8_matmul(input, weight, bias, self.computation_dtype, self.fp8_backend)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """Dense GEMM, or the FP8 scaled path when `computation_dtype` is float8."""
        if is_float8(self.computation_dtype):
            return self.fp8_linear(x, weight, bias)
        try:
            return F.linear(x, weight, bias)
        except (RuntimeError, TypeError):
            self._explain_input(x, weight)  # raises when the input is the cause
            raise

    def _explain_input(self, x: torch.Tensor, weight: torch.Tensor) -> None:
        """After a failed GEMM (never on the fast path): a one-line error naming this module when
        the input's width, dtype or device is the cause, instead of torch's from deep inside."""
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise VramManagementError(
                f"AutoWrappedLinear {self.name!r} got input {got}; pass a tensor [..., "
                f"{self.in_features}]"
            )
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise VramManagementError(
                f"AutoWrappedLinear {self.name!r} got a {x.dtype} input but computes in "
                f"{weight.dtype}; cast the input to {weight.dtype} or set computation_dtype"
            )
        if x.device != weight.device:
            raise VramManagementError(
                f"AutoWrappedLinear {self.name!r} got an input on {x.device} but computes on "
                f"{weight.device}; move the input to {weight.device}"
            )

    def add_lora(self, lora_A: torch.Tensor, lora_B: torch.Tensor, scale: float = 1.0) -> None:
        """Attach an adapter: A [r, in_features], B [out_features, r], delta x·Aᵀ·Bᵀ·scale."""
        tensors = isinstance(lora_A, torch.Tensor) and isinstance(lora_B, torch.Tensor)
        number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
        if not tensors or not number:
            raise ConfigError(
                f"add_lora got A {type(lora_A).__name__}, B {type(lora_B).__name__}, scale "
                f"{scale!r}; pass two 2-D tensors and a number"
            )
        adapter = LoraAdapter(lora_A.detach(), lora_B.detach(), float(scale))
        check_adapter(adapter, self.in_features, self.out_features)
        device = self.stages.computation.torch_device()  # moved once, not on every forward
        self.loras.append(replace(adapter, lora_A=adapter.lora_A.to(device),
                                  lora_B=adapter.lora_B.to(device)))  # fmt: skip

    def clear_loras(self) -> None:
        self.loras.clear()

    def lora_forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Add LoRA deltas after the base linear so merge order matches PEFT (B @ A)."""
        return apply_loras(x, out, self.loras, self.lora_merger)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Promote when VRAM allows, run the Linear, then apply LoRA on the output."""
        self.promote_if_room()
        weight, bias = self.computation()
        return self.lora_forward(x, self.linear(x, weight, bias))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"name={self.name!r}, state={self.state}, stored={self.stored}"
        )
