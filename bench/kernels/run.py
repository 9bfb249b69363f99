"""Time each fused kernel against its PyTorch reference and `torch.compile` of the reference.

Owns: argument parsing, timing (CUDA events on GPU, perf_counter on CPU), and the report.
On a CUDA machine it runs real sizes; `--smoke` (or no CUDA) runs tiny sizes on CPU with the
Triton interpreter, only to prove the benchmark works. Must not know: kernel internals.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from bench.kernels.cases import Case

__all__ = ["main"]


@dataclass(frozen=True)
class Row:
    kernel: str
    size: str
    variant: str
    time_ms: float
    bandwidth_gbps: float
    tflops: float
    max_abs_err: float
    speedup_vs_reference: float


def _time_ms(fn: Callable[[], torch.Tensor], device: torch.device, iters: int) -> float:
    """Median milliseconds per call. CUDA: triton's do_bench (L2 flushed before every call,
    which also hides Python dispatch behind the flush); CPU: wall clock after one warm-up."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    fn()
    samples = []
    for _ in range(iters):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (interpreter)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=None, help="timed runs per variant (CPU)")
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend for the reference (default: inductor; eager with --smoke; "
        "none skips that variant)",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    return parser.parse_args(argv)


def _variants(case: Case, compile_backend: str) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    variants = [("reference", case.reference)]
    if compile_backend != "none":  # default dynamic: expert group sizes vary between experts
        compiled = torch.compile(case.reference, backend=compile_backend)
        variants.append((f"torch.compile({compile_backend})", compiled))
    return [*variants, ("triton", case.triton)]


def _measure(
    cases: list[Case], device: torch.device, compile_backend: str, iters: int
) -> list[Row]:
    rows = []
    for case in cases:
        expected = case.reference().float()
        reference_ms = 0.0
        for variant, fn in _variants(case, compile_backend):
            err = (fn().float() - expected).abs().max().item() if expected.numel() else 0.0
            ms = _time_ms(fn, device, iters)
            reference_ms = reference_ms or ms
            rows.append(
                Row(
                    case.name,
                    case.size,
                    variant,
                    ms,
                    case.min_bytes / ms / 1e6,
                    case.flops / ms / 1e9,
                    err,
                    reference_ms / ms,
                )
            )
            print(_format(rows[-1]), flush=True)
    return rows


def _format(row: Row) -> str:
    return (
        f"{row.kernel:<23} {row.size:<40} {row.variant:<23} {row.time_ms:>9.4g} ms "
        f"{row.bandwidth_gbps:>8.4g} GB/s {row.tflops:>7.4g} TFLOP/s "
        f"err {row.max_abs_err:.1e}  x{row.speedup_vs_reference:.3g} vs reference"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke:
        if not args.smoke:
            print("no CUDA device: running the --smoke sizes on CPU (Triton interpreter)")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import triton
    device = torch.device("cpu" if smoke else "cuda")
    compile_backend = args.compile_backend or ("eager" if smoke else "inductor")
    iters = args.iters or (1 if smoke else 20)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # graph-break notes at .tolist()
    from bench.kernels.cases import build_cases

    torch.manual_seed(0)
    cases = build_cases(smoke, getattr(torch, args.dtype), device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    print(f"device: {name}; GB/s and TFLOP/s count the minimum traffic and work of each op")
    rows = _measure(cases, device, compile_backend, iters)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": name, "rows": [asdict(r) for r in rows]}, handle, indent=1)
    return 0
