"""Small real torch models that exercise each discovery rule (no mocks)."""

from __future__ import annotations

import torch
from torch import nn

DIM = 8


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("scale", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x)))) * self.scale


class Stack(nn.Module):
    """embed -> layers (a repeated ModuleList) -> head; the head can be tied to the embedding."""

    def __init__(self, n: int = 3, tie: bool = False, vocab: int = 20) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(n))
        self.extra = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU())  # not repeated: not default
        self.unused = nn.Linear(DIM, DIM)  # never called
        self.head = nn.Linear(DIM, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.forwards = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.extra(x))


def stack_inputs() -> tuple[torch.Tensor]:
    return (torch.arange(6).view(1, 6) % 20,)


class Shared(nn.Module):
    """One block called twice back to back, another called around a third block."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = self.layers
        x = a(a(x))  # back-to-back repeat
        x = b(x)
        x = c(x)
        return b(x)  # b again, after c: not back to back


class Conditional(nn.Module):
    """layers.2 runs only on the first call of each run (e.g. a prefill-only module)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x = self.layers[0](x)
        if self.calls % 2 == 1:
            x = self.layers[2](x)
        return self.layers[1](x)


def run_twice(model: nn.Module, inputs: tuple[torch.Tensor]) -> torch.Tensor:
    model(*inputs)
    return model(*inputs)


class PeekBlock(Block):
    """A block whose code reads a tensor owned elsewhere, held through a plain (non-module) list."""

    def __init__(self, other: nn.Module, attr: str) -> None:
        super().__init__()
        self.other = [other]
        self.attr = attr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = getattr(self.other[0], self.attr)
        return super().forward(x) * extra[: x.shape[-1]].sum(-1)[:DIM]


class CrossRead(nn.Module):
    """layers.1 reads layers.0's fc1 weight (a cross-trap read); the root's `gate` is read only
    by layers.2's code (it moves with layers.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.ones(DIM, DIM))
        first = Block()
        self.layers = nn.ModuleList(
            [first, PeekBlock(first.fc1, "weight"), PeekBlock(self, "gate")]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class ScaledLinear(nn.Linear):
    """A linear layer whose weight carries an inner tensor field `weight.scale` (as FP8 does)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, dim)
        self.weight.scale = torch.full((1,), 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.weight.scale, self.bias)


class Fp8Like(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ScaledLinear(DIM) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def x_inputs() -> tuple[torch.Tensor]:
    return (torch.ones(2, DIM),)
