"""The built-in table of common GPUs that `--target NAME` plans for without the GPU present.

Owns: per target the memory size, a typical pinned host-to-device copy rate over PCIe, a
per-copy latency, the peak dense bf16 tensor-core FLOP/s and the device memory bandwidth (the two
roofline ceilings). Figures are nominal datasheet values (dense, no sparsity) and typical
measured pinned PCIe rates; docs/compile.md lists them.
Must not know: torch, models, how a plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import DeviceSpec

__all__ = ["GpuTarget", "get_target", "target_names", "targets"]

_GIB = 2**30


@dataclass(frozen=True)
class GpuTarget:
    """One GPU model as the planner sees it."""

    name: str
    description: str
    memory_bytes: int
    h2d_bytes_per_s: float  # typical pinned host-to-device copy rate
    h2d_latency_ms: float  # fixed cost per copy
    peak_bf16_flops: float  # dense tensor-core FLOP/s
    hbm_bytes_per_s: float  # device memory bandwidth

    def device_spec(
        self, memory_bytes: int | None = None, h2d_bytes_per_s: float | None = None
    ) -> DeviceSpec:
        """The profile's device section for this target (optionally overriding memory/bandwidth)."""
        return DeviceSpec(
            name=self.name,
            memory_bytes=memory_bytes or self.memory_bytes,
            h2d_bytes_per_s=h2d_bytes_per_s or self.h2d_bytes_per_s,
            h2d_latency_ms=self.h2d_latency_ms,
            kind="target",
        )


_TABLE = (
    GpuTarget("rtx4090", "GeForce RTX 4090 24 GB, PCIe 4.0 x16",
              24 * _GIB, 25e9, 0.010, 165e12, 1008e9),
    GpuTarget("a100-40g", "A100 40 GB (SXM4 or PCIe), PCIe 4.0 host link",
              40 * _GIB, 25e9, 0.010, 312e12, 1555e9),
    GpuTarget("a100-80g", "A100 80 GB SXM4, PCIe 4.0 host link",
              80 * _GIB, 25e9, 0.010, 312e12, 2039e9),
    GpuTarget("h100-pcie", "H100 80 GB PCIe, PCIe 5.0 x16",
              80 * _GIB, 50e9, 0.008, 756e12, 2000e9),
    GpuTarget("h100-sxm", "H100 80 GB SXM5, PCIe 5.0 host link",
              80 * _GIB, 50e9, 0.008, 989e12, 3350e9),
    GpuTarget("h200", "H200 141 GB SXM, PCIe 5.0 host link",
              141 * 10**9, 50e9, 0.008, 989e12, 4800e9),
    GpuTarget("l4", "L4 24 GB, PCIe 4.0 x16",
              24 * 10**9, 24e9, 0.010, 121e12, 300e9),
)  # fmt: skip


def targets() -> tuple[GpuTarget, ...]:
    """Every built-in target, in table order."""
    return _TABLE


def target_names() -> tuple[str, ...]:
    """The names `--target` accepts."""
    return tuple(t.name for t in _TABLE)


def get_target(name: str) -> GpuTarget:
    """Look a target up by name (case-insensitive)."""
    for t in _TABLE:
        if t.name == name.lower():
            return t
    import difflib

    close = difflib.get_close_matches(name.lower(), target_names(), n=1, cutoff=0.4)
    hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(target_names())}"
    raise ConfigError(f"unknown target {name!r}; {hint}")
