"""Measurement: per-trap compute time (timed or roofline), the copy-rate curve, the target table.

Modules: `clock` (CUDA events / perf_counter), `timing` (median per trap after warm-up),
`bandwidth` (copy-rate curves), `targets` (built-in GPUs), `roofline` (estimates), `device`
(which device a plan is made for and how its times are obtained).
"""

from flextensor_compile.measure.device import DeviceChoice, choose_device
from flextensor_compile.measure.roofline import roofline_ms
from flextensor_compile.measure.targets import GpuTarget, get_target, target_names, targets
from flextensor_compile.measure.timing import Timing, measure_compute

__all__ = ["DeviceChoice", "GpuTarget", "Timing", "choose_device", "get_target",
           "measure_compute", "roofline_ms", "target_names", "targets"]  # fmt: skip
