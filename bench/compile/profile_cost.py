"""What `ftc profile` costs on the bundled model files: plain run time, the discovery forward
(hooks + torch-function interception), profiling forwards, and the solve.

    python -m bench.compile.profile_cost [--iters 3] [model files...]

Prints one row per model file: weights, traps, plain run and discovery run (best of --iters, ms;
and their ratio), profiling (forwards, s), solve (ms).
"""

from __future__ import annotations

import argparse
import time

from flextensor_compile.compile_api import collect_stats, plan_stats
from flextensor_compile.config import OffloadConfig
from flextensor_compile.discover import discover
from flextensor_compile.model_file import build_model, call_run, load_model_spec, make_inputs
from flextensor_compile.units import format_bytes
from flextensor_runtime.model_tensors import model_tensor_entries

DEFAULT_FILES = ("profiles/tiny_transformer.py", "profiles/llama_small.py",
                 "profiles/flux_small.py", "profiles/minilm.py")  # fmt: skip


def _best_ms(fn, n: int) -> float:
    """The fastest of `n` runs: the least disturbed by other work on a shared machine."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return min(samples)


def measure(path: str, iters: int) -> dict[str, object]:
    spec = load_model_spec(path)
    model, inputs = build_model(spec), make_inputs(spec)
    call_run(spec.run, model, inputs, path)  # warm-up
    plain_ms = _best_ms(lambda: call_run(spec.run, model, inputs, path), iters)
    disc_ms = _best_ms(lambda: discover(model, inputs, spec.run, source=path), iters)
    config = OffloadConfig(profiling_iters=iters, warmup_iters=1, max_gpu_mem_fraction=0.9)
    c = collect_stats(model, inputs, config, spec.run, source=path)
    t0 = time.perf_counter()
    plan_stats(c.stats, config)
    solve_ms = (time.perf_counter() - t0) * 1e3
    weights = sum(e.bytes for e in model_tensor_entries(model) if e.tie is None)
    return {"model": path, "weights": format_bytes(weights),
            "traps": sum(1 for t in c.stats.traps if t.kind != "gap"),
            "plain_ms": plain_ms, "discovery_ms": disc_ms, "ratio": disc_ms / plain_ms,
            "forwards": c.cost.forwards, "profiling_s": c.cost.seconds, "solve_ms": solve_ms}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES))
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    print(f"{'model':34} {'weights':>9} {'traps':>5} {'plain ms':>9} {'discovery ms':>12} "
          f"{'x plain':>7} {'forwards':>8} {'profiling s':>11} {'solve ms':>8}")  # fmt: skip
    for path in args.files:
        r = measure(path, args.iters)
        print(f"{r['model']:34} {r['weights']:>9} {r['traps']:>5} {r['plain_ms']:9.1f} "
              f"{r['discovery_ms']:12.1f} {r['ratio']:7.2f} {r['forwards']:8d} "
              f"{r['profiling_s']:11.2f} {r['solve_ms']:8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
