"""Roofline estimate of each trap's compute time on a target GPU, for planning without that GPU.

Owns the formula (documented in docs/compile.md):
    compute_ms = max(flops / peak_bf16_flops, weight_bytes / hbm_bytes_per_s) * 1e3
where `flops` are the trap's FLOPs per iteration counted by torch's FlopCounterMode during the
discovery forward (matmuls, convolutions, attention), `weight_bytes` the bytes of the tensors the
trap owns (read once per call; for a gap trap, the untrapped weights read during it, such as an
LM head), and the peaks come from the target table. Element-wise work is not counted: the
estimate is a lower bound that is tight for weight-heavy layers.
Must not know: clocks, the solver, how FLOPs were counted.
"""

from __future__ import annotations

from flextensor_compile.discover import Discovery
from flextensor_compile.measure.targets import GpuTarget

__all__ = ["roofline_ms"]


def roofline_ms(discovery: Discovery, target: GpuTarget) -> dict[str, float]:
    """Estimated compute time per slot (trap or gap) on `target`, in milliseconds."""
    out: dict[str, float] = {}
    for slot in discovery.plan.order:
        flops = discovery.flops.get(slot, 0.0)
        calls = discovery.plan.calls.get(slot, 1)
        weight_bytes = discovery.weight_bytes(slot) * calls
        seconds = max(flops / target.peak_bf16_flops, weight_bytes / target.hbm_bytes_per_s)
        out[slot] = seconds * 1e3
    return out
