"""Fused kernels for DiT and MoE blocks: Triton forward kernels with exact PyTorch references.

Owns: `layer_norm_scale_shift` (affine-free LayerNorm + AdaLN scale/shift), `residual_gate_add`
(`residual + update * gate`) and the token-routed SwiGLU mixture of experts
(`routed_swiglu_moe`, with `routed_swiglu_moe_pytorch` as its portable reference).
Triton is optional: it is imported only when a Triton kernel actually runs.
Must not know: offloading, profiles, or any model class.
"""

from __future__ import annotations

from flextensor_runtime.kernels.gate import residual_gate_add
from flextensor_runtime.kernels.moe import routed_swiglu_moe, routed_swiglu_moe_pytorch
from flextensor_runtime.kernels.norm import layer_norm_scale_shift

__all__ = [
    "layer_norm_scale_shift",
    "residual_gate_add",
    "routed_swiglu_moe",
    "routed_swiglu_moe_pytorch",
]
