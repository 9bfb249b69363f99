"""How trap granularity limits plan quality: `python -m bench.plan_quality.granularity`.

The staging bound (LB*) says no plan of a memory-mode problem beats (weight bytes - budget + the
largest trap's streamed bytes) at the copy rate, because a trap's streamed tensors share the
device while it computes. Coarse traps therefore cap how close any plan gets to
LB = max(compute, (weight bytes - budget) / bandwidth). This prints, for each suite instance,
LB*/LB and our makespan/LB at the suite's granularity and with every trap split into one trap
per weight of at least 1 MiB (smaller tensors join the next one; as `--include` patterns naming
each linear module would give). A split trap's compute is shared in proportion to its weights'
bytes, and every extra trap costs another 0.01 ms launch (as in the roofline). Informational: the
targets are judged on the suite as `python -m bench.plan_quality` builds it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from bench.plan_quality.__main__ import FRACTIONS, _cases
from bench.plan_quality.instances import INSTANCES
from bench.plan_quality.roofline import LAUNCH_MS
from flextensor_compile.solve import Problem, problem_from_stats, solve, staging_bound_ms
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.profile import PlanConfig

__all__ = ["per_weight"]

SPLIT_BYTES = 1 << 20


def _split(trap: TrapStat) -> list[TrapStat]:
    groups: list[list[TensorStat]] = [[]]
    for t in trap.tensors:
        groups[-1].append(t)
        if t.bytes >= SPLIT_BYTES:
            groups.append([])
    if not groups[-1]:
        groups.pop()
    if len(groups) <= 1 or trap.kind == "gap":
        return [trap]
    total = sum(t.bytes for t in trap.tensors) or 1
    work = trap.compute_ms - LAUNCH_MS
    out = []
    for k, g in enumerate(groups):
        compute_ms = round(work * sum(t.bytes for t in g) / total + LAUNCH_MS, 6)
        out.append(TrapStat(f"{trap.name}.{k}", compute_ms, tuple(g), trap.kind, trap.calls))
    return out


def per_weight(stats: Stats) -> Stats:
    """`stats` with every trap split into one trap per weight of at least `SPLIT_BYTES`."""
    return replace(stats, traps=tuple(x for t in stats.traps for x in _split(t)))


def _row(problem: Problem, weights: int) -> tuple[float, float, float, int]:
    assert problem.budget_bytes is not None
    lb = max(problem.compute_ms, problem.bandwidth.copy_ms(max(0, weights - problem.budget_bytes)))
    start = time.process_time()
    plan = solve(problem, "adaptive")
    solve_ms = (time.process_time() - start) * 1e3
    return plan.makespan_ms / lb, staging_bound_ms(problem) / lb, solve_ms, len(problem.traps)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.granularity")
    ap.add_argument("instances", nargs="*", default=list(INSTANCES))
    args = ap.parse_args()
    print(f"{'instance':<26}{'link':<6}{'budget':>7}{'traps':>7}{'ours/LB':>9}{'LB*/LB':>8}"
          f"{'solve ms':>9}   {'split traps':>11}{'ours/LB':>9}{'LB*/LB':>8}{'solve ms':>9}")  # fmt: skip
    coarse, fine = [], []
    for name, link, frac, stats, problem, weights in _cases(args.instances, FRACTIONS):
        a = _row(problem, weights)
        split = per_weight(stats)
        config = PlanConfig(budget_bytes=problem.budget_bytes)
        b = _row(problem_from_stats(split, config), weights)
        coarse.append(a)
        fine.append(b)
        print(f"{name:<26}{link:<6}{frac:>7.0%}{a[3]:>7}{a[0]:>9.3f}{a[1]:>8.3f}{a[2]:>9.1f}   "
              f"{b[3]:>11}{b[0]:>9.3f}{b[1]:>8.3f}{b[2]:>9.1f}", flush=True)  # fmt: skip
    for label, rows in (("suite traps", coarse), ("split traps", fine)):
        print(f"{label}: makespan/LB median {statistics.median(r[0] for r in rows):.3f}, worst "
              f"{max(r[0] for r in rows):.3f}; LB*/LB median {statistics.median(r[1] for r in rows):.3f}"
              f", worst {max(r[1] for r in rows):.3f}; solve max {max(r[2] for r in rows):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
