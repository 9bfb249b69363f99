"""Which device a plan is made for, and how compute times are obtained for it.

Owns the rules: `--target NAME` -> the built-in table, compute times from the roofline (no
timing forwards); a meta-device model needs a target; a CUDA GPU (when present and allowed) ->
its memory and a measured pinned-copy curve, CUDA-event timing; otherwise timing on the CPU, and
unless `--device-memory` / `--bandwidth` say otherwise an emulated device whose memory equals
the model's weight bytes and whose copy rate is the measured host copy rate (a note says which
figures were given and which stand in, unless both were given).
Must not know: models, traps, the solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flextensor_compile.config import OffloadConfig
from flextensor_compile.measure.bandwidth import measure_cuda_copies, measure_host_copies
from flextensor_compile.measure.targets import GpuTarget, get_target
from flextensor_compile.units import format_bytes, format_rate
from flextensor_runtime.errors import BackendUnavailableError, ConfigError
from flextensor_runtime.profile import DeviceSpec

__all__ = ["DeviceChoice", "choose_device"]


@dataclass(frozen=True)
class DeviceChoice:
    """The planned-for device, where timing runs (None: roofline, no timing forwards), and why."""

    spec: DeviceSpec
    measure_on: torch.device | None
    timing_source: str  # measured-cuda | measured-cpu | roofline
    target: GpuTarget | None = None
    note: str | None = None


def _cuda(config: OffloadConfig) -> DeviceChoice:
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    curve = measure_cuda_copies(device)
    spec = DeviceSpec(
        name=props.name,
        memory_bytes=config.device_memory_bytes or int(props.total_memory),
        h2d_bytes_per_s=config.h2d_bytes_per_s or curve.bytes_per_s,
        h2d_latency_ms=curve.latency_ms,
        bandwidth_curve=() if config.h2d_bytes_per_s else curve.points,
        kind="cuda",
    )
    return DeviceChoice(spec, device, "measured-cuda")


def _cpu(config: OffloadConfig, weight_bytes: int) -> DeviceChoice:
    curve = None if config.h2d_bytes_per_s else measure_host_copies()
    rate = config.h2d_bytes_per_s or (curve.bytes_per_s if curve else 0.0)
    emulated = config.device_memory_bytes is None
    spec = DeviceSpec(
        name="emulated" if emulated else "custom",
        memory_bytes=config.device_memory_bytes or max(weight_bytes, 1),
        h2d_bytes_per_s=rate,
        h2d_latency_ms=curve.latency_ms if curve else 0.0,
        bandwidth_curve=curve.points if curve else (),
        kind="emulated" if emulated else "cpu",
    )
    return DeviceChoice(spec, torch.device("cpu"), "measured-cpu", note=_cpu_note(config, spec))


def _cpu_note(config: OffloadConfig, spec: DeviceSpec) -> str | None:
    """What the plan's device is made of when nothing times on a GPU: the memory (the model's
    weight bytes, or `--device-memory`) and the copy rate (`--bandwidth`, or the host's own
    copies, which are no GPU's link); None when both were given."""
    given = config.h2d_bytes_per_s is not None
    if given and config.device_memory_bytes is not None:
        return None
    why = "timing on the CPU (--device cpu)" if torch.cuda.is_available() else "no GPU"
    rate = format_rate(spec.h2d_bytes_per_s)
    copies = (
        f"copies at {rate} (--bandwidth)" if given else f"copies at {rate} (host memory copies)"
    )
    if config.device_memory_bytes is None:
        fix = "--device-memory" if given else "--device-memory and --bandwidth"
        return (f"{why} and no --target: planning for an emulated device with "
                f"{format_bytes(spec.memory_bytes)} (the model's weight bytes) and {copies}; "
                f"pass --target, or {fix}, to plan for a real GPU")  # fmt: skip
    return (f"{why} and no --target: planning for {format_bytes(spec.memory_bytes)} of device "
            f"memory (--device-memory) and {copies}; pass "
            "--bandwidth with the GPU's host-to-device rate, e.g. 24GB/s, or --target")  # fmt: skip


def choose_device(config: OffloadConfig, weight_bytes: int, meta: bool) -> DeviceChoice:
    """Resolve the device section and the timing method for this compilation."""
    if config.target is not None:
        target = get_target(config.target)
        spec = target.device_spec(config.device_memory_bytes, config.h2d_bytes_per_s)
        return DeviceChoice(spec, None, "roofline", target)
    if meta:
        raise ConfigError(
            "the model has weights on the meta device (all or some of them), so nothing can be "
            "timed; pass --target NAME to estimate compute times with the roofline, or build "
            "every layer with real weights"
        )
    cuda_ok = torch.cuda.is_available()
    if config.device == "cuda" and not cuda_ok:
        raise BackendUnavailableError(
            "device 'cuda' was requested but torch sees no CUDA device; use --target NAME or "
            "drop the device option"
        )
    if cuda_ok and config.device != "cpu":
        return _cuda(config)
    return _cpu(config, weight_bytes)
