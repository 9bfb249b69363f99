"""Cover selections: enough streamed bytes for the layout's staging, no transfer above m, the
fill streams less than finishing early, and `adaptive` keeps the cover plan where it is best."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import STRATEGIES, Problem, problem_from_stats, solve
from flextensor_compile.solve.cover import cover_selections
from flextensor_compile.solve.families import make_context
from flextensor_compile.solve.plan import build_plan, pick_of
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, random_stats, tensor, total_bytes
from tests.solve.test_bound import copy_bound_stats, layered_stats

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _alternating(deficit_bytes: int) -> Problem:
    """Copy-bound: 8 traps with one tensor each, 200 kB and 20 kB in turn, almost no compute."""
    traps = tuple(
        TrapStat(f"t{i}", 0.001, (tensor(f"t{i}.w", 100_000 if i % 2 == 0 else 10_000),))
        for i in range(8)
    )
    stats = Stats("alternating", device(1e9, 0.01), traps)
    return problem_from_stats(stats, PlanConfig(budget_bytes=total_bytes(stats) - deficit_bytes))


def test_fill_and_finish_on_a_hand_instance() -> None:
    problem = _alternating(250_000)
    ctx = make_context(problem)
    (m,) = ctx.cover_sizes  # the staging bound prefers transfers of one large tensor
    assert m == problem.traps[0].items[0].slot_bytes
    early, filled = cover_selections(ctx, m, m)
    # need 250 kB + m: two large, then finishing early takes a third large one (600 kB);
    # the fill takes small ones while they fit and finishes with one more (460 kB)
    assert pick_of(problem, early).streamed_bytes == 600_000
    assert pick_of(problem, filled).streamed_bytes == 460_000
    assert sum(1 for chosen in early if chosen) == 3
    assert sum(1 for chosen in filled if chosen) == 5


def test_adaptive_keeps_the_cover_plan_where_it_is_best() -> None:
    problem = _alternating(250_000)
    ctx = make_context(problem)
    (m,) = ctx.cover_sizes
    filled = cover_selections(ctx, m, m)[1]
    ring = build_plan(problem, filled, 1, "cover", "ring")
    assert ring is not None and ring.peak_bytes <= (problem.budget_bytes or 0)
    best = solve(problem, "adaptive")
    assert best.makespan_ms <= ring.makespan_ms + 1e-9
    others = [
        solve(problem, s) for s in STRATEGIES if s not in ("adaptive", "global-tensor-selection")
    ]
    assert ring.makespan_ms < min(plan.makespan_ms for plan in others)  # what the cover adds


@st.composite
def _problems(draw: st.DrawFn) -> Problem:
    stats = draw(st.one_of(random_stats(max_traps=8, max_tensors=4), layered_stats(),
                           copy_bound_stats()))  # fmt: skip
    budget = max(1, int(draw(st.floats(0.3, 0.95)) * total_bytes(stats)))
    reserve = draw(st.sampled_from([0, 0, 512]))
    config = PlanConfig(budget_bytes=budget, activation_reserve_bytes=reserve)
    return problem_from_stats(stats, config)


@SETTINGS
@given(_problems(), st.sampled_from([1, 2]))
def test_every_cover_streams_the_staging_it_leaves_room_for(problem: Problem, blocks: int) -> None:
    ctx = make_context(problem)
    assert problem.budget_bytes is not None
    deficit = problem.total_bytes + problem.reserve_bytes - problem.budget_bytes
    for m in ctx.cover_sizes:
        for selection in cover_selections(ctx, m, blocks * m):
            pick = pick_of(problem, selection)
            assert pick.streamed_bytes >= deficit + blocks * m
            assert max(pick.slot_bytes) <= m
            # so blocks of m fit: peak = resident + blocks x m + reserve <= budget
            resident = problem.total_bytes - pick.streamed_bytes
            assert resident + blocks * m + problem.reserve_bytes <= problem.budget_bytes
