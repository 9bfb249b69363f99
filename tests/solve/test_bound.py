"""The staging bound: no plan any strategy finds beats it, and it is never below the simple LB;
its overlap term is what binds when traps compute long enough to idle the copy engine."""

from __future__ import annotations

import math
import os
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import (
    ASSIGNMENTS,
    STRATEGIES,
    Problem,
    problem_from_stats,
    solve,
    staging_bound,
    staging_bound_ms,
    try_solve,
)
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import BandwidthPoint, PlanConfig
from tests.solve.instances import device, random_stats, tensor, total_bytes, uniform_stats

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
REL = 1e-9


@st.composite
def curves(draw: st.DrawFn) -> tuple:
    """No curve, or 1-3 measured (bytes, bytes/s) points, rates rising or falling with size."""
    sizes = sorted(draw(st.sets(st.integers(64, 20_000), max_size=3)))
    return tuple(BandwidthPoint(b, draw(st.sampled_from([2e5, 1e6, 4e6, 2e7]))) for b in sizes)


@st.composite
def layered_stats(draw: st.DrawFn) -> Stats:
    """3-10 traps that all stream (1-4 tensors each, a gap trap now and then): most budgets fit."""
    traps = []
    for i in range(draw(st.integers(3, 10))):
        compute = draw(st.floats(0.0, 5.0))
        if i and draw(st.integers(0, 5)) == 0:
            traps.append(TrapStat(f"gap{i}", compute, (), kind="gap"))
            continue
        sizes = draw(st.lists(st.integers(100, 5000), min_size=1, max_size=4))
        tensors = tuple(tensor(f"t{i}.{k}", n) for k, n in enumerate(sizes))
        traps.append(TrapStat(f"trap{i}", compute, tensors))
    rate = draw(st.sampled_from([1e6, 5e6, 2e7]))
    return Stats("layered", device(rate, draw(st.sampled_from([0.0, 0.01, 0.3]))), tuple(traps))


@st.composite
def copy_bound_stats(draw: st.DrawFn) -> Stats:
    """2-8 traps, each computing 0-2 x its own copy time: copies cannot all hide behind compute,
    and a trap's own streamed bytes leave less room for the next copies (the overlap term)."""
    rate = draw(st.sampled_from([1e6, 4e6]))
    traps = []
    for i in range(draw(st.integers(2, 8))):
        sizes = draw(st.lists(st.integers(50, 3000), min_size=1, max_size=3))
        copy_ms = 2 * sum(sizes) / rate * 1e3
        tensors = tuple(tensor(f"t{i}.{k}", n) for k, n in enumerate(sizes))
        traps.append(TrapStat(f"trap{i}", draw(st.floats(0.0, 2.0)) * copy_ms, tensors))
    latency = draw(st.sampled_from([0.0, 0.01]))
    return Stats("copy-bound", device(rate, latency), tuple(traps))


@st.composite
def memory_problems(draw: st.DrawFn) -> Problem:
    stats = draw(st.one_of(random_stats(), layered_stats(), copy_bound_stats()))
    d = stats.device
    stats = replace(stats, device=replace(d, bandwidth_curve=draw(curves())))
    fraction = draw(st.floats(0.4, 1.1))
    config = PlanConfig(
        budget_bytes=max(1, int(fraction * total_bytes(stats))),
        activation_reserve_bytes=draw(st.sampled_from([0, 0, 512, 4096])),
        assignment=draw(st.sampled_from(ASSIGNMENTS)),
    )
    return problem_from_stats(stats, config)


def _plans(problem: Problem):
    for strategy in STRATEGIES:
        plan = try_solve(problem, strategy)
        if plan is not None:
            yield plan


def _simple_lb_ms(problem: Problem) -> float:
    """The benchmark's LB: max(total compute, copy time of (weight bytes - budget))."""
    assert problem.budget_bytes is not None
    gap = max(0, problem.total_bytes - problem.budget_bytes)
    return max(problem.compute_ms, problem.bandwidth.copy_ms(gap))


LIMITS = st.sampled_from([{}, {}, {"max_table_sums": 2}, {"max_table_sums": 8},
                          {"max_candidates": 2}, {"max_table_sums": 3, "max_candidates": 3},
                          {"max_overlap_ranges": 1}, {"max_overlap_ranges": 12}])  # fmt: skip


@settings(SETTINGS, max_examples=4 * EXAMPLES)
@given(memory_problems(), LIMITS)
def test_no_plan_beats_the_bound(problem: Problem, limits: dict[str, int]) -> None:
    # small limits force rounded tables, merged candidates, few ranges of R: still valid bounds
    bound = staging_bound(problem, **limits)
    for plan in _plans(problem):
        assert plan.makespan_ms >= bound.bound_ms * (1 - REL), (plan.strategy, bound)
        assert plan.streamed_bytes >= bound.deficit_bytes  # the memory half of the argument


@SETTINGS
@given(memory_problems(), LIMITS)
def test_rounding_and_merging_only_weaken_the_bound(problem: Problem, limits) -> None:
    exact = staging_bound(problem)
    rounded = staging_bound(problem, **limits)
    assert rounded.staging_ms <= exact.staging_ms * (1 + REL)


