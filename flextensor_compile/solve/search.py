"""Fitting a cap family to the memory budget: the smallest level whose plan fits.

Owns: bisection over a monotone cap level (a larger level streams more, so resident bytes fall
faster than block bytes grow), the "everything streams" bound that proves a family infeasible,
and the smallest feasible budget reported by `BudgetError`.
Must not know: which family it is fitting, simulation.
"""

from __future__ import annotations

from collections.abc import Callable

from flextensor_compile.solve.plan import Selection, plan_memory
from flextensor_compile.solve.problem import Problem

__all__ = ["BISECT_STEPS", "fit_level", "smallest_memory"]

BISECT_STEPS = 22


def fit_level(
    problem: Problem, select: Callable[[float], Selection], hi: float, num_blocks: int
) -> Selection | None:
    """The selection at the smallest level in [0, hi] whose peak fits the budget, or None."""
    budget = problem.budget_bytes
    assert budget is not None

    def fits(sel: Selection) -> bool:
        mem = plan_memory(problem, sel, num_blocks)
        return mem is not None and mem <= budget

    low_sel = select(0.0)
    if fits(low_sel):
        return low_sel
    best = select(hi)
    if not fits(best):
        return None
    lo = 0.0
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        sel = select(mid)
        if fits(sel):
            hi, best = mid, sel
        else:
            lo = mid
    return best


def smallest_memory(
    problem: Problem, block_counts: tuple[int, ...], every_other: Selection
) -> int | None:
    """The least peak of our plans: everything streams, or (one block) every other trap."""
    full = tuple(tuple(range(len(t.items))) for t in problem.traps)
    found = []
    for sel in (full, every_other):
        for k in block_counts:
            mem = plan_memory(problem, sel, k)
            if mem is not None:
                found.append(mem)
    return min(found, default=None)
