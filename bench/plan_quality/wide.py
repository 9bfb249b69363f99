"""Solve times on wide random instances, where tensor sizes are random (few repeat):
`python -m bench.plan_quality.wide [--shapes 80x24 40x100 ...] [--fractions F ...] [--repeats N]`.

The plan-quality suite's instances are real architectures, a few tensor sizes per layer, so
every trap's subset table is exact and identical layers share one. Here T traps of K tensors,
each a random multiple of 4 KiB up to about 16 MiB (seeded), give T distinct traps with far more
than `MAX_SUMS` distinct sums each: every table is thinned, and the subset kernel's cost shows.
Per shape and budget (a fraction of the weights) it prints the least CPU time of `--repeats`
solves, one per pass over all the cases, beside the CPU reference loop of the suite (solve times
are pure-Python CPU times and scale with it), and checks the suite's solve-time target on the
80 x 24 shape (the size of the suite's 80-layer x 24-tensor instance, with random sizes). A
budget no plan fits is timed too (the solve then searches for the least budget that fits).
Must not know: how plans are searched.
"""

from __future__ import annotations

import argparse
import random
import time

from bench.plan_quality.__main__ import cpu_reference_ms
from bench.plan_quality.instances import BANDWIDTHS, device
from bench.plan_quality.targets import MAX_SOLVE_MS
from flextensor_compile.solve import Problem, problem_from_stats, solve
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import PlanConfig

__all__ = ["FRACTIONS", "SHAPES", "TARGET_SHAPE", "wide_problems", "wide_stats"]

SHAPES = ((80, 24), (40, 100), (10, 400))  # traps x tensors (random sizes)
TARGET_SHAPE = (80, 24)  # solves of this shape are held to the suite's MAX_SOLVE_MS
FRACTIONS = (0.3, 0.5, 0.7, 0.9)


def wide_stats(traps: int, tensors: int, seed: int = 0) -> Stats:
    """`traps` traps of 1 ms, each with `tensors` float32 tensors of random 4 KiB multiples."""
    rng = random.Random(seed)
    out = []
    for i in range(traps):
        sizes = [rng.randint(1, 4000) * 4096 for _ in range(tensors)]
        out.append(TrapStat(f"blocks.{i}", 1.0, tuple(
            TensorStat(f"blocks.{i}.w{j}", b, "float32", (b // 4,)) for j, b in enumerate(sizes)
        )))  # fmt: skip
    return Stats(f"wide-{traps}x{tensors}", device(BANDWIDTHS["pcie4"]), tuple(out))


def wide_problems(
    shapes: list[tuple[int, int]], fractions: list[float]
) -> list[tuple[str, Problem]]:
    cases = []
    for traps, tensors in shapes:
        stats = wide_stats(traps, tensors)
        weights = sum(t.bytes for tr in stats.traps for t in tr.tensors)
        for frac in fractions:
            config = PlanConfig(budget_bytes=int(frac * weights))
            cases.append((f"{traps}x{tensors} {frac:g}", problem_from_stats(stats, config)))
    return cases


def _outcome(problem: Problem) -> str:
    try:
        plan = solve(problem, "adaptive")
    except BudgetError as exc:
        return f"no plan fits (least budget {exc.least_bytes})"
    return f"{plan.strategy}, makespan {plan.makespan_ms:.3f} ms"


def _shape(text: str) -> tuple[int, int]:
    traps, _, tensors = text.partition("x")
    return int(traps), int(tensors)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.wide")
    ap.add_argument("--shapes", nargs="*", type=_shape, default=list(SHAPES),
                    help="TRAPSxTENSORS, e.g. 80x24 2x1000")  # fmt: skip
    ap.add_argument("--fractions", nargs="*", type=float, default=list(FRACTIONS))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cases = wide_problems(args.shapes, args.fractions)
    best, reference = [float("inf")] * len(cases), float("inf")
    for _ in range(max(1, args.repeats)):
        for k, (_, problem) in enumerate(cases):
            reference = min(reference, cpu_reference_ms(1))
            start = time.process_time()
            _outcome(problem)
            best[k] = min(best[k], (time.process_time() - start) * 1e3)
    for (name, problem), ms in zip(cases, best, strict=True):
        print(f"{name:<14}{ms:>10.1f} ms  {_outcome(problem)}")
    print(f"CPU reference loop: {reference:.3f} ms on this machine; solve times scale with it")
    label = f"{TARGET_SHAPE[0]}x{TARGET_SHAPE[1]} "
    target = [ms for (name, _), ms in zip(cases, best, strict=True) if name.startswith(label)]
    if target:
        worst = max(target)
        verdict = "met" if worst <= MAX_SOLVE_MS else "MISSED"
        print(f"target: {label}solves <= {MAX_SOLVE_MS:.0f} ms: at most {worst:.1f} ms {verdict} "
              f"({worst / reference:.0f} x the reference loop, so within {MAX_SOLVE_MS:.0f} ms "
              f"where that loop takes up to {MAX_SOLVE_MS * reference / worst:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
