"""A diffusers FluxTransformer2DModel (double- and single-stream blocks) with a small config.

    ftc profile profiles/flux_small.py --mem-fraction 0.8 -o flux.msgpack

The default include picks both repeated block stacks. Weights are random but seeded.
"""

from __future__ import annotations

import torch
from torch import nn

TOKENS = 16
TEXT_TOKENS = 8


def build_model() -> nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=4, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
        axes_dims_rope=(4, 6, 6),
    ).eval()  # fmt: skip


def example_inputs() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, TOKENS, 8, generator=g),
        "encoder_hidden_states": torch.randn(1, TEXT_TOKENS, 32, generator=g),
        "pooled_projections": torch.randn(1, 16, generator=g),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(TOKENS, 3),
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
        "return_dict": False,
    }
