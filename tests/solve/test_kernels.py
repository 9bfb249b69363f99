"""The exact subset-sum kernel and the bandwidth model, against brute force and their contracts."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import BandwidthModel, SubsetTable, problem_from_stats, solve
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import random_stats


def brute_best(sizes: tuple[int, ...], cap: float) -> int:
    best = 0
    for r in range(len(sizes) + 1):
        for combo in combinations(sizes, r):
            if best < sum(combo) <= cap:
                best = sum(combo)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), max_size=10), st.integers(0, 60_000))
def test_subset_table_equals_brute_force(sizes: list[int], cap: int) -> None:
    table = SubsetTable.build(tuple(sizes))
    k = table.best_within(cap)
    assert table.exact
    assert table.sums[k] == brute_best(tuple(sizes), cap)
    assert sum(sizes[i] for i in table.subset(k)) == table.sums[k]
    assert len(set(table.subset(k))) == len(table.subset(k))


def test_subset_table_thins_large_instances_but_keeps_the_full_set() -> None:
    sizes = tuple(1000 + 37 * k * k for k in range(20))
    table = SubsetTable.build(sizes)
    assert not table.exact
    assert table.sums[-1] == sum(sizes)
    assert list(table.sums) == sorted(set(table.sums))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 1 << 30), st.floats(1e6, 5e10)), max_size=6),
    st.floats(0.0, 0.05),
    st.integers(0, 1 << 31),
)
def test_bandwidth_is_monotone_and_inverts(points: list, latency: float, nbytes: int) -> None:
    model = BandwidthModel.from_curve(tuple(points), 2e10, latency)
    assert model.copy_ms(nbytes + 4096) >= model.copy_ms(nbytes)
    ms = model.copy_ms(nbytes)
    got = model.bytes_within(ms)
    assert model.copy_ms(got) <= ms + 1e-9
    slack = max(2, int(nbytes * 1e-6))  # rounding of the inverse
    assert got + slack >= nbytes or model.copy_ms(got + slack) >= ms - 1e-9


def test_a_measured_copy_is_predicted_at_its_measured_time() -> None:
    # rates as `measure_cuda_copies` reports them: bytes over the whole copy's time
    times_ms = {1 << 20: 0.029, 1 << 24: 0.344, 1 << 28: 5.377}
    points = tuple((b, b / (ms / 1e3)) for b, ms in times_ms.items())
    model = BandwidthModel.from_curve(points, 50e9, 0.008)
    for nbytes, ms in times_ms.items():
        assert abs(model.copy_ms(nbytes) - ms) < 1e-9  # the latency is not added a second time
    assert abs(model.copy_ms(1 << 19) - (0.008 + (0.029 - 0.008) / 2)) < 1e-9  # latency intercept
    assert model.copy_ms(1 << 29) > 5.377


def test_measured_times_under_the_latency_or_falling_are_raised_to_a_monotone_curve() -> None:
    # a 64 KiB copy measured faster than the latency, a 4 MiB copy faster than a 1 MiB one
    points = (
        (1 << 16, (1 << 16) / 2e-6),
        (1 << 20, (1 << 20) / 40e-6),
        (1 << 22, (1 << 22) / 30e-6),
    )
    model = BandwidthModel.from_curve(points, 50e9, 0.008)
    assert model.copy_ms(1 << 16) == 0.008
    assert abs(model.copy_ms(1 << 20) - 0.040) < 1e-9
    assert abs(model.copy_ms(1 << 22) - 0.040) < 1e-9


def test_linear_fallback_uses_the_rate_and_latency() -> None:
    model = BandwidthModel.from_curve((), 1e9, 0.5)
    assert abs(model.copy_ms(1_000_000) - (0.5 + 1.0)) < 1e-12
    assert model.copy_ms(0) == 0.0
    assert model.bytes_within(0.4) == 0


def _window_ms(compute: list[float], kinds: list[str], i: int) -> float:
    """The compute before trap i, widened backwards over gap traps (the documented window)."""
    n, total, k = len(compute), 0.0, i - 1
    for _ in range(n - 1):
        total += compute[k % n]
        if kinds[k % n] != "gap":
            break
        k -= 1
    return total


@settings(max_examples=60, deadline=None)
@given(random_stats(max_traps=6, max_tensors=6), st.sampled_from([0.5, 1.0, 2.0]))
def test_knapsack_strategy_streams_the_brute_force_optimum_per_window(stats, scale) -> None:
    problem = problem_from_stats(
        stats, PlanConfig(strategy="knapsack", transfer_budget_scale=scale)
    )
    try:
        plan = solve(problem, "knapsack")
    except BudgetError:
        return
    compute = [t.compute_ms for t in problem.traps]
    kinds = [t.kind for t in problem.traps]
    for i, trap in enumerate(problem.traps):
        cap = problem.bandwidth.bytes_within(scale * _window_ms(compute, kinds, i))
        got = sum(trap.items[k].slot_bytes for k in plan.selection[i])
        assert got == brute_best(tuple(it.slot_bytes for it in trap.items), cap)
