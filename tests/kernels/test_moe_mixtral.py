"""routed_swiglu_moe reproduces a real transformers Mixtral sparse MoE block."""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

from flextensor_runtime.kernels import routed_swiglu_moe


def _block() -> MixtralSparseMoeBlock:
    config = MixtralConfig(
        hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2
    )
    block = MixtralSparseMoeBlock(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():  # expert weights are created uninitialised
            param.copy_(torch.randn(param.shape, generator=gen) * param.shape[-1] ** -0.5)
    return block


def _packed_weights(block: MixtralSparseMoeBlock, inter: int) -> tuple[torch.Tensor, ...]:
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):  # transformers >= 5: [E, 2I, D] and [E, D, I]
        fused = experts.gate_up_proj
        return fused[:, :inter], fused[:, inter:], experts.down_proj
    stacked = [torch.stack([getattr(e, name).weight for e in experts]) for name in ("w1", "w3")]
    return stacked[0], stacked[1], torch.stack([e.w2.weight for e in experts])


def _route(block: MixtralSparseMoeBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    router = block.gate
    if isinstance(router, torch.nn.Linear):  # transformers 4.x: routing inside the block
        probs = torch.softmax(router(x).float(), dim=-1)
        weights, experts = torch.topk(probs, block.top_k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), experts
    _, weights, experts = router(x)
    return weights, experts


@pytest.mark.parametrize("allow_triton", [False, True])
def test_matches_mixtral_sparse_moe_block(allow_triton: bool, kernel_device) -> None:
    block = _block()
    hidden = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = block(hidden)
        expected = expected[0] if isinstance(expected, tuple) else expected
        weights, experts = _route(block, hidden.reshape(-1, 32))
        gate, up, down = _packed_weights(block, inter=48)
        args = (hidden, weights, experts, gate, up, down)
        out = routed_swiglu_moe(*(t.to(kernel_device) for t in args), allow_triton=allow_triton)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
