"""Independent naive computations the references are checked against (float64, explicit loops).

Written without the kernels' reference code paths: no F.layer_norm, no expert grouping.
"""

from __future__ import annotations

import torch


def naive_layer_norm_scale_shift(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float
) -> torch.Tensor:
    """float64 LayerNorm from explicit sums; scale/shift already broadcastable to x."""
    xd = x.double()
    d = x.shape[-1]
    mean = xd.sum(dim=-1, keepdim=True) / d
    var = ((xd - mean) ** 2).sum(dim=-1, keepdim=True) / d
    return (xd - mean) / torch.sqrt(var + eps) * (1 + scale.double()) + shift.double()


def naive_moe(
    hidden: torch.Tensor,  # [T, D]
    routing_weights: torch.Tensor,  # [T, K]
    selected_experts: torch.Tensor,  # [T, K]
    gate: torch.Tensor,  # [E, I, D]
    up: torch.Tensor,  # [E, I, D]
    down: torch.Tensor,  # [E, D, I]
) -> torch.Tensor:
    """float64 SwiGLU MoE, one token and one route at a time (differentiable)."""
    n_t, n_k = selected_experts.shape
    rows = []
    for t in range(n_t):
        x = hidden[t].double()
        row = torch.zeros(hidden.shape[-1], dtype=torch.float64)
        for k in range(n_k):
            e = int(selected_experts[t, k])
            g = gate[e].double() @ x
            u = up[e].double() @ x
            h = g / (1 + torch.exp(-g)) * u
            row = row + routing_weights[t, k].double() * (down[e].double() @ h)
        rows.append(row)
    return torch.stack(rows) if rows else torch.zeros(0, hidden.shape[-1], dtype=torch.float64)
