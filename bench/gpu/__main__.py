"""`python -m bench.gpu [--smoke]`: offloaded vs resident latency, copy/compute overlap and peak
device memory of a ~1 GB fp16 stack at 30/50/70% weight budgets, next to diffusers group
offloading with streams; then the measured host-to-device copy curve (rate per copy size, as a
fraction of the largest copy's) next to the curve the plan-quality suite assumes
(`bench.plan_quality.instances.device`), which a run on a real GPU calibrates: `--curve-out FILE`
saves the measured curve for `python -m bench.plan_quality --copy-curve FILE` (run anywhere).
The curve is measured twice: each copy timed on its own, and `QUEUED` copies issued back to back
(per copy a `QUEUED`-th: a busy copy engine, where a copy's fixed costs may overlap the one
before); the second is saved beside FILE as `queued_path(FILE)` (`h2d_curve_queued.json`).
`--curve-only` measures only the curves (what settles the plan-quality suite's copy model),
`--no-curve` skips them. `--smoke` runs a tiny model on the CPU (checks the script works).
Finishes in well under 5 minutes on one GPU."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.runtime.models import Stack, stack
from flextensor_compile.measure.bandwidth import CopyCurve
from flextensor_runtime.backend import CpuBackend, CudaBackend, DeviceBackend
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.profile import Profile


@dataclass(frozen=True)
class Setup:
    device: str
    depth: int
    dim: int
    tokens: int
    dtype: torch.dtype
    iters: int


FULL = Setup("cuda", 32, 4096, 2048, torch.float16, 20)  # 32 x 32 MiB = 1 GiB of weights
SMOKE = Setup("cpu", 8, 128, 16, torch.float32, 5)
QUEUED = 8  # copies per sample of the queued curve


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time_ms(fn: Callable[[], object], s: Setup) -> float:
    fn()
    _sync(s.device)
    times = []
    for _ in range(s.iters):
        t0 = time.perf_counter()
        fn()
        _sync(s.device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _peak_bytes(s: Setup, backend: DeviceBackend | None = None) -> int:
    if s.device == "cuda":
        return torch.cuda.max_memory_allocated()
    return backend.peak_held_bytes if backend is not None else 0


def _reset_peak(s: Setup) -> None:
    if s.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _model(s: Setup) -> Stack:
    return stack(s.depth, s.dim).to(s.dtype)


def budget_profile(model: Stack, fraction: float) -> Profile:
    """Stream the fewest leading layers so resident + 2 blocks fit `fraction` of the weights."""
    from tests.runtime.plans import build_profile  # the test planner, until `ftc` is wired in

    layer = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    total = layer * len(model.blocks)
    streamed = min(
        len(model.blocks), max(2, math.ceil((total * (1 - fraction) + 2 * layer) / layer))
    )
    names = [f"blocks.{i}" for i in range(len(model.blocks))]
    return build_profile(model, names, streamed=names[:streamed], num_blocks=2, prefetch=1)


def _copy_ms(s: Setup, nbytes: int) -> float:
    if s.device != "cuda":
        return 0.0
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return _time_ms(lambda: dev.copy_(host, non_blocking=True), s)


def _backend(s: Setup) -> DeviceBackend:
    return CudaBackend() if s.device == "cuda" else CpuBackend()


def run(s: Setup) -> Iterator[tuple[str, float, float, float]]:
    """Rows: (variant, latency ms, overlap fraction, peak device MiB), each yielded once
    measured (so a later failure still leaves the earlier rows printed)."""
    x = torch.randn(s.tokens, s.dim, dtype=s.dtype, device=s.device)
    _reset_peak(s)
    resident = _model(s).to(s.device)
    with torch.inference_mode():
        resident_ms = _time_ms(lambda m=resident: m(x), s)
        reference = resident(x)
    yield "resident", resident_ms, float("nan"), _peak_bytes(s) / 2**20
    del resident
    for fraction in (0.3, 0.5, 0.7):
        _reset_peak(s)
        model = _model(s)
        profile = budget_profile(model, fraction)
        backend = _backend(s)
        offload_from_profile(model, profile, backend=backend, log_events=False)
        with torch.inference_mode():
            ms = _time_ms(lambda m=model: m(x), s)
            assert torch.equal(model(x), reference), "offloaded output differs from resident"
        copy = _copy_ms(s, profile.predicted.streamed_bytes)
        hidden = resident_ms + copy - ms
        overlap = max(0.0, min(1.0, hidden / min(resident_ms, copy))) if copy else float("nan")
        peak = _peak_bytes(s, backend) / 2**20
        handle(model).remove()
        del model
        yield f"flextensor {int(fraction * 100)}% budget", ms, overlap, peak
    try:
        row = _group_offload(s, x)
    except ImportError as exc:  # diffusers is the peer, not a dependency of the bench
        print(f"diffusers group offload skipped: {exc}")
    except Exception as exc:  # the peer failing must not hide our rows above
        print(f"diffusers group offload failed: {type(exc).__name__}: {exc}")
    else:
        yield row


def _group_offload(s: Setup, x: torch.Tensor) -> tuple[str, float, float, float]:
    from diffusers.hooks import apply_group_offloading

    _reset_peak(s)
    model = _model(s)
    streams = s.device == "cuda"
    apply_group_offloading(model, onload_device=s.device, offload_device="cpu", offload_type="block_level",
                           num_blocks_per_group=1, use_stream=streams)  # fmt: skip
    with torch.inference_mode():
        ms = _time_ms(lambda: model(x), s)
    return (f"diffusers group offload (block{', streams' if streams else ''})", ms, float("nan"),
            _peak_bytes(s) / 2**20)  # fmt: skip


def measure_curve(s: Setup, queued: int = 1) -> CopyCurve:
    """Pinned host-to-device copies on a GPU; host memory copies with `--smoke`; `queued`
    copies back to back per sample."""
    from flextensor_compile.measure.bandwidth import measure_cuda_copies, measure_host_copies

    return measure_cuda_copies(torch.device("cuda"), queued=queued) if s.device == "cuda" else (
        measure_host_copies(queued))  # fmt: skip


def queued_path(path: str | Path) -> Path:
    """Where `--curve-out FILE` saves the queued curve: FILE's name with `_queued`."""
    p = Path(path)
    return p.with_name(f"{p.stem}_queued{p.suffix or '.json'}")


