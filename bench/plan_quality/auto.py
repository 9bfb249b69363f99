"""The leaf-granularity and `auto` columns of the plan-quality benchmark.

Owns: per case, the leaf instance's problem at the case's device and budget (`leaves.py`), its
plan and solve time, and the plan `prefer_leaves` keeps of the module and leaf plans (what
`ftc --granularity auto` emits); their row fields, table columns and summary lines. Ratios use
the module instance's LB (passed in), so every column is over the same bound; `*_ratio_star` is
over the staging bound of the problem the plan solves. `ftc` measures the leaves only when the
module plan stalls (or fits no plan); here both are always solved, which keeps the same plan on
these cases (no case whose module plan hides every copy keeps its leaves).
Must not know: FlexTensor, how the module columns are computed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from bench.plan_quality.leaves import LEAF_INSTANCES
from flextensor_compile.solve import Plan, Problem, problem_from_stats, solve, staging_bound_ms
from flextensor_compile.solve.granularity import call_overhead_ms, exposed_call_ms, prefer_leaves
from flextensor_compile.stats import Stats
from flextensor_runtime.profile import PlanConfig

__all__ = [
    "COLUMNS",
    "LEAF_REPEATS",
    "auto_fields",
    "fmt_columns",
    "leaf_problems",
    "solve_leaves",
    "summary",
]

LEAF_REPEATS = 3  # passes timed over the leaf problems (150-500 ms a solve); modules take 5
COLUMNS = f"{'leaf/LB':>8}{'leaf/LB*':>9}{'traps':>6}{'leaf ms':>8}{'auto':>8}{'auto/LB':>8}"


def leaf_problems(cases: list[tuple[str, Stats, Problem]]) -> list[Problem]:
    """Per (instance, module stats, module problem): the leaf problem on the same device and
    budget."""
    built: dict[str, Stats] = {}
    out = []
    for name, stats, problem in cases:
        if name not in built:
            built[name] = LEAF_INSTANCES[name]()
        leaf = replace(built[name], device=stats.device)
        config = PlanConfig(budget_bytes=problem.budget_bytes, num_blocks=problem.num_blocks,
                            min_blocks=problem.min_blocks)  # fmt: skip
        out.append(problem_from_stats(leaf, config))
    return out


def solve_leaves(problems: list[Problem], repeats: int) -> tuple[list[Plan], list[float]]:
    """Plans and, per problem, the least CPU time of `repeats` solves (one per pass)."""
    plans: list[Plan] = []
    best = [float("inf")] * len(problems)
    for rep in range(repeats):
        for k, problem in enumerate(problems):
            start = time.process_time()
            plan = solve(problem, "adaptive")
            best[k] = min(best[k], (time.process_time() - start) * 1e3)
            if rep == 0:
                plans.append(plan)
    return plans, best


def auto_fields(lb_ms: float, modules: tuple[Problem, Plan], leaves: tuple[Problem, Plan],
                solve_ms: tuple[float, float]) -> dict:  # fmt: skip
    """Row fields for the leaf plan and the kept plan; `solve_ms` = (modules, leaves)."""
    leaf_problem, leaf_plan = leaves
    budget = leaf_problem.budget_bytes
    assert budget is not None  # every case has a budget
    pick = leaves if prefer_leaves(modules, leaves) else modules
    leaf_star = staging_bound_ms(leaf_problem)
    auto_star = leaf_star if pick is leaves else staging_bound_ms(modules[0])
    return {"leaf_ratio": leaf_plan.makespan_ms / lb_ms,
            "leaf_ratio_star": leaf_plan.makespan_ms / leaf_star, "leaf_lb_star_ms": leaf_star,
            "leaf_stall_ms": leaf_plan.simulation.stall_ms,
            "leaf_peak_over_budget": leaf_plan.peak_bytes / budget,
            "leaf_solve_ms": solve_ms[1], "leaf_traps": len(leaf_problem.traps),
            "leaf_call_ms": call_overhead_ms(*leaves),
            "module_call_ms": call_overhead_ms(*modules),
            "leaf_exposed_call_ms": exposed_call_ms(*leaves),
            "module_exposed_call_ms": exposed_call_ms(*modules),
            "auto_pick": "leaves" if pick is leaves else "modules",
            "auto_ratio": pick[1].makespan_ms / lb_ms, "auto_lb_star_ms": auto_star,
            "auto_ratio_star": pick[1].makespan_ms / auto_star,
            "auto_solve_ms": sum(solve_ms)}  # fmt: skip


def fmt_columns(row: dict) -> str:
    return (f"{row['leaf_ratio']:>8.3f}{row['leaf_ratio_star']:>9.3f}{row['leaf_traps']:>6}"
            f"{row['leaf_solve_ms']:>8.0f}{row['auto_pick']:>8}{row['auto_ratio']:>8.3f}")  # fmt: skip


def _line(label: str, rows: list[dict], key: str, solve_key: str) -> str:
    ratios = [r[f"{key}_ratio"] for r in rows]
    stars = [r[f"{key}_ratio_star"] for r in rows]
    solves = [r[solve_key] for r in rows]
    return (f"{label}: median makespan/LB {statistics.median(ratios):.3f}, worst "
            f"{max(ratios):.3f}; against the staging bound: median {statistics.median(stars):.3f}"
            f", worst {max(stars):.3f}; median solve {statistics.median(solves):.1f} ms, max "
            f"{max(solves):.1f} ms")  # fmt: skip


def summary(rows: list[dict]) -> list[str]:
    """Summary lines for the leaf plans and the kept plans."""
    kept = sum(r["auto_pick"] == "leaves" for r in rows)
    bounds = [r["leaf_lb_star_ms"] / r["lb_ms"] for r in rows]
    traps = [r["leaf_traps"] for r in rows]
    leaf = _line("leaves", rows, "leaf", "leaf_solve_ms")
    auto = _line("auto", rows, "auto", "auto_solve_ms")
    return [f"{leaf} ({min(traps)}-{max(traps)} traps); staging bound at leaves: "
            f"median {statistics.median(bounds):.3f} x LB, worst {max(bounds):.3f}",
            f"{auto} (both solves); leaves kept on {kept} of {len(rows)}"]  # fmt: skip
