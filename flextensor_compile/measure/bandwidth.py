"""Host-to-device copy rate as a curve: timed copies at several sizes, with a per-copy latency.

Owns: on a GPU, timing pinned-host -> device copies (CUDA events, median of several copies per
size); without one, timing host memory copies between two separate buffers (what the CPU
backend of the runtime does instead of DMA). Both give points (bytes, bytes/s), the rate at the
largest size, and a per-copy latency fitted from the smallest copy (GPU: the median sample; host:
the fastest, timed on one thread, so another process holding a core does not make copies look
1000x slower). By default each sample times
one copy on its own; `queued=N` times N copies issued back to back and counts a Nth of that,
the cost of a copy that waits behind others (a busy copy engine: what a schedule limited by its
copies sees, where a copy's fixed costs may overlap the copy before it).
Must not know: models, traps, the solver.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import BandwidthPoint

__all__ = ["CopyCurve", "measure_cuda_copies", "measure_host_copies"]

_CUDA_SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)
_HOST_SIZES = (1 << 18, 1 << 22, 1 << 25)
_REPEATS = 5
_HOST_REPEATS = 9


@dataclass(frozen=True)
class CopyCurve:
    """Measured copy rates: the curve, the large-copy rate and the fixed cost per copy."""

    points: tuple[BandwidthPoint, ...]
    bytes_per_s: float
    latency_ms: float


def _curve(times_s: dict[int, float]) -> CopyCurve:
    points = tuple(BandwidthPoint(n, n / max(t, 1e-9)) for n, t in sorted(times_s.items()))
    rate = points[-1].bytes_per_s
    smallest = points[0].bytes
    latency_s = max(0.0, times_s[smallest] - smallest / rate)
    return CopyCurve(points, rate, latency_s * 1e3)


def _check_queued(queued: int) -> None:
    if isinstance(queued, bool) or not isinstance(queued, int) or queued < 1:
        raise ConfigError(f"queued={queued!r}: pass the number of copies a sample times (>= 1)")


def measure_cuda_copies(device: torch.device, max_bytes: int | None = None,
                        queued: int = 1) -> CopyCurve:  # fmt: skip
    """Pinned host -> `device` copies at sizes up to 256 MiB (or `max_bytes`); each sample
    times `queued` copies back to back (per copy: a `queued`-th of it)."""
    _check_queued(queued)
    free_bytes, _ = torch.cuda.mem_get_info(device)
    limit = min(max_bytes or _CUDA_SIZES[-1], free_bytes // 4)
    times: dict[int, float] = {}
    for size in (s for s in _CUDA_SIZES if s <= max(limit, _CUDA_SIZES[0])):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=True)  # warm-up
        samples = []
        for _ in range(_REPEATS):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(queued):
                dev.copy_(host, non_blocking=True)
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3 / queued)
        times[size] = statistics.median(samples)
        del host, dev
    return _curve(times)


def measure_host_copies(queued: int = 1) -> CopyCurve:
    """Host memory copies between separate buffers (the emulated device's copy engine); each
    sample times `queued` copies back to back (per copy: a `queued`-th of it)."""
    _check_queued(queued)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a copy split over threads waits for every core: one busy core
    try:  # elsewhere made a 256 KiB copy take milliseconds
        return _curve(_host_times(queued))
    finally:
        torch.set_num_threads(threads)


def _host_times(queued: int) -> dict[int, float]:
    times: dict[int, float] = {}
    for size in _HOST_SIZES:
        src = torch.ones(size, dtype=torch.uint8)
        dst = torch.empty(size, dtype=torch.uint8)
        dst.copy_(src)
        samples = []
        for _ in range(_HOST_REPEATS):
            t0 = time.perf_counter()
            for _ in range(queued):
                dst.copy_(src)
            samples.append((time.perf_counter() - t0) / queued)
        times[size] = min(samples)  # the least: a copy that waited for a core measures load
    return times
