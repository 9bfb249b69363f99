"""Properties every plan must have, on random problems (hypothesis)."""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from flextensor_compile.planning import plan_profile, try_solve_stats
from flextensor_compile.solve import ASSIGNMENTS, STRATEGIES
from flextensor_compile.stats import Stats
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import (
    PlanConfig,
    Profile,
    Transfer,
    check_profile,
    dumps,
    loads,
    occupied_slots,
)
from tests.solve.instances import random_stats, total_bytes, uniform_stats

SETTINGS = settings(
    max_examples=int(os.environ.get("FLEXTENSOR_SOLVER_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _config(stats: Stats, fraction: float | None, strategy: str) -> PlanConfig:
    budget = None if fraction is None else max(1, int(fraction * total_bytes(stats)))
    return PlanConfig(budget_bytes=budget, strategy=strategy)


def _plan(stats: Stats, config: PlanConfig) -> Profile | None:
    try:
        return plan_profile(stats, config, tool_version="t", torch_version="t")
    except BudgetError:
        return None


fractions = st.one_of(st.none(), st.floats(0.05, 1.3))


@SETTINGS
@given(random_stats(), fractions, st.sampled_from(STRATEGIES), st.sampled_from(ASSIGNMENTS))
def test_profile_is_valid_and_round_trips(stats: Stats, fraction, strategy: str, assignment):
    config = replace(_config(stats, fraction, strategy), assignment=assignment)
    profile = _plan(stats, config)
    if profile is None:
        return
    check_profile(profile)
    assert loads(dumps(profile)) == profile
    if profile.config.budget_bytes is not None:
        assert profile.predicted.peak_bytes <= profile.config.budget_bytes


@SETTINGS
@given(random_stats(), fractions, st.sampled_from(STRATEGIES))
def test_each_streamed_tensor_copied_once_into_a_large_enough_block(stats, fraction, strategy):
    profile = _plan(stats, _config(stats, fraction, strategy))
    if profile is None:
        return
    blocks = {b.id: b.bytes for b in profile.blocks}
    per_trap = defaultdict(list)
    for t in profile.schedule:
        per_trap[t.trap].append(t)
        assert t.offset + t.bytes <= blocks[t.block]
    for order, trap in enumerate(profile.traps):
        streamed = [e for e in trap.tensors if e.placement == "streamed" and e.tie is None]
        assert bool(per_trap[order]) == bool(streamed)
        carried = defaultdict(int)
        for e in streamed:
            inside = [t for t in per_trap[order] if t.block == e.block and t.offset <= e.offset
                      and e.offset + e.bytes <= t.offset + t.bytes]  # fmt: skip
            assert len(inside) == 1  # exactly one copy brings it in
            carried[inside[0]] += 1
        assert set(carried) == set(per_trap[order])  # and no transfer carries nothing


def _blocks_users(profile: Profile) -> dict[int, list]:
    users = defaultdict(list)
    for t in profile.schedule:
        users[t.block].append(t)
    return users


def _held_together(profile: Profile) -> list[tuple[Transfer, Transfer]]:
    """Pairs of transfers that hold bytes of one block during a common trap."""
    n = len(profile.traps)
    return [
        (a, b)
        for transfers in _blocks_users(profile).values()
        for a, b in itertools.combinations(transfers, 2)
        if set(occupied_slots(a, n)) & set(occupied_slots(b, n))
    ]


def _disjoint(a: Transfer, b: Transfer) -> bool:
    return a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset


# only the ring holds several transfers in one block at once; round robin gives each its block
@SETTINGS
@given(random_stats(), fractions, st.sampled_from(ASSIGNMENTS))
@example(uniform_stats(8), 0.5, "ring")  # random instances rarely give such a ring plan
def test_no_two_held_transfers_share_block_bytes(stats: Stats, fraction, assignment) -> None:
    profile = _plan(stats, replace(_config(stats, fraction, "adaptive"), assignment=assignment))
    if profile is None:
        return
    together = _held_together(profile)
    event(f"{assignment}: {'several transfers held in one block' if together else 'none'}")
    for a, b in together:
        assert _disjoint(a, b), (a, b)


@pytest.mark.parametrize(("layers", "fraction"), [(4, None), (8, 0.5), (12, 0.7)])
def test_ring_plans_hold_transfers_together_at_disjoint_bytes(layers, fraction) -> None:
    # the property above is vacuous unless some plan holds two transfers in one block at once
    stats = uniform_stats(layers)
    config = replace(_config(stats, fraction, "adaptive"), assignment="ring")
    profile = plan_profile(stats, config, tool_version="t", torch_version="t")
    together = _held_together(profile)
    assert together, "the ring plan holds one transfer at a time"
    assert all(_disjoint(a, b) for a, b in together), together


@SETTINGS
@given(random_stats(), fractions)
def test_a_copy_never_starts_before_the_bytes_last_reader_finished(stats, fraction) -> None:
    config = _config(stats, fraction, "adaptive")
    solved = try_solve_stats(stats, config)
    if solved is None:
        return
    plan = solved[1]
    sim = plan.simulation
    n = len(sim.trap_spans_ms)
    start_of = {k: start for k, (_, start, _) in zip(sim.copy_jobs, sim.copy_spans_ms, strict=True)}
    assert sorted(start_of) == list(range(len(plan.transfers)))  # one copy per transfer
    for k, x in enumerate(plan.transfers):
        # the last reader of the bytes it overwrites is trap issue_at - 1 at the latest (the
        # slots test above); the copy starts after that trap ended, in its iteration
        before = (x.issue_at - 1) % n
        end = sim.trap_spans_ms[before][1] if x.issue_at else 0.0
        if x.issue_at > x.trap:
            end -= sim.makespan_ms  # issued in the previous iteration
        assert start_of[k] >= end - 1e-9


@SETTINGS
@given(random_stats(), fractions, st.sampled_from(STRATEGIES))
def test_output_is_deterministic(stats: Stats, fraction, strategy: str) -> None:
    config = _config(stats, fraction, strategy)
    first, second = _plan(stats, config), _plan(stats, config)
    assert (first is None) == (second is None)
    if first is not None and second is not None:
        assert dumps(first) == dumps(second)


@SETTINGS
@given(random_stats(), st.floats(0.05, 0.9))
def test_budget_error_names_a_budget_that_works(stats: Stats, fraction: float) -> None:
    config = _config(stats, fraction, "adaptive")
    try:
        plan_profile(stats, config)
        return
    except BudgetError as exc:
        message = str(exc)
    least = int(message.split("at least ")[1].split(" bytes")[0])
    assert least > (config.budget_bytes or 0)
    profile = plan_profile(stats, PlanConfig(budget_bytes=least))
    assert profile.predicted.peak_bytes <= least


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_fits_a_tight_budget(strategy: str) -> None:
    stats = uniform_stats(12)
    budget = int(0.5 * total_bytes(stats))
    profile = plan_profile(stats, PlanConfig(budget_bytes=budget, strategy=strategy))
    assert profile.predicted.peak_bytes <= budget
    assert profile.predicted.streamed_bytes > 0


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_an_odd_cycle_of_streaming_traps_is_scheduled(assignment: str) -> None:
    stats = uniform_stats(7, compute_ms=100.0)  # latency mode: every trap's copy fits its window
    profile = plan_profile(stats, PlanConfig(assignment=assignment))
    check_profile(profile)
    assert len(profile.schedule) == 7 and profile.predicted.stall_ms == 0


def test_activation_reserve_counts_against_the_budget() -> None:
    from tests.solve.instances import device

    stats = replace(uniform_stats(12), device=device(1e5))  # copies dominate: streaming costs
    budget = int(0.6 * total_bytes(stats))
    reserve = budget // 5
    profile = plan_profile(stats, PlanConfig(budget_bytes=budget, activation_reserve_bytes=reserve))
    p = profile.predicted
    assert p.peak_bytes == p.resident_bytes + sum(b.bytes for b in profile.blocks) + reserve
    assert p.peak_bytes <= budget
    without = plan_profile(stats, PlanConfig(budget_bytes=budget))
    assert p.streamed_bytes > without.predicted.streamed_bytes  # the reserve forces more streaming
