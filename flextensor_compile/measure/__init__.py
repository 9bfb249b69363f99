"""Measurement: per-trap compute time (timed or roofline), the copy-rate curve, the target table.

Modules: `clock` (CUDA events / perf_counter), `timing` (median per trap after warm-up),
`bandwidth` (copy-rate curves), `targets` (built-in GPUs, torch-free), `roofline` (estimates),
`device` (which device a plan is made for and how its times are obtained). Names are exported
lazily so that reading the target table does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DeviceChoice", "GpuTarget", "Timing", "choose_device", "get_target",
           "measure_compute", "roofline_ms", "target_names"]  # fmt: skip

_EXPORTS = {
    "DeviceChoice": "device", "choose_device": "device",
    "GpuTarget": "targets", "get_target": "targets", "target_names": "targets",
    "Timing": "timing", "measure_compute": "timing",
    "roofline_ms": "roofline",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