def save_curves(path: str | Path, name: str, single: CopyCurve, queued: CopyCurve
                ) -> tuple[Path, Path]:  # fmt: skip
    """Save both measured curves for `python -m bench.plan_quality --copy-curve FILE`: the
    single-copy one at `path`, the queued one at `queued_path(path)`."""
    from bench.plan_quality.copy_models import write_curve

    out = []
    for where, curve, label in ((path, single, name), (queued_path(path), queued,
                                f"{name}, {QUEUED} copies queued")):  # fmt: skip
        points = [(p.bytes, p.bytes_per_s) for p in curve.points]
        out.append(write_curve(where, label, curve.bytes_per_s, curve.latency_ms, points))
    return out[0], out[1]


def curve_rows(s: Setup, measured: CopyCurve | None = None
               ) -> list[tuple[int, float, float, float]]:  # fmt: skip
    """Rows: (copy bytes, measured GB/s, fraction of the largest copy's rate, the fraction the
    plan-quality device model gives that size, its per-copy latency included)."""
    from bench.plan_quality.instances import device
    from flextensor_compile.solve.bandwidth import BandwidthModel

    measured = measure_curve(s) if measured is None else measured
    spec = device(measured.bytes_per_s)
    model = BandwidthModel.from_curve(tuple((p.bytes, p.bytes_per_s) for p in spec.bandwidth_curve),
                                      spec.h2d_bytes_per_s, spec.h2d_latency_ms)  # fmt: skip
    full_ms_per_byte = 1e3 / measured.bytes_per_s
    return [(p.bytes, p.bytes_per_s / 1e9, p.bytes_per_s / measured.bytes_per_s,
             p.bytes * full_ms_per_byte / model.copy_ms(p.bytes)) for p in measured.points]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--curve-out", metavar="FILE", help="also save the measured copy curve "
                        "(for `python -m bench.plan_quality --copy-curve FILE`)")  # fmt: skip
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--curve-only", action="store_true",
                      help="measure the copy curves only (seconds; what settles the copy model)")
    part.add_argument("--no-curve", action="store_true",
                      help="skip the copy curves (measured by an earlier --curve-only run)")
    args = parser.parse_args()
    if args.no_curve and args.curve_out:
        parser.error("--curve-out needs the curves: drop --no-curve")
    s = SMOKE if args.smoke else FULL
    if args.smoke:
        torch.set_num_threads(1)
    if s.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu needs a CUDA device; run `python -m bench.gpu --smoke` on CPU")
    weights = s.depth * (s.dim * s.dim + s.dim) * torch.empty((), dtype=s.dtype).element_size()
    print(f"{s.device}: {s.depth} x Linear({s.dim}) {str(s.dtype).removeprefix('torch.')}, "
          f"{weights / 2**20:.0f} MiB of weights, {s.tokens} tokens")  # fmt: skip
    if not args.curve_only:
        print(f"{'variant':40s} {'latency ms':>11s} {'overlap':>8s} {'peak MiB':>9s}")
        for name, ms, overlap, peak in run(s):
            print(f"{name:40s} {ms:11.3f} {overlap:8.2f} {peak:9.1f}")
    if args.no_curve:
        return
    measured, queued = measure_curve(s), measure_curve(s, QUEUED)
    for label, curve in (("each copy on its own", measured), (f"{QUEUED} copies queued", queued)):
        print(f"\ncopy curve, {label}: {curve.bytes_per_s / 1e9:.2f} GB/s at the largest copy, "
              f"fitted latency {curve.latency_ms * 1e3:.1f} us")  # fmt: skip
        print(f"{'copy bytes':>12s} {'GB/s':>8s} {'x largest':>10s} {'suite model':>12s}")
        for nbytes, gbps, fraction, assumed in curve_rows(s, curve):
            print(f"{nbytes:12d} {gbps:8.2f} {fraction:10.3f} {assumed:12.3f}")
    if args.curve_out:
        name = torch.cuda.get_device_name(0) if s.device == "cuda" else "host copies"
        for path in save_curves(args.curve_out, name, measured, queued):
            print(f"copy curve saved to {path}: python -m bench.plan_quality --copy-curve {path}")


if __name__ == "__main__":
    main()
