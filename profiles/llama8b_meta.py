"""A Llama-3-8B-shaped model built on the meta device: no weights are allocated, so a machine
without a GPU (or the RAM for 16 GB of weights) can plan it for a target GPU.

    ftc profile profiles/llama8b_meta.py --target h100-pcie --mem-fraction 0.15 -o llama8b.msgpack

Compute times come from the roofline (see docs/compile.md). The workload is one 2048-token
prefill forward (a meta-device workload must not read tensor values, so no `generate`).
"""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    )  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(1, 2048, dtype=torch.long)}
