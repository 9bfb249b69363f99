"""BudgetError says a smallest feasible budget only when it is one: above the budget that
failed, honouring `min_blocks`, and within 1/1024 of the boundary (that much less has no plan);
when it cannot, it says what else to change."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import ASSIGNMENTS, problem_from_stats, solve
from flextensor_compile.solve.search import LEAST_TOLERANCE
from flextensor_compile.stats import Stats, TensorStat, TrapStat, load_stats
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import DeviceSpec, PlanConfig
from tests.solve.instances import random_stats, total_bytes

EXAMPLES = int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60"))
STATS = os.path.join(
    os.path.dirname(__file__), "..", "..", "profiles", "tiny_transformer.stats.json"
)


def _claimed(message: str) -> int | None:
    found = re.search(r"smallest feasible budget is (\d+) bytes", message)
    return int(found.group(1)) if found else None


def test_min_blocks_the_assignment_cannot_give_is_not_a_smaller_budget() -> None:
    stats = load_stats(STATS)
    device = stats.device.memory_bytes
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=device // 2, min_blocks=3))
    try:
        solve(problem)
    except BudgetError as exc:
        least = _claimed(str(exc))
        assert least is None or least > device // 2, str(exc)
        assert "lower --min-blocks (now 3)" in str(exc)
    else:  # a plan with three blocks fits: it has them
        assert len(solve(problem).block_bytes) >= 3


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_stats(), st.floats(0.05, 0.9), st.integers(1, 4), st.sampled_from(ASSIGNMENTS))
def test_a_claimed_smallest_budget_is_above_the_one_that_failed(
    stats, fraction: float, min_blocks: int, assignment: str
) -> None:
    budget = max(1, int(fraction * total_bytes(stats)))
    min_blocks = 1 if assignment == "ring" else min_blocks  # the ring is one block
    config = PlanConfig(budget_bytes=budget, min_blocks=min_blocks, assignment=assignment)
    try:
        solve(problem_from_stats(stats, config))
    except BudgetError as exc:
        least = _claimed(str(exc))
        assert least is None or least > budget, str(exc)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_stats(), st.floats(0.05, 0.99))
def test_the_claimed_smallest_budget_is_never_above_keeping_everything_resident(
    stats, fraction: float
) -> None:
    """A plan that streams nothing fits the weight bytes: the least claimed is never more (in a
    small model block alignment can make every streaming plan larger), and it is a budget a
    plan fits."""
    budget = max(1, int(fraction * total_bytes(stats)))
    try:
        solve(problem_from_stats(stats, PlanConfig(budget_bytes=budget)))
    except BudgetError as exc:
        least = _claimed(str(exc))
        assert least is not None and least <= total_bytes(stats), str(exc)
        assert exc.least_bytes == least
        solve(problem_from_stats(stats, PlanConfig(budget_bytes=least)))  # raises if it is not


def _odd_ring(traps: int) -> Stats:
    """`traps` traps of one 1 MiB tensor each: with two blocks an odd count cannot all stream
    (the last trap and the first of the next iteration would share a block)."""
    mib = 1 << 20
    device = DeviceSpec("dev", 1 << 34, 25e9, h2d_latency_ms=0.008)
    return Stats("odd", device, tuple(
        TrapStat(f"layers.{i}", 1.0, (TensorStat(f"layers.{i}.w", mib, "float32", (mib // 4,)),))
        for i in range(traps)))  # fmt: skip


@pytest.mark.parametrize("traps", [7, 11, 12])
def test_two_blocks_and_an_odd_trap_count_claim_the_budget_a_plan_has(traps: int) -> None:
    """All but one trap stream through two 1 MiB blocks: 3 MiB (not the 6-8 MiB of streaming
    every other trap)."""
    config = PlanConfig(budget_bytes=1, num_blocks=2, min_blocks=2)
    with pytest.raises(BudgetError) as info:
        solve(problem_from_stats(_odd_ring(traps), config))
    least = (2 if traps % 2 == 0 else 3) << 20
    assert info.value.least_bytes == least == _claimed(str(info.value))
    at = solve(problem_from_stats(_odd_ring(traps), replace(config, budget_bytes=least)))
    assert at.peak_bytes == least and len(at.block_bytes) == 2


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_stats(), st.integers(1, 3), st.sampled_from(ASSIGNMENTS))
def test_the_claimed_smallest_budget_is_within_its_tolerance(
    stats, blocks: int, assignment: str
) -> None:
    """A plan fits the budget claimed, none fits 1/1024 of it less."""
    blocks = 1 if assignment == "ring" else blocks
    config = PlanConfig(budget_bytes=1, num_blocks=blocks, min_blocks=blocks,
                        assignment=assignment)  # fmt: skip
    try:
        solve(problem_from_stats(stats, config))
    except BudgetError as exc:
        least, message = exc.least_bytes, str(exc)
    else:
        return  # nothing streams and nothing is stored: any budget holds
    assert least is not None and least == _claimed(message)
    assert solve(problem_from_stats(stats, replace(config, budget_bytes=least))).peak_bytes <= least
    below = least - max(1, least // LEAST_TOLERANCE)
    with pytest.raises(BudgetError):
        solve(problem_from_stats(stats, replace(config, budget_bytes=below)))


def test_a_budget_error_says_when_most_weights_cannot_stream() -> None:
    """Every trap runs twice per iteration: nothing may stream, and the error says so (not only
    the smallest budget, which then reads as the solver failing)."""
    from tests.solve.instances import uniform_stats

    stats = uniform_stats(6)
    twice = replace(stats, traps=tuple(replace(t, calls=2) for t in stats.traps))
    budget = total_bytes(twice) // 2
    try:
        solve(problem_from_stats(twice, PlanConfig(budget_bytes=budget)))
    except BudgetError as exc:
        message = str(exc)
    else:
        raise AssertionError("a plan streamed weights of traps that run twice")
    assert f"{total_bytes(twice)} of the {total_bytes(twice)} weight bytes cannot stream" in message
    assert "its trap runs 2 times per iteration" in message
    with pytest.raises(BudgetError) as info:  # every weight may stream: no such note
        solve(problem_from_stats(stats, PlanConfig(budget_bytes=1)))
    assert "cannot stream" not in str(info.value)


def test_a_smallest_budget_over_the_device_asks_for_a_larger_device() -> None:
    """A --budget whose smallest feasible budget is more than the device has names the device,
    not a --budget the device cannot give."""
    stats = load_stats(STATS)
    memory = 3 << 20
    stats = replace(stats, device=replace(stats.device, memory_bytes=memory, kind="cuda"))
    config = PlanConfig(budget_bytes=2 << 20, activation_reserve_bytes=2 << 20)
    with pytest.raises(BudgetError) as caught:
        solve(problem_from_stats(stats, config))
    message = str(caught.value)
    least = _claimed(message)
    assert least is not None and least > memory
    assert f"that is more than the device's {memory} bytes" in message
    assert "raise --budget" not in message and "lower --activation-reserve" in message
    # under the device's memory the hint still names the budget to pass
    roomy = replace(stats, device=replace(stats.device, memory_bytes=64 << 20))
    with pytest.raises(BudgetError, match=r"raise --budget to at least \d+ bytes"):
        solve(problem_from_stats(roomy, config))


def test_the_cannot_stream_note_names_the_reason_with_the_most_bytes() -> None:
    """Five tiny tensors pinned as tiny, one large one pinned as its trap runs twice: the note's
    reason and example are the large one's (it was the commonest reason, by count)."""
    big, mid, tiny = 100 << 20, 10 << 20, 1 << 10
    twice = TrapStat("twice", 1.0, (TensorStat("twice.w", big, "int8", (big,)),), calls=2)
    once = TrapStat("once", 1.0, (TensorStat("once.w", mid, "int8", (mid,)), *(
        TensorStat(f"once.b{k}", tiny, "int8", (tiny,)) for k in range(5))))  # fmt: skip
    stats = Stats("mixed", DeviceSpec("dev", 1 << 40, 1e10, kind="target"), (twice, once))
    with pytest.raises(BudgetError) as caught:
        solve(problem_from_stats(stats, PlanConfig(budget_bytes=big // 2)))
    message = str(caught.value)
    assert "cannot stream (e.g. 'twice.w': its trap runs 2 times per iteration)" in message
