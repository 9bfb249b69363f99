"""Benchmark problems for the fused kernels: sizes, inputs, and the bytes/flops they must move.

Owns: the real (GPU) and smoke (CPU interpreter) sizes and the minimum memory traffic of each
op, from which achieved bandwidth is computed. Must not know: timing or reporting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flextensor_runtime.kernels import (
    layer_norm_scale_shift,
    residual_gate_add,
    routed_swiglu_moe,
    routed_swiglu_moe_pytorch,
)

__all__ = ["Case", "build_cases"]


@dataclass(frozen=True)
class Case:
    """One op at one size: callables for each variant and the traffic they must move."""

    name: str
    size: str
    reference: Callable[[], torch.Tensor]
    triton: Callable[[], torch.Tensor]
    min_bytes: int  # bytes every implementation must read + write at least
    flops: int  # 0 for memory-bound ops


@dataclass(frozen=True)
class Sizes:
    rows_b: int  # DiT batch
    rows_t: int  # tokens per sample
    rows_d: int  # hidden size
    moe_tokens: tuple[int, ...]  # token counts (prefill, decode)
    moe_experts: int
    moe_top_k: int
    moe_hidden: int
    moe_inter: int


REAL = Sizes(1, 4096, 3072, (4096, 32), 8, 2, 4096, 14336)  # FLUX-like block, Mixtral-like MoE
SMOKE = Sizes(2, 8, 64, (16, 2), 4, 2, 32, 64)


def _rows_cases(s: Sizes, dtype: torch.dtype, device: torch.device) -> list[Case]:
    x = torch.randn(s.rows_b, s.rows_t, s.rows_d, dtype=dtype, device=device)
    update = torch.randn_like(x)
    scale, shift, gate = (
        torch.randn(s.rows_b, s.rows_d, dtype=dtype, device=device) * 0.1 for _ in range(3)
    )
    elt = x.element_size()
    size = f"{s.rows_b}x{s.rows_t}x{s.rows_d} {str(dtype).removeprefix('torch.')}"
    return [
        Case(
            "layer_norm_scale_shift",
            size,
            lambda: layer_norm_scale_shift(x, scale, shift, backend="torch"),
            lambda: layer_norm_scale_shift(x, scale, shift, backend="triton"),
            (2 * x.numel() + 2 * scale.numel()) * elt,
            0,
        ),
        Case(
            "residual_gate_add",
            size,
            lambda: residual_gate_add(x, update, gate, backend="torch"),
            lambda: residual_gate_add(x, update, gate, backend="triton"),
            (3 * x.numel() + gate.numel()) * elt,
            0,
        ),
    ]


def _moe_case(s: Sizes, tokens: int, dtype: torch.dtype, device: torch.device) -> Case:
    e, d, i = s.moe_experts, s.moe_hidden, s.moe_inter
    hidden = torch.randn(tokens, d, dtype=dtype, device=device)
    gate, up = (torch.randn(e, i, d, dtype=dtype, device=device) * d**-0.5 for _ in range(2))
    down = torch.randn(e, d, i, dtype=dtype, device=device) * i**-0.5
    logits = torch.randn(tokens, e, device=device)
    weights, experts = torch.topk(torch.softmax(logits, dim=-1), s.moe_top_k, dim=-1)
    workspace: dict[str, torch.Tensor] = {}
    args = (hidden, weights, experts, gate, up, down)
    experts_hit = int(torch.unique(experts).numel())
    elt = hidden.element_size()
    return Case(
        "routed_swiglu_moe",
        f"T={tokens} E={e} top{s.moe_top_k} D={d} I={i} {str(dtype).removeprefix('torch.')}",
        lambda: routed_swiglu_moe_pytorch(*args),
        lambda: routed_swiglu_moe(*args, workspace=workspace, allow_triton=True),
        (3 * experts_hit * i * d + 2 * tokens * d) * elt,
        2 * 3 * tokens * s.moe_top_k * d * i,
    )


def build_cases(smoke: bool, dtype: torch.dtype, device: torch.device) -> list[Case]:
    sizes = SMOKE if smoke else REAL
    cases = _rows_cases(sizes, dtype, device)
    cases += [_moe_case(sizes, tokens, dtype, device) for tokens in sizes.moe_tokens]
    return cases
