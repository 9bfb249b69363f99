"""A ring candidate ranks as the ring plan it stands for, and `plan()` is that plan."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import problem_from_stats
from flextensor_compile.solve.plan import PlanCache, build_plan, copies_of, ring_candidate
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import random_stats, total_bytes

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn):
    stats = draw(random_stats(max_traps=8, max_tensors=5))
    fraction = draw(st.floats(0.3, 1.2))
    config = PlanConfig(budget_bytes=max(1, int(fraction * total_bytes(stats))))
    problem = problem_from_stats(stats, config)
    sel = tuple(tuple(k for k in range(len(t.items)) if draw(st.booleans())) for t in problem.traps)
    return problem, sel


@SETTINGS
@given(cases())
def test_candidate_ranks_as_its_plan_and_makes_it(case) -> None:
    problem, sel = case
    found = ring_candidate(problem, sel, "test", PlanCache())
    plan = build_plan(problem, sel, 1, "test", "ring")
    if found is None:
        assert plan is None
        return
    assert plan is not None
    assert found.plan() == plan
    assert found.rank_key() == plan.rank_key()
    assert (found.makespan_ms, found.peak_bytes, found.block_bytes) == (
        plan.makespan_ms,
        plan.peak_bytes,
        plan.block_bytes,
    )
    assert copies_of(found) == copies_of(plan) == len(plan.transfers)
