"""Roofline compute times for the plan-quality instances (documented, not measured).

A trap's time is the larger of its math time and its memory time, plus a fixed launch overhead:
    compute_ms = max(flops / (PEAK_FLOPS * MFU), bytes_moved / (HBM_BYTES_PER_S * HBM_EFF)) + 0.01
with an H100-class accelerator: 989 TFLOP/s dense bf16 at 60% utilisation, 3.35 TB/s HBM at 80%.
`bytes_moved` is the trap's weight bytes plus the activations and KV cache it reads and writes.
"""

from __future__ import annotations

PEAK_FLOPS = 989e12
MFU = 0.6
HBM_BYTES_PER_S = 3.35e12
HBM_EFF = 0.8
LAUNCH_MS = 0.01

__all__ = ["LAUNCH_MS", "trap_ms", "work_ms"]


def work_ms(flops: float, bytes_moved: float) -> float:
    """The larger of the math time and the memory time, without the launch overhead."""
    math_ms = flops / (PEAK_FLOPS * MFU) * 1e3
    memory_ms = bytes_moved / (HBM_BYTES_PER_S * HBM_EFF) * 1e3
    return max(math_ms, memory_ms)


def trap_ms(flops: float, bytes_moved: float) -> float:
    return work_ms(flops, bytes_moved) + LAUNCH_MS
