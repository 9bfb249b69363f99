"""`adaptive` ranks what its families find: every family's plans under the ring, and keeping
every weight resident when the budget holds them all (no copy is faster)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import STRATEGIES, problem_from_stats, solve, try_solve
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.profile import DeviceSpec, PlanConfig
from tests.solve.instances import random_stats, total_bytes

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
MIB = 1 << 20


def _stats(compute: list[float], sizes: list[int], rate: float, latency_ms: float) -> Stats:
    device = DeviceSpec("dev", 1 << 34, rate, h2d_latency_ms=latency_ms)
    traps = tuple(
        TrapStat(f"blocks.{i}", ms, tuple(
            TensorStat(f"blocks.{i}.w{k}", n, "int8", (n,)) for k, n in enumerate(sizes)))
        for i, ms in enumerate(compute))  # fmt: skip
    return Stats("m", device, traps)


def test_adaptive_is_as_fast_as_every_other_trap_streaming_through_the_ring() -> None:
    """Three traps, one long: streaming the two short ones (nth-layer's ring plan) hides both
    copies behind the long trap; the knapsack families stream the long one."""
    stats = _stats([0.01, 0.1, 2.8], [64 << 10, 16 * MIB], 3e9, 0.5)
    config = PlanConfig(budget_bytes=int(total_bytes(stats) * 0.9))
    nth = solve(problem_from_stats(stats, config), "nth-layer")
    best = solve(problem_from_stats(stats, config))
    assert best.makespan_ms <= nth.makespan_ms * (1 + 1e-9), (best.strategy, nth.strategy)


def test_a_ring_budget_that_holds_every_weight_is_not_slower_than_keeping_them() -> None:
    """With the ring assignment and a budget of the weight bytes (or more), streaming ranked
    alone gave a plan slower than no streaming at all, or as fast with a higher peak."""
    stats = _stats([0.01, 0.0, 0.01, 0.01, 2.136, 1.0, 5.0], [1000, 5 * MIB, 333333, 65536],
                   3e9, 0.5)  # fmt: skip
    total = total_bytes(stats)
    compute = sum(t.compute_ms for t in stats.traps)
    for extra in (0, 1000, 700000):
        config = PlanConfig(budget_bytes=total + extra, assignment="ring")
        plan = solve(problem_from_stats(stats, config))
        assert abs(plan.makespan_ms - compute) < 1e-9, extra
        assert plan.peak_bytes <= total, extra


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_stats(), st.sampled_from(["optimized-round-robin", "ring"]), st.floats(1.0, 1.5))
def test_a_budget_holding_every_weight_gets_a_plan_no_slower_than_all_resident(
    stats, assignment: str, scale: float
) -> None:
    budget = max(1, int(total_bytes(stats) * scale))
    plan = solve(problem_from_stats(stats, PlanConfig(budget_bytes=budget, assignment=assignment)))
    compute = sum(t.compute_ms for t in stats.traps)  # all resident: compute alone
    assert plan.makespan_ms <= compute * (1 + 1e-9) + 1e-12
    assert plan.peak_bytes <= total_bytes(stats)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_stats(), st.floats(0.1, 0.95),
       st.sampled_from(["optimized-round-robin", "ring", "strict-round-robin"]))  # fmt: skip
def test_adaptive_is_never_slower_than_one_of_its_strategies(
    stats, fraction: float, assignment: str
) -> None:
    """`adaptive` runs every strategy's families: none of them alone plans faster."""
    config = PlanConfig(budget_bytes=max(1, int(total_bytes(stats) * fraction)),
                        assignment=assignment)  # fmt: skip
    problem = problem_from_stats(stats, config)
    best = try_solve(problem)
    for strategy in STRATEGIES:
        alone = try_solve(problem, strategy)
        if alone is None:
            continue
        assert best is not None, strategy
        assert best.makespan_ms <= alone.makespan_ms * (1 + 1e-9) + 1e-12, strategy


def _trap(name: str, ms: float, *sizes: tuple[int, bool]) -> TrapStat:
    """A trap of bf16 tensors of these (bytes, offloadable)."""
    tensors = tuple(TensorStat(f"{name}.{k}", b, "bfloat16", (b // 2,), offloadable=o)
                    for k, (b, o) in enumerate(sizes))  # fmt: skip
    return TrapStat(name, ms, tensors)


def test_a_family_with_no_block_plan_tries_one_block_under_adaptive_too() -> None:
    """Greedy alone fell back to one block (18.688 ms) where no plan of its with two or three
    blocks fitted; under adaptive, another family's two-block plan fitting skipped that
    fallback for every family, and adaptive planned 22.016 ms."""
    trap = _trap
    stats = Stats("one-block", DeviceSpec("test", 1 << 40, 1e6, kind="target"), (
        trap("a", 0.0), trap("b", 0.0, (2, False), (8340, True)),
        trap("c", 5.0, (798, False), (194, True), (8056, True), (72, True)), trap("d", 0.0),
        trap("e", 0.0, (5122, True), (9986, True), (2, False))))  # fmt: skip
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=int(total_bytes(stats) * 0.765625)))
    alone, best = try_solve(problem, "greedy"), try_solve(problem)
    assert alone is not None and best is not None
    assert best.makespan_ms <= alone.makespan_ms * (1 + 1e-9)


def test_adaptive_tries_global_offload_in_the_ring_too() -> None:
    """global-offload alone found a ring plan with headroom (15.104 ms) that adaptive, whose
    ring families left global-offload out, missed (15.312 ms)."""
    stats = Stats("ring-families", DeviceSpec("test", 1 << 40, 1e6, kind="target"), (
        _trap("a", 1.0, (3858, True), (514, True), (446, True), (2, False)),
        _trap("b", 1.0, (3332, True)),
        _trap("c", 0.0, (4610, True), (488, False), (2848, True), (2402, True)),
        _trap("d", 0.0),
        _trap("e", 0.0, (6, False), (32, True), (110, False), (56, True)),
        _trap("f", 1.0, (3074, True), (240, True), (548, False))))  # fmt: skip
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=16571))
    alone, best = try_solve(problem, "global-offload"), try_solve(problem)
    assert alone is not None and best is not None
    assert alone.makespan_ms < 15.2
    assert best.makespan_ms <= alone.makespan_ms * (1 + 1e-9)
