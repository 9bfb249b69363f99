"""A small decoder-only transformer: the bundled example for `ftc profile` and `make demo`.

    ftc profile profiles/tiny_transformer.py --mem-fraction 0.6 -o tiny.msgpack

Model file contract (see docs/compile.md): `build_model()` returns the model, `example_inputs()`
its forward's arguments, `run(model, inputs)` one iteration of the real workload (here a prefill
then two greedy decode steps). Weights are random but seeded, so every build is identical.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 512
DIM = 128
HEADS = 4
LAYERS = 6
SEQ = 32


class Block(nn.Module):
    """Pre-norm attention + MLP block."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # [B, H, T, D/H]
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    """Token embedding, a stack of blocks, final norm, LM head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(1, 4 * SEQ, DIM))
        self.blocks = nn.ModuleList(Block(DIM, HEADS) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [B, T] -> logits [B, T, V]
        x = self.embed(ids) + self.pos[:, : ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyTransformer().eval()


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB, (1, SEQ), generator=generator),)


def run(model: nn.Module, inputs: tuple[torch.Tensor]) -> torch.Tensor:
    """Prefill, then two greedy decode steps (three forwards: three iterations)."""
    (ids,) = inputs
    with torch.no_grad():
        for _ in range(3):
            logits = model(ids)
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids
