"""The trap calls' host time that `--granularity auto` charges a plan: only what stalls don't hide."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flextensor_compile.solve import (
    Plan,
    call_overhead_ms,
    exposed_call_ms,
    prefer_leaves,
    problem_from_stats,
    solve,
)
from flextensor_compile.solve.granularity import RESIDENT_CALL_MS, STREAMING_CALL_MS
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, total_bytes, uniform_stats


def _stalled(plan: Plan, stalls: list[float]) -> Plan:
    return replace(plan, simulation=replace(plan.simulation, trap_stall_ms=tuple(stalls)))


def _resident_plan(layers: int) -> tuple:
    stats = uniform_stats(layers)
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=total_bytes(stats)))
    plan = solve(problem, "adaptive")
    plan = replace(plan, transfers=())  # every trap's call as a resident one
    return problem, plan


def test_without_stalls_every_call_is_exposed() -> None:
    problem, plan = _resident_plan(4)
    plan = _stalled(plan, [0.0] * 4)
    assert call_overhead_ms(problem, plan) == pytest.approx(4 * RESIDENT_CALL_MS)
    assert exposed_call_ms(problem, plan) == pytest.approx(4 * RESIDENT_CALL_MS)


def test_a_stall_hides_the_calls_after_it_but_not_before() -> None:
    problem, plan = _resident_plan(4)
    # a long stall at the first trap: the host runs ahead and every call is paid for
    assert exposed_call_ms(problem, _stalled(plan, [1.0, 0, 0, 0])) == 0.0
    # the same stall at the last trap comes too late for the three calls before it
    late = exposed_call_ms(problem, _stalled(plan, [0, 0, 0, 1.0]))
    assert late == pytest.approx(3 * RESIDENT_CALL_MS)
    # a stall shorter than the calls after it hides only its own length
    short = exposed_call_ms(problem, _stalled(plan, [0.0015, 0, 0, 0]))
    assert short == pytest.approx(4 * RESIDENT_CALL_MS - 0.0015)


def test_streaming_traps_cost_more_and_a_copy_bound_plan_hides_them() -> None:
    stats = replace(uniform_stats(6, compute_ms=0.01, elems=1_000_000), device=device(1e9))
    budget = int(total_bytes(stats) * 0.5)
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=budget))
    plan = solve(problem, "adaptive")
    streaming = {t.trap for t in plan.transfers}
    assert streaming and plan.simulation.stall_ms > 1.0  # copies of 1.5 MB at 1 GB/s stall
    expected = sum(STREAMING_CALL_MS if i in streaming else RESIDENT_CALL_MS for i in range(6))
    assert call_overhead_ms(problem, plan) == pytest.approx(expected)
    assert exposed_call_ms(problem, plan) < expected


def test_prefer_leaves_charges_only_the_exposed_calls() -> None:
    problem, plan = _resident_plan(4)
    fine_problem, fine_plan = _resident_plan(8)
    fast = _stalled(replace(fine_plan, simulation=replace(
        fine_plan.simulation, makespan_ms=plan.makespan_ms - 0.005)), [0.0] * 8)  # fmt: skip
    # 5 us faster, but 4 more calls of 1 us each with nothing to hide them: still faster
    assert prefer_leaves((problem, _stalled(plan, [0.0] * 4)), (fine_problem, fast))
    slow = replace(fast, simulation=replace(fast.simulation, makespan_ms=plan.makespan_ms - 0.003))
    assert not prefer_leaves((problem, _stalled(plan, [0.0] * 4)), (fine_problem, slow))
    # with a stall at its first trap the fine plan's calls are hidden: 3 us faster wins
    hidden = _stalled(slow, [0.01] + [0.0] * 7)
    assert prefer_leaves((problem, _stalled(plan, [0.0] * 4)), (fine_problem, hidden))
