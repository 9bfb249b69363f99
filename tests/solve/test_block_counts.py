"""A fixed block count (`num_blocks` / `min_blocks`) constrains plans without losing them.

Two blocks cannot serve an odd number of traps that all stream (adjacent traps would share a
block), and an assignment may leave blocks unused that `min_blocks` asks for: the strategies
must still find the plans that do fit, and a larger budget never fails where a smaller fitted.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import STRATEGIES, problem_from_stats, solve
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, random_stats, tensor, total_bytes

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
MIB_ELEMS = 1 << 19  # bfloat16 elements in 1 MiB


def _odd_stack(traps: int = 7) -> Stats:
    """`traps` equal traps (an odd count), copies twice as long as compute."""
    return Stats("odd", device(1e9), tuple(
        TrapStat(f"l{i}", 0.5, (tensor(f"l{i}.w", MIB_ELEMS),)) for i in range(traps)
    ))  # fmt: skip


def _alternating(layers: int = 8) -> Stats:
    """Large and small traps in turn (the small ones hold a tenth of the bytes)."""
    traps = []
    for i in range(layers):
        elems = MIB_ELEMS if i % 2 else MIB_ELEMS // 10
        traps.append(TrapStat(f"l{i}", 0.5, (tensor(f"l{i}.w", elems),)))
    return Stats("alternating", device(1e9), tuple(traps))


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
    stats = _alternating()
    weights = total_bytes(stats)
    # the four large tensors stream: least growth would put them in one or two blocks
    budget = weights - 4 * (1 << 20) + 3 * (1 << 20) + 4096
    for min_blocks in (2, 3):
        config = PlanConfig(budget_bytes=budget, num_blocks=3, min_blocks=min_blocks)
        plan = solve(problem_from_stats(stats, config))
        assert len(plan.block_bytes) >= min_blocks
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
        try:
            plans.append(solve(problem_from_stats(stats, config)))
        except BudgetError:
            plans.append(None)
    assert plans[0] is None or plans[1] is not None
