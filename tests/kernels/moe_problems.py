"""Random routed-MoE problems for the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from tests.kernels.tensors import DTYPES, make

# Triton vs reference in the same dtype: both round the SwiGLU activations to the input dtype;
# the Triton path keeps the down projection in fp32 where the reference rounds it once more.
MOE_TOLERANCE = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
}


@dataclass(frozen=True)
class MoeCase:
    hidden: torch.Tensor  # [T, D] or [B, S, D]
    routing_weights: torch.Tensor  # [T, K] float32
    selected_experts: torch.Tensor  # [T, K] int64
    gate: torch.Tensor  # [E, I, D]
    up: torch.Tensor  # [E, I, D]
    down: torch.Tensor  # [E, D, I]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.hidden,
            self.routing_weights,
            self.selected_experts,
            self.gate,
            self.up,
            self.down,
        )

    def to(self, device: torch.device | str) -> MoeCase:
        return MoeCase(*(t.to(device) for t in self.args()))


def build_case(
    tokens: int,
    top_k: int,
    experts: int,
    hidden: int,
    inter: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    layout: str = "contiguous",
    used_experts: int | None = None,
    fused_gate_up: bool = False,
) -> MoeCase:
    """A problem whose routes only use experts [0, used_experts); weights are scaled to O(1)."""
    gen = torch.Generator().manual_seed(seed)
    x = make((tokens, hidden), dtype, seed, layout)
    scale_in, scale_out = hidden**-0.5, inter**-0.5
    if fused_gate_up:  # gate/up as halves of one [E, 2I, D] tensor (non-contiguous views)
        gate_up = (make((experts, 2 * inter, hidden), torch.float32, seed + 1) * scale_in).to(dtype)
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
    else:
        gate = (make((experts, inter, hidden), torch.float32, seed + 1) * scale_in).to(dtype)
        up = (make((experts, inter, hidden), torch.float32, seed + 2) * scale_in).to(dtype)
    down = (make((experts, hidden, inter), torch.float32, seed + 3) * scale_out).to(dtype)
    n_used = experts if used_experts is None else used_experts
    selected = torch.randint(0, n_used, (tokens, top_k), generator=gen)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    if layout == "transposed":  # routing weights as a [K, T] buffer seen through .T
        weights = weights.T.contiguous().T
    return MoeCase(x, weights, selected, gate, up, down)


@st.composite
def moe_cases(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = DTYPES) -> MoeCase:
    experts = draw(st.integers(1, 5))
    return build_case(
        tokens=draw(st.integers(0, 12)),
        top_k=draw(st.integers(1, 3)),
        experts=experts,
        hidden=draw(st.integers(1, 40)),
        inter=draw(st.integers(1, 40)),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**16)),
        layout=draw(st.sampled_from(("contiguous", "strided", "transposed"))),
        used_experts=draw(st.integers(1, experts)),
        fused_gate_up=draw(st.booleans()),
    )
