"""A fixed block count (`num_blocks` / `min_blocks`) constrains plans without losing them.

Two blocks cannot serve an odd number of traps that all stream (adjacent traps would share a
block), and an assignment may leave blocks unused that `min_blocks` asks for: the strategies
must still find the plans that do fit, and a larger budget never fails where a smaller fitted.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import (
    STRATEGIES,
    assign_blocks,
    problem_from_stats,
    solve,
    try_solve,
)
from flextensor_compile.solve.assign import assigned_bytes
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, random_stats, tensor, total_bytes

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
MIB_ELEMS = 1 << 19  # bfloat16 elements in 1 MiB


def _odd_stack(traps: int = 7) -> Stats:
    """`traps` equal traps (an odd count), copies twice as long as compute."""
    return Stats("odd", device(1e9), tuple(
        TrapStat(f"l{i}", 0.5, (tensor(f"l{i}.w", MIB_ELEMS),)) for i in range(traps)
    ))  # fmt: skip


def test_two_blocks_and_an_odd_trap_count_fit_with_every_strategy() -> None:
    stats = _odd_stack()
    mib = 1 << 20
    # five of the seven tensors must stream (2 MiB resident + two 1 MiB blocks)
    config = PlanConfig(budget_bytes=4 * mib, num_blocks=2, min_blocks=2)
    problem = problem_from_stats(stats, config)
    for strategy in STRATEGIES:
        plan = solve(problem, strategy)
        assert plan.peak_bytes <= 4 * mib, strategy
        assert len(plan.block_bytes) == 2, strategy
        if strategy != "nth-layer":  # it streams every other trap or all of them
            assert plan.streamed_bytes <= 6 * mib, (strategy, plan.streamed_bytes)


def test_min_blocks_is_met_where_the_least_growth_order_uses_fewer() -> None:
    # least growth puts these four transfers in one block (each two traps from the last)
    traps, sizes = (1, 3, 5, 7), (4096, 4096, 4096, 4096)
    assert len(assign_blocks(traps, sizes, 8, 3, "least-growth").block_bytes) == 1
    for least in (2, 3):
        got = assign_blocks(traps, sizes, 8, 3, "least-growth", min_blocks=least)
        assert got is not None and len(got.block_bytes) == least
        assert assigned_bytes(traps, sizes, 8, 3, "least-growth", least) == least * 4096


def test_min_blocks_three_fits_a_budget_that_three_blocks_allow() -> None:
    # small and large traps in turn: before, the strategies fitted selections that least
    # growth put in fewer than three blocks, every plan was refused, and the budget failed
    spec = ((0.521, (66543, 116864, 80911)), (0.799, (1390368, 1196104)), (0.077, (177888,)),
            (0.711, (1307576, 404416)), (0.906, (109968, 76798)), (0.074, (446808,)))  # fmt: skip
    stats = Stats("mixed", device(1e8), tuple(
        TrapStat(f"l{i}", ms, tuple(tensor(f"l{i}.{k}", e) for k, e in enumerate(elems)))
        for i, (ms, elems) in enumerate(spec)
    ))  # fmt: skip
    budget = int(0.9 * total_bytes(stats))
    plan = solve(problem_from_stats(stats, PlanConfig(budget_bytes=budget, min_blocks=3)))
    assert len(plan.block_bytes) >= 3
    assert plan.peak_bytes <= budget


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    random_stats(max_traps=16),
    st.floats(0.05, 0.9),
    st.floats(0.01, 0.5),
    st.integers(1, 3),
    st.booleans(),
)
def test_a_larger_budget_fits_where_a_smaller_one_did(
    stats: Stats, fraction: float, more: float, blocks: int, fixed: bool
) -> None:
    weights = total_bytes(stats)
    plans = []
    for share in (fraction, fraction + more):
        config = PlanConfig(budget_bytes=max(1, int(share * weights)), min_blocks=blocks,
                            num_blocks=blocks if fixed else None)  # fmt: skip
        plans.append(try_solve(problem_from_stats(stats, config)))
    assert plans[0] is None or plans[1] is not None