@st.composite
def aligned_stats(draw: st.DrawFn) -> Stats:
    """Tensors of whole 256-byte slots (no alignment padding), one rate, a per-copy latency."""
    traps = []
    for i in range(draw(st.integers(2, 6))):
        sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
        tensors = tuple(tensor(f"t{i}.{k}", 128 * n) for k, n in enumerate(sizes))
        traps.append(TrapStat(f"trap{i}", draw(st.floats(0.0, 3.0)), tensors))
    latency = draw(st.sampled_from([0.0, 0.01, 0.5]))
    return Stats("aligned", device(draw(st.sampled_from([1e6, 2e7])), latency), tuple(traps))


@SETTINGS
@given(aligned_stats(), st.floats(0.05, 1.0))
def test_the_staging_term_alone_is_at_least_the_simple_lb(stats: Stats, fraction: float) -> None:
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=int(fraction * total_bytes(stats))))
    bound = staging_bound(problem)
    simple = _simple_lb_ms(problem)
    assert bound.bound_ms >= simple * (1 - REL)
    if bound.deficit_bytes > 0 and bound.exact:
        # (D + m) x per-byte time at m >= (D + m) x per-byte time at D + m >= copy_ms(D)
        assert bound.staging_ms >= problem.bandwidth.copy_ms(bound.deficit_bytes) * (1 - REL)


def test_bench_like_instance_is_tighter_than_the_simple_lb() -> None:
    # 16 equal layers of 4 MiB + 2 MiB, 1 ms compute, 1 GB/s with 0.01 ms per copy, 50% budget:
    # every plan streams half the weights plus the largest trap's share, so LB* > LB
    traps = tuple(
        TrapStat(f"l{i}", 1.0, (tensor(f"l{i}.a", 2 << 20), tensor(f"l{i}.b", 1 << 20)))
        for i in range(16)
    )
    stats = Stats("layers", device(1e9, 0.01), traps)
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=total_bytes(stats) // 2))
    bound = staging_bound(problem)
    assert bound.bound_ms > _simple_lb_ms(problem) * 1.05
    assert solve(problem).makespan_ms >= bound.bound_ms


def test_hand_worked_instance() -> None:
    # traps: [2560 B, 1280 B], [2560 B, 1280 B], [5120 B]; 1 ms each; 1000 bytes/ms, 0.5 ms per
    # copy; budget 9000 of 12800 bytes, no reserve: D = 12800 - 9000 = 3800.
    # m (the most one trap streams) and sum of caps against D + m:
    #   1280: 1280 + 1280 + 0    = 2560  < 5080  infeasible
    #   2560: 2560 + 2560 + 0    = 5120  < 6360  infeasible
    #   3840: 3840 + 3840 + 0    = 7680 >= 7640  value 7640 x (0.5 / 3840 + 0.001) = 8.634792 ms
    #   5120: 3840 + 3840 + 5120 = 12800 >= 8920 value 8920 x (0.5 / 5120 + 0.001) = 9.791094 ms
    # total compute 3 ms, simple LB copy_ms(3800) = 4.3 ms, so the bound is 7.64 + 0.5 x 7640/3840.
    traps = (
        TrapStat("a", 1.0, (tensor("a.w", 1280), tensor("a.v", 640))),
        TrapStat("b", 1.0, (tensor("b.w", 1280), tensor("b.v", 640))),
        TrapStat("c", 1.0, (tensor("c.w", 2560),)),
    )
    stats = Stats("hand", device(1e6, 0.5), traps)
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=9000))
    bound = staging_bound(problem)
    assert bound.deficit_bytes == 3800
    assert bound.max_trap_bytes == 3840
    assert bound.simple_ms == pytest.approx(4.3)
    assert bound.bound_ms == pytest.approx(7.64 + 0.5 * 7640 / 3840, rel=1e-12)
    for plan in _plans(problem):
        assert plan.makespan_ms >= bound.bound_ms * (1 - REL)


def test_no_feasible_plan_gives_an_infinite_bound() -> None:
    # two traps of one 2560-byte tensor each and a budget under one trap's tensor: nothing fits
    traps = tuple(TrapStat(f"l{i}", 1.0, (tensor(f"l{i}.w", 1280),)) for i in range(2))
    problem = problem_from_stats(Stats("tiny", device(), traps), PlanConfig(budget_bytes=2000))
    assert staging_bound_ms(problem) == math.inf
    with pytest.raises(BudgetError):
        solve(problem)


@given(random_stats())
@settings(max_examples=20, deadline=None)
def test_latency_mode_is_total_compute(stats: Stats) -> None:
    problem = problem_from_stats(stats, PlanConfig())
    assert staging_bound_ms(problem) == problem.compute_ms
    assert solve(problem).makespan_ms >= problem.compute_ms * (1 - REL)


