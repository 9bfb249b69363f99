"""Benchmark models and profiles: a deep stack of small blocks (overhead), a wide stack
(memory). Profiles come from the test planner until `ftc profile` is wired in."""

from __future__ import annotations

import torch
from torch import nn

from flextensor_runtime.profile import Profile


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    """`depth` blocks in a ModuleList (what block-level group offloading expects)."""

    def __init__(self, depth: int, dim: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def stack(depth: int, dim: int, seed: int = 0) -> Stack:
    torch.manual_seed(seed)
    return Stack(depth, dim).eval().requires_grad_(False)


def stack_profile(model: Stack, streamed: bool, num_blocks: int = 2, prefetch: int = 1) -> Profile:
    from tests.runtime.plans import build_profile  # the test planner, until `ftc` is wired in

    names = [f"blocks.{i}" for i in range(len(model.blocks))]
    return build_profile(model, names, streamed=None if streamed else [], num_blocks=num_blocks,
                         prefetch=prefetch)  # fmt: skip
