"""`python -m bench.runtime.slots`: what the emptied-slot check costs per trap call.

At each trap entry the runtime checks that every streamed tensor the trap lists is still where
its module holds it (`module.weight = None` and `del module.weight` reach no torch hook). This
deploys the overhead stack (64 traps of `Linear(64, 64)`, weight and bias streamed) twice, once
with the check's slots emptied, and times both forwards interleaved, `repeats` rounds of
`iters` forwards each, printing the median per-call time of both and their difference.
Must not know: how the check decides.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.runtime.models import stack, stack_profile
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, offload_from_profile

__all__ = ["main"]


def _deployed(depth: int, dim: int, check: bool) -> torch.nn.Module:
    model = stack(depth, dim)
    offload_from_profile(model, stack_profile(model, True), backend=CpuBackend(), log_events=False)
    runtime = handle(model).deployment.runtime
    assert runtime is not None and any(runtime.slots)
    if not check:
        runtime.slots = [() for _ in runtime.slots]
    return model


def _round_us(model: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        model(x)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def _guard_ns(model: torch.nn.Module, calls: int) -> float:
    """Median ns of one entry check of the first trap (inference guard and slot check)."""
    runtime = handle(model).deployment.runtime
    assert runtime is not None
    guard = runtime._guard
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            guard(0)
        rounds.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(rounds)


def main(
    depth: int = 64, dim: int = 64, repeats: int = 21, iters: int = 200, calls: int = 100_000
) -> None:
    x = torch.randn(1, dim)
    models = {"on": _deployed(depth, dim, True), "off": _deployed(depth, dim, False)}
    per_call: dict[str, list[float]] = {"on": [], "off": []}
    with torch.inference_mode():
        for model in models.values():
            _round_us(model, x, 30)
        for r in range(repeats):  # alternate which runs first: no order effect
            for name in ("on", "off") if r % 2 else ("off", "on"):
                per_call[name].append(_round_us(models[name], x, iters) / depth)
        guard = {name: _guard_ns(m, calls) for name, m in models.items()}
    on, off = (statistics.median(per_call[n]) for n in ("on", "off"))
    diffs = sorted(a - b for a, b in zip(per_call["on"], per_call["off"], strict=True))
    spread = f"{diffs[len(diffs) // 4]:.3f} .. {diffs[3 * len(diffs) // 4]:.3f}"
    print(f"{'variant (64 traps, dim 64, streamed)':38s} {'check on':>9s} {'off':>8s} "
          f"{'cost':>7s}  per-round cost, quartiles")  # fmt: skip
    print(f"{'trap call incl. forward (us)':38s} {on:9.3f} {off:8.3f} {on - off:7.3f}  {spread}")
    g_on, g_off = guard["on"], guard["off"]
    print(f"{'entry check alone (ns)':38s} {g_on:9.1f} {g_off:8.1f} {g_on - g_off:7.1f}")


if __name__ == "__main__":
    main()
