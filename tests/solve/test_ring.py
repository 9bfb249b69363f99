"""The ring layout: one staging block, each tensor placed where its bytes free up first."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_compile.config import plan_command
from flextensor_compile.planning import plan_profile, solve_stats
from flextensor_compile.solve import problem_from_stats, solve
from flextensor_compile.solve.plan import PlanCache, build_plan, ring_candidate
from flextensor_compile.solve.ring import ring_layout, ring_need
from flextensor_compile.solve.simulate import CopyJob, simulate
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import PlanConfig, Transfer, check_profile, occupied_slots
from tests.solve.instances import device, random_stats, tensor, total_bytes

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def moe_stats(layers: int = 8) -> Stats:
    """Small attention traps between large, slow expert traps, on a slow link: copies dominate
    and an expert trap computes longer than the next attention copy takes."""
    traps = []
    for i in range(layers):
        traps.append(TrapStat(f"attn{i}", 0.2, tuple(tensor(f"attn{i}.{k}", 20_000)
                                                    for k in range(4))))  # fmt: skip
        traps.append(TrapStat(f"moe{i}", 1.0, tuple(tensor(f"moe{i}.{k}", 50_000)
                                                   for k in range(8))))  # fmt: skip
    return Stats("moe", device(2e8), tuple(traps))


@st.composite
def selections(draw: st.DrawFn):
    stats = draw(random_stats(max_traps=8, max_tensors=5))
    problem = problem_from_stats(stats, PlanConfig())
    sel = tuple(tuple(k for k in range(len(t.items)) if draw(st.booleans())) for t in problem.traps)
    return problem, sel


@SETTINGS
@given(selections(), st.floats(1.0, 3.0), st.sampled_from(["release", "mirrored", "stacked"]))
def test_ring_places_each_tensor_once_and_never_overwrites_held_bytes(case, scale, placement
                                                                      ) -> None:  # fmt: skip
    problem, sel = case
    mirrored, stacked = placement == "mirrored", placement == "stacked"
    slots = tuple(
        sum(t.items[k].slot_bytes for k in ch) for t, ch in zip(problem.traps, sel, strict=True)
    )
    if not any(slots):
        return
    ring = int(max(ring_need(problem, slots), max(slots)) * scale)
    pieces = ring_layout(problem, sel, ring, mirrored, stacked)
    if pieces is None:  # only when a trap's transfer cannot fit at all
        assert max(slots) > ring - ring % 256
        return
    placed = Counter((x.trap, k) for x in pieces for k in x.items)
    assert placed == Counter((o, k) for o, ch in enumerate(sel) for k in ch)
    n = len(problem.traps)
    for x in pieces:
        assert x.offset >= 0 and x.offset + x.bytes <= ring
        assert x.bytes == sum(problem.traps[x.trap].items[k].slot_bytes for k in x.items)
    as_transfers = [Transfer(x.trap, 0, x.offset, x.bytes, x.issue_at, x.trap) for x in pieces]
    for a, b in itertools.combinations(as_transfers, 2):
        if a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset:
            continue
        assert a.trap != b.trap  # one trap's copies never overlap each other
        assert not set(occupied_slots(a, n)) & set(occupied_slots(b, n))


def pairs_stats(layers: int = 6) -> Stats:
    """Copy-bound traps of one small and one large tensor; the small one alone covers the copy
    engine while the trap before computes (0.2 ms at 2e8 B/s is 40 kB)."""
    traps = tuple(TrapStat(f"l{i}", 0.2, (tensor(f"l{i}.small", 25_000),
                                          tensor(f"l{i}.large", 60_000)))
                  for i in range(layers))  # fmt: skip
    return Stats("pairs", device(2e8), traps)


@SETTINGS
@given(selections())
def test_ring_need_in_whole_tensors_is_at_least_the_byte_estimate(case) -> None:
    problem, sel = case
    slots = tuple(
        sum(t.items[k].slot_bytes for k in ch) for t, ch in zip(problem.traps, sel, strict=True)
    )
    coarse = ring_need(problem, slots, sel)
    assert ring_need(problem, slots) <= coarse <= 2 * max(slots, default=0) + 255


def test_mirrored_ring_keeps_the_engine_busy_in_the_ring_it_needs() -> None:
    stats = pairs_stats()
    problem = problem_from_stats(stats, PlanConfig())
    sel = tuple(tuple(range(len(t.items))) for t in problem.traps)
    slots = tuple(t.streamable_slot_bytes for t in problem.traps)
    ring = ring_need(problem, slots, sel)
    assert ring == slots[0] + problem.traps[1].items[1].slot_bytes  # a trap and the next small
    compute = tuple(t.compute_ms for t in problem.traps)

    def makespan(mirrored: bool) -> float:
        pieces = ring_layout(problem, sel, ring, mirrored)
        assert pieces is not None
        jobs = tuple(CopyJob(x.trap, x.issue_at, problem.bandwidth.copy_ms(x.bytes))
                     for x in pieces)  # fmt: skip
        return simulate(compute, jobs).makespan_ms

    copies = sum(problem.bandwidth.copy_ms(s) for s in slots)
    assert makespan(True) == pytest.approx(copies, rel=1e-9)  # copies back to back
    assert makespan(False) > copies * 1.1  # by release, the copies wait for the traps


def test_ring_plan_keeps_the_better_placement_within_the_budget() -> None:
    stats = pairs_stats()
    problem = problem_from_stats(stats, PlanConfig())
    sel = tuple(tuple(range(len(t.items))) for t in problem.traps)
    slots = tuple(t.streamable_slot_bytes for t in problem.traps)
    budget = tight_budget(stats)
    bounded = problem_from_stats(stats, PlanConfig(budget_bytes=budget, assignment="ring"))
    plan = build_plan(bounded, sel, 1, "test", "ring")
    assert plan is not None and plan.peak_bytes <= budget
    copies = sum(problem.bandwidth.copy_ms(s) for s in slots)
    assert plan.makespan_ms == pytest.approx(copies, rel=1e-9)


def test_ring_wins_when_copy_bound_traps_are_uneven() -> None:
    stats = moe_stats()
    budget = int(0.5 * total_bytes(stats))
    _, plan = solve_stats(stats, PlanConfig(budget_bytes=budget))
    _, blocks_only = solve_stats(stats, PlanConfig(budget_bytes=budget, min_blocks=2))
    assert len(plan.block_bytes) == 1 and plan.peak_bytes <= budget
    assert any(x.offset for x in plan.transfers)  # traps share the block at offsets
    assert len(plan.transfers) > len({x.trap for x in plan.transfers})  # split traps
    assert plan.makespan_ms < blocks_only.makespan_ms * 0.99


def tight_budget(stats: Stats) -> int:
    """Everything streams in the ring `ring_need` asks for with whole tensors."""
    problem = problem_from_stats(stats, PlanConfig())
    sel = tuple(tuple(range(len(t.items))) for t in problem.traps)
    slots = tuple(t.streamable_slot_bytes for t in problem.traps)
    streamed = sum(it.bytes for t in problem.traps for it in t.items)
    return problem.total_bytes - streamed + ring_need(problem, slots, sel)


def test_ring_profile_is_valid_and_names_the_assignment() -> None:
    stats = pairs_stats()
    config = PlanConfig(budget_bytes=tight_budget(stats), assignment="ring", strategy="greedy")
    profile = plan_profile(stats, config)
    check_profile(profile)
    assert any(t.issue_at == t.trap for t in profile.schedule)  # a tight ring: on-entry copies
    assert len(profile.blocks) == 1
    assert "--assignment ring" in plan_command(profile.config)
    streamed = sum(e.bytes for t in profile.traps for e in t.tensors if e.placement == "streamed")
    assert streamed == profile.predicted.streamed_bytes


def test_ring_in_latency_mode_stages_at_most_ring_need_and_one_more_transfer() -> None:
    stats = replace(moe_stats(), device=device(2e9))
    problem = problem_from_stats(stats, PlanConfig(assignment="ring"))
    plan = solve(problem)
    slots = tuple(sum(t.items[k].slot_bytes for k in ch)
                  for t, ch in zip(problem.traps, plan.selection, strict=True))  # fmt: skip
    (block,) = plan.block_bytes
    assert max(slots) <= block <= ring_need(problem, slots) + max(slots)
    assert block == max(x.offset + x.bytes for x in plan.transfers)  # cut to the bytes used


@pytest.mark.parametrize("extra", [{"num_blocks": 2}, {"min_blocks": 2}])
def test_ring_with_more_blocks_is_a_config_error(extra) -> None:
    with pytest.raises(ConfigError, match="ring assignment uses one block"):
        problem_from_stats(moe_stats(), PlanConfig(assignment="ring", **extra))


def latency_bound_stats() -> Stats:
    """Six traps on a fast link with 0.5 ms a copy: a small trap costs more to copy than its
    bytes are worth, and at 65% of the weights only the tight ring fits."""
    sizes = ((500, 2048), (1_572_864,), (166_666,), (2_621_440, 1_572_864, 500),
             (2_621_440, 3_670_016), (524_288, 2048, 524_288, 8_388_608))  # fmt: skip
    compute = (0.01, 0.379, 0.0, 0.1, 1.0, 0.1)
    traps = tuple(TrapStat(f"l{i}", ms, tuple(tensor(f"l{i}.{k}", e) for k, e in enumerate(t)))
                  for i, (t, ms) in enumerate(zip(sizes, compute, strict=True)))  # fmt: skip
    return Stats("latency-bound", device(1e12, 0.5), traps)


def test_tight_ring_keeps_traps_resident_when_their_copies_cost_more() -> None:
    stats = latency_bound_stats()
    budget = int(0.65 * total_bytes(stats))
    problem, plan = solve_stats(stats, PlanConfig(budget_bytes=budget))
    every = tuple(tuple(range(len(t.items))) for t in problem.traps)
    whole = ring_candidate(problem, every, "nth-layer", PlanCache(), tight=True)
    assert whole is not None and whole.peak_bytes <= budget  # every trap streaming fits
    assert plan.peak_bytes <= budget
    assert plan.selection != every and any(plan.selection)  # some traps stay resident
    pairs = zip(plan.selection, problem.traps, strict=True)
    assert all(len(ch) in (0, len(t.items)) for ch, t in pairs)  # whole traps
    assert plan.makespan_ms < whole.makespan_ms / 1.4


def test_ring_stacks_whole_transfers_when_split_copies_cost_their_latency() -> None:
    """Two traps of two 16 MiB tensors, 0.5 ms a copy: placed by release in a ring of 1.5
    transfers the copies split and pay more latency; stacked (one copy a trap, as one block)
    is faster, and a larger budget no longer gets a slower plan than a smaller one."""
    traps = tuple(TrapStat(f"l{i}", ms, (tensor(f"l{i}.a", 1 << 23), tensor(f"l{i}.b", 1 << 23),
                                         tensor(f"l{i}.c", 512)))
                  for i, ms in enumerate((1.0, 0.0)))  # fmt: skip
    stats = Stats("latency", device(5e10, 0.5), traps)
    weights = total_bytes(stats)
    small = solve_stats(stats, PlanConfig(budget_bytes=int(0.55 * weights)))[1]
    problem, large = solve_stats(stats, PlanConfig(budget_bytes=int(0.8 * weights)))
    assert large.makespan_ms <= small.makespan_ms * (1 + 1e-9)
    assert len(large.transfers) == 2 and large.peak_bytes <= int(0.8 * weights)
    ring = problem.budget_bytes - problem.reserve_bytes - (problem.total_bytes - 2 * (1 << 25))
    for mirrored in (False, True):
        pieces = ring_layout(problem, large.selection, ring, mirrored)
        assert pieces is not None and len(pieces) > 2  # split: more copies, more latency