def test_hand_worked_overlap_term() -> None:
    # 4 layers of one 2560-byte tensor, 2.02 ms compute each; 1000 bytes/ms, no latency, so every
    # copy takes q = 0.001 ms per byte; budget 5120 of 10240 bytes: D = 5120.
    # Staging term: m = 2560, (D + m) q = 7.68 ms; total compute 8.08 ms; simple LB 5.12 ms.
    # Overlap term, with R = S - D the most staging: c / q = 2020 bytes, each trap streams
    # min(2560, max(0, R - 2020)) bytes for free, the idle paid anyway is 4 max(0, 2.02 - qR):
    #   R in [1707, 2020]: 2q(D + R) + 4 (2.02 - qR)       = 18.32 - 0.002 R (falls)
    #   R in [2020, 4580]: q(D + R) + q(D + R - 4(R - 2020)) = 18.32 - 0.002 R while D + R >= F,
    #                      i.e. up to R = (D + 4 x 2020) / 3 = 4400, then q(D + R) (rises)
    # so the least is q(D + 4400) = 9.52 ms, above compute and staging: the bound.
    traps = tuple(TrapStat(f"l{i}", 2.02, (tensor(f"l{i}.w", 1280),)) for i in range(4))
    problem = problem_from_stats(Stats("hand", device(1e6), traps), PlanConfig(budget_bytes=5120))
    bound = staging_bound(problem)
    assert (bound.deficit_bytes, bound.max_trap_bytes) == (5120, 2560)
    assert bound.staging_ms == pytest.approx(7.68) and bound.compute_ms == pytest.approx(8.08)
    assert bound.overlap_ms == pytest.approx(9.52, rel=1e-5)
    assert bound.bound_ms == bound.overlap_ms <= 9.52 * (1 + 1e-12)
    plans = list(_plans(problem))
    assert plans and all(plan.makespan_ms >= bound.bound_ms * (1 - REL) for plan in plans)


def _copy_bound_problem(rng: random.Random) -> Problem:
    """4-9 layers computing 0.3-1.2 x their own copy time, a budget of 45-85% of the weights."""
    rate = rng.choice([1e6, 4e6])
    traps = []
    for i in range(rng.randint(4, 9)):
        elems = [rng.randint(500, 3000) for _ in range(rng.randint(1, 3))]
        compute = rng.uniform(0.3, 1.2) * 2 * sum(elems) / rate * 1e3  # x its own copy time
        traps.append(
            TrapStat(f"l{i}", compute, tuple(tensor(f"l{i}.{k}", n) for k, n in enumerate(elems)))
        )
    stats = Stats("copy-bound", device(rate, rng.choice([0.0, 0.01])), tuple(traps))
    budget = int(rng.uniform(0.45, 0.85) * total_bytes(stats))
    return problem_from_stats(stats, PlanConfig(budget_bytes=budget))


def test_the_overlap_term_binds_on_copy_bound_layers() -> None:
    # layers computing about as long as their copies: on many, the overlap term is above every
    # other term (so a wrong overlap term would put the bound above some plan here)
    binding = 0
    for seed in range(40):
        problem = _copy_bound_problem(random.Random(seed))
        bound = staging_bound(problem)
        others = max(bound.compute_ms, bound.simple_ms, bound.staging_ms)
        binding += bound.overlap_ms > others * 1.01
        for plan in _plans(problem):
            assert plan.makespan_ms >= bound.bound_ms * (1 - REL), (seed, plan.strategy, bound)
    assert binding >= 8


@SETTINGS
@given(memory_problems(), st.integers(1, 2000), st.floats(1.0, 3.0))
def test_the_overlap_term_grows_with_the_deficit_and_compute(
    problem: Problem, less_bytes: int, scale: float
) -> None:
    # a smaller budget only raises D and narrows the feasible R, longer compute only idles the
    # engine more: the least value cannot fall (up to the stopping gap of the search)
    assert problem.budget_bytes is not None
    bound = staging_bound(problem)
    tighter = staging_bound(
        replace(problem, budget_bytes=max(1, problem.budget_bytes - less_bytes))
    )
    slower = replace(problem, traps=tuple(replace(t, compute_ms=t.compute_ms * scale)
                                          for t in problem.traps))  # fmt: skip
    assert tighter.overlap_ms >= bound.overlap_ms * (1 - 1e-4)
    assert staging_bound(slower).overlap_ms >= bound.overlap_ms * (1 - 1e-4)


def test_the_overlap_term_is_zero_without_a_deficit_or_a_budget() -> None:
    stats = uniform_stats(6, compute_ms=0.1)
    roomy = problem_from_stats(stats, PlanConfig(budget_bytes=total_bytes(stats)))
    latency = problem_from_stats(stats, PlanConfig())
    tight = problem_from_stats(stats, PlanConfig(budget_bytes=total_bytes(stats) // 2))
    assert staging_bound(roomy).deficit_bytes <= 0
    assert staging_bound(roomy).overlap_ms == staging_bound(latency).overlap_ms == 0.0
    assert staging_bound(tight).overlap_ms > 0.0  # the same layers with a deficit: positive
    negative = replace(tight, bandwidth=replace(tight.bandwidth, latency_ms=-0.01))
    assert staging_bound(negative).overlap_ms == 0.0  # no per-byte argument: left to compute
