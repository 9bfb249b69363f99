"""How often a larger budget gets a worse `adaptive` plan, on seeded random instances.

A plan that fits a budget fits every larger one, so the best plan's makespan cannot rise with
the budget, nor, at equal makespan, its peak. The solver fits each budget on its own (the
least streaming that fits, then ranks), so it can miss the plan a smaller budget got. This
counts, per random instance swept over budgets (fractions of the weight bytes), the first
budget whose plan is slower than a smaller budget's, and the first whose plan is as fast with
a higher peak, and prints the worst slowdowns.

    python -m bench.plan_quality.monotone [--instances 120] [--seed 0]
        [--plans-out PLANS.json] [--against BEFORE.json]

`--plans-out` saves every plan's makespan and peak (per seed and budget); `--against` compares
them with a file saved before a solver change: how many plans got faster (geometric mean and
largest speed-up) and which got slower.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from flextensor_compile.solve import problem_from_stats, try_solve
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.profile import DeviceSpec, PlanConfig

FRACTIONS = tuple(k / 20 for k in range(4, 23))  # 0.2 .. 1.1
SAME = 1e-9  # relative: makespans this close are equal
_SIZES = (1 << 10, 4096, 1000, 64 << 10, 333333, 1 << 20, 3 << 20, 5 << 20, 7 << 20, 16 << 20)


@dataclass(frozen=True)
class Finding:
    seed: int
    small: float  # the smaller budget's fraction
    large: float
    ratio: float  # makespan at `large` / at `small` (1.0 for a peak rise)


def random_instance(rng: random.Random) -> tuple[Stats, int]:
    """Stats of 2-14 traps (some gap traps, layers alike or not, paired under parent modules),
    one of several copy rates and latencies, and an activation reserve (0 or 1 MiB)."""
    n = rng.randint(2, 14)
    shared = [rng.choice(_SIZES) for _ in range(rng.randint(1, 5))]
    alike = rng.random() < 0.5
    traps = []
    for i in range(n):
        if rng.random() < 0.15:
            traps.append(TrapStat(f"gap:{i}", rng.choice([0.0, 0.01, 0.5]), (), kind="gap"))
            continue
        sizes = shared if alike else [rng.choice(_SIZES) for _ in range(rng.randint(1, 6))]
        name = f"model.layers.{i // 2}.{'attn' if i % 2 else 'mlp'}"
        tensors = tuple(TensorStat(f"{name}.w{k}", s, "int8", (s,)) for k, s in enumerate(sizes))
        compute = rng.choice([0.0, 0.01, 0.1, 1.0, 5.0, rng.random() * 3])
        traps.append(TrapStat(name, compute, tensors))
    if not any(t.tensors for t in traps):
        traps.append(TrapStat("last", 1.0, (TensorStat("last.w", 1 << 20, "int8", (1 << 20,)),)))
    rate = rng.choice([25e9, 50e9, 1e6, 1e12, 3e9])
    device = DeviceSpec("dev", 1 << 40, rate, rng.choice([0.0, 0.008, 0.5]), kind="target")
    return Stats("random", device, tuple(traps)), rng.choice([0, 0, 0, 1 << 20])


def sweep_one(seed: int, plans: dict[str, list[float] | None] | None = None
              ) -> tuple[Finding | None, Finding | None]:  # fmt: skip
    """(the first makespan rise, the first peak rise at equal makespan) of one instance;
    `plans` gets each budget's [makespan, peak] (None: no plan fits) under "seed fraction"."""
    stats, reserve = random_instance(random.Random(seed))
    weights = sum(t.bytes for trap in stats.traps for t in trap.tensors)
    rise = peak = None
    best: tuple[float, int, float] | None = None  # makespan, peak, fraction
    for f in FRACTIONS:
        config = PlanConfig(budget_bytes=int(weights * f) + reserve,
                            activation_reserve_bytes=reserve)  # fmt: skip
        plan = try_solve(problem_from_stats(stats, config))
        if plans is not None:
            plans[f"{seed} {f:g}"] = None if plan is None else [plan.makespan_ms, plan.peak_bytes]
        if plan is None:
            continue
        if best is not None:
            ms, top, at = best
            if rise is None and plan.makespan_ms > ms * (1 + SAME):
                rise = Finding(seed, at, f, plan.makespan_ms / ms)
            elif peak is None and plan.makespan_ms >= ms * (1 - SAME) and plan.peak_bytes > top:
                peak = Finding(seed, at, f, 1.0)
        if best is None or plan.makespan_ms < best[0] * (1 - SAME):
            best = (plan.makespan_ms, plan.peak_bytes, f)
        elif plan.makespan_ms <= best[0] * (1 + SAME) and plan.peak_bytes < best[1]:
            best = (best[0], plan.peak_bytes, f)
    return rise, peak


def compare(before: dict[str, list[float] | None], after: dict[str, list[float] | None]
            ) -> tuple[list[float], list[tuple[str, float]]]:  # fmt: skip
    """(speed-ups of the plans that got faster, (key, slowdown) of those that got slower),
    over the plans both sides have."""
    faster, slower = [], []
    for key, old in before.items():
        new = after.get(key)
        if old is None or new is None:
            continue
        if old[0] > new[0] * (1 + SAME):
            faster.append(old[0] / new[0])
        elif new[0] > old[0] * (1 + SAME):
            slower.append((key, new[0] / old[0]))
    return faster, slower


def _report_against(path: Path, plans: dict[str, list[float] | None]) -> None:
    faster, slower = compare(json.loads(path.read_text()), plans)
    mean = math.prod(faster) ** (1 / len(faster)) if faster else 1.0
    print(f"against {path}: {len(faster)} of {len(plans)} plans faster (geometric mean "
          f"{mean:.3f}x, at most {max(faster, default=1.0):.3f}x), {len(slower)} slower")  # fmt: skip
    for key, ratio in sorted(slower, key=lambda x: -x[1])[:5]:
        print(f"  slower: seed and fraction {key}, {ratio:.4f}x the makespan")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.monotone")
    ap.add_argument("--instances", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--plans-out", type=Path, help="save every plan's makespan and peak (JSON)")
    ap.add_argument("--against", type=Path, help="plans saved before a change, to compare")
    args = ap.parse_args()
    plans: dict[str, list[float] | None] = {}
    found = [sweep_one(s, plans) for s in range(args.seed, args.seed + args.instances)]
    rises = sorted((r for r, _ in found if r is not None), key=lambda r: -r.ratio)
    peaks = [p for _, p in found if p is not None]
    print(f"{args.instances} random instances, budgets {FRACTIONS[0]:g}-{FRACTIONS[-1]:g} of the "
          f"weights in steps of 0.05")  # fmt: skip
    print(f"a larger budget got a slower plan: {len(rises)} instances")
    for r in rises[:5]:
        print(f"  seed {r.seed}: frac {r.small:.2f} -> {r.large:.2f}, {r.ratio:.3f}x the makespan")
    print(f"a larger budget got an as fast plan with a higher peak: {len(peaks)} instances")
    if args.plans_out is not None:
        args.plans_out.write_text(json.dumps(plans, indent=0, sort_keys=True) + "\n")
    if args.against is not None:
        _report_against(args.against, plans)


if __name__ == "__main__":
    main()
