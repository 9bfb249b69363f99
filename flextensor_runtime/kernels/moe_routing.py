"""Routing layout for the Triton MoE: routes grouped by expert into fixed-size row blocks.

Owns: turning selected_experts [T, K] into `sorted_routes` (route ids t * K + k grouped by
expert, each expert's group padded to a multiple of `block_m` with the sentinel T * K) and
`block_expert` (the expert of each row block; E marks a block of invalid routes, E + 1 an
unused block), all with device ops and no host sync. Also owns workspace buffer reuse.
Must not know: Triton or what the experts compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RouteBlocks", "align_routes", "max_blocks", "take_buffer"]


@dataclass(frozen=True)
class RouteBlocks:
    sorted_routes: torch.Tensor  # int64 [n_blocks * block_m]; sentinel = T * K
    block_expert: torch.Tensor  # int64 [n_blocks]; E = invalid routes, E + 1 = unused
    block_m: int


def max_blocks(n_routes: int, n_experts: int, block_m: int) -> int:
    """Upper bound on row blocks: each group pads by < block_m and a used block has a route."""
    return min(n_routes, -(-n_routes // block_m) + n_experts + 1)


def take_buffer(
    workspace: dict[str, torch.Tensor],
    key: str,
    numel: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A flat buffer of at least `numel` elements from `workspace`, grown (and stored) if needed."""
    buf = workspace.get(key)
    # an inference tensor (made under inference_mode) cannot be written outside it
    stale = buf is not None and buf.is_inference() and not torch.is_inference_mode_enabled()
    if stale or buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        workspace[key] = buf
    return buf.view(-1)[:numel]


def align_routes(
    selected_experts: torch.Tensor,
    n_experts: int,
    block_m: int,
    workspace: dict[str, torch.Tensor],
) -> RouteBlocks:
    """Group routes by expert into blocks of `block_m` rows (see module docstring)."""
    flat = selected_experts.reshape(-1).to(torch.int64)  # [R], R = T * K
    n_routes = flat.numel()
    device = flat.device
    valid = (flat >= 0) & (flat < n_experts)
    group = torch.where(valid, flat, n_experts)  # invalid routes form group E
    order = torch.argsort(group, stable=True)  # [R] route ids grouped by expert
    # counts by scatter-add: bincount reads the input's min and max back to the host on CUDA
    counts = torch.zeros(n_experts + 1, dtype=torch.int64, device=device).scatter_add_(
        0, group, torch.ones_like(group)
    )  # [E + 1]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_start = torch.cumsum(padded, 0) - padded
    group_start = torch.cumsum(counts, 0) - counts
    sorted_group = group[order]
    rank = torch.arange(n_routes, device=device) - group_start[sorted_group]
    n_blocks = max_blocks(n_routes, n_experts, block_m)
    routes = take_buffer(workspace, "sorted_routes", n_blocks * block_m, torch.int64, device)
    routes.fill_(n_routes)
    routes.scatter_(0, pad_start[sorted_group] + rank, order)
    block_end = torch.cumsum(padded // block_m, 0)  # [E + 1]
    block_expert = take_buffer(workspace, "block_expert", n_blocks, torch.int64, device)
    torch.searchsorted(
        block_end, torch.arange(n_blocks, device=device), right=True, out=block_expert
    )
    return RouteBlocks(routes, block_expert, block_m)
