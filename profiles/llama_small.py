"""A transformers LlamaForCausalLM with a small config and random (seeded) weights.

    ftc profile profiles/llama_small.py --mem-fraction 0.9 -o llama.msgpack

`run` is the real workload: `generate` with two new tokens, i.e. a prefill forward then one
decode forward with the KV cache; each forward is one iteration of the plan.
"""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def example_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 256, (1, 16), generator=generator)}


def run(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # type: ignore[operator]
