"""Small example models for runtime tests: ties, inner tensor fields, buffers, repeated calls."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flextensor_runtime.model_tensors import inner_fields


class ScaledLinear(nn.Linear):
    """A linear whose weight carries an inner tensor field `weight.scale` (FP8-style)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.weight.scale = torch.rand(n_out, 1) + 0.5  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * self.weight.scale, self.bias)  # type: ignore[attr-defined]


class MlpBlock(nn.Module):
    def __init__(self, dim: int, scaled: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = ScaledLinear(dim, 2 * dim) if scaled else nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.register_buffer("gain", torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding tied to the output head, a stack of blocks, a final norm."""

    def __init__(self, vocab: int = 64, dim: int = 32, depth: int = 4, scaled: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            MlpBlock(dim, scaled=scaled and i % 2 == 0) for i in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class SharedBlockNet(nn.Module):
    """One block applied twice per forward (a trap with calls=2), then a head."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.shared = MlpBlock(dim)
        self.mid = MlpBlock(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(self.inp(x))
        x = self.shared(self.mid(x))
        return self.out(x)


def tiny_lm(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM().eval()


def tiny_llama() -> nn.Module:
    """A transformers LlamaForCausalLM of two layers (dim 64, vocab 128), random weights, head
    not tied to the embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def on_cuda(model: nn.Module) -> nn.Module:
    """`model` on the GPU, inner tensor fields too: `Module.cuda()` keeps each Parameter object
    (it swaps the data), so a field such as `weight.scale` would stay on the host."""
    model.cuda()
    for param in model.parameters():
        for name, value in inner_fields(param):
            setattr(param, name, value.cuda())
    return model


def block_names(model: TinyLM) -> list[str]:
    return ["embed", *(f"blocks.{i}" for i in range(len(model.blocks))), "norm", "head"]
