"""The solver: from measured traps, a device and a budget to a plan (pure, torch-free).

Pipeline: `problem_from_stats` -> `solve(problem, strategy)` (a strategy picks what streams,
`assign` maps transfers to blocks and schedules them, `simulate` predicts the iteration) -> `Plan`.
No torch, no I/O, no clock, no globals: the same problem always gives the same plan.
"""

from flextensor_compile.solve.assign import ASSIGNMENTS, Assignment, assign_blocks
from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.solve.bound import StagingBound, staging_bound, staging_bound_ms
from flextensor_compile.solve.granularity import call_overhead_ms, exposed_call_ms, prefer_leaves
from flextensor_compile.solve.plan import Plan, PlannedTransfer, Selection, build_plan, plan_memory
from flextensor_compile.solve.problem import (
    ALIGN_BYTES,
    Item,
    Problem,
    TrapSpec,
    align_up,
    problem_from_stats,
)
from flextensor_compile.solve.simulate import CopyJob, Simulation, simulate
from flextensor_compile.solve.strategies import DEFAULT_STRATEGY, STRATEGIES, solve, try_solve
from flextensor_compile.solve.subset import SubsetTable

__all__ = [
    "ALIGN_BYTES",
    "ASSIGNMENTS",
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "Assignment",
    "BandwidthModel",
    "CopyJob",
    "Item",
    "Plan",
    "PlannedTransfer",
    "Problem",
    "Selection",
    "Simulation",
    "StagingBound",
    "SubsetTable",
    "TrapSpec",
    "align_up",
    "assign_blocks",
    "build_plan",
    "call_overhead_ms",
    "exposed_call_ms",
    "plan_memory",
    "prefer_leaves",
    "problem_from_stats",
    "simulate",
    "solve",
    "staging_bound",
    "staging_bound_ms",
    "try_solve",
]
