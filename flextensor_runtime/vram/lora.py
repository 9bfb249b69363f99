"""LoRA adapters applied on the activation after a wrapped Linear's base GEMM.

Owns: the adapter list of one Linear and its delta, in PEFT's order: out + (x·Aᵀ)·Bᵀ·scale per
adapter, summed, or handed stacked to a `lora_merger` for blends that are not a plain sum.
Must not know: placements, FP8 or disk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flextensor_runtime.errors import ConfigError

__all__ = ["LoraAdapter", "LoraMerger", "apply_loras", "check_adapter"]

# (base output [..., N], stacked deltas [n_adapters, ..., N]) -> merged output [..., N]
LoraMerger = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: A [r, in_features], B [out_features, r], and its scale (alpha / r)."""

    lora_A: torch.Tensor
    lora_B: torch.Tensor
    scale: float = 1.0


def check_adapter(adapter: LoraAdapter, in_features: int, out_features: int) -> None:
    a, b = adapter.lora_A, adapter.lora_B
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape[0] != out_features:
        raise ConfigError(
            f"LoRA shapes A{tuple(a.shape)} B{tuple(b.shape)} do not fit a Linear "
            f"{in_features}->{out_features}: need A [r, {in_features}] and B [{out_features}, r]"
        )
    if a.shape[0] != b.shape[1]:
        raise ConfigError(
            f"LoRA rank mismatch: A has rank {a.shape[0]}, B has rank {b.shape[1]}; use equal ranks"
        )


def _delta(x: torch.Tensor, adapter: LoraAdapter) -> torch.Tensor:
    a = adapter.lora_A.to(device=x.device, dtype=x.dtype)
    b = adapter.lora_B.to(device=x.device, dtype=x.dtype)
    return (x @ a.t()) @ b.t() * adapter.scale  # [..., r] -> [..., N]


def apply_loras(
    x: torch.Tensor,
    out: torch.Tensor,
    adapters: list[LoraAdapter],
    merger: LoraMerger | None = None,
) -> torch.Tensor:
    """Add the adapters' deltas to the base output `out` (or merge them with `merger`)."""
    if not adapters:
        return out
    deltas = [_delta(x, adapter).to(out.dtype) for adapter in adapters]
    if merger is not None:
        return merger(out, torch.stack(deltas))
    for delta in deltas:
        out = out + delta
    return out
