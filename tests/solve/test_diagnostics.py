"""Explain, timeline and sweep on real plans of small instances."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flextensor_compile.explain import explain_profile, explanation_json
from flextensor_compile.planning import plan_profile
from flextensor_compile.solve import problem_from_stats, staging_bound_ms
from flextensor_compile.stats import Stats, TrapStat, load_stats
from flextensor_compile.sweep import (
    SAME_MAKESPAN,
    SweepPoint,
    parse_fractions,
    plot_sweep,
    smallest_near_fastest,
    stats_from_profile,
    sweep,
)
from flextensor_compile.timeline import one_period, plot_timeline, simulate_profile
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import PlanConfig, Profile
from tests.solve.instances import device, tensor, total_bytes, uniform_stats
from tests.solve.test_golden_plans import PROFILES

GOLDEN_STATS = PROFILES / "tiny_transformer.stats.json"


def _tied_stats() -> Stats:
    traps = [TrapStat("embed", 0.5, (tensor("embed.w", 4000),))]
    traps += [TrapStat(f"l{i}", 2.0, (tensor(f"l{i}.a", 3000), tensor(f"l{i}.b", 3000)))
              for i in range(6)]  # fmt: skip
    traps.append(TrapStat("head", 0.5, (tensor("head.w", 4000, tie="embed.w"),
                                        tensor("head.b", 2000, offloadable=False))))  # fmt: skip
    return Stats("tied", device(2e6), tuple(traps))


def _profile(stats: Stats, fraction: float) -> Profile:
    budget = int(fraction * total_bytes(stats))
    return plan_profile(stats, PlanConfig(budget_bytes=budget), command="test")


def test_explain_covers_every_tensor_and_block() -> None:
    profile = _profile(_tied_stats(), 0.6)
    expl = explain_profile(profile)
    assert [t.name for t in expl.tensors] == [e.name for e in profile.all_tensors()]
    streamed = [t for t in expl.tensors if t.placement == "streamed"]
    assert streamed and all("block" in t.reason for t in streamed)
    tied = next(t for t in expl.tensors if t.name == "head.w")
    assert tied.placement == "resident" and "shares storage with 'embed.w' (trap 0 'embed')" in (
        tied.reason
    )
    pinned = next(t for t in expl.tensors if t.name == "head.b")
    assert pinned.placement == "resident" and "not offloadable" in pinned.reason
    assert expl.strategy == profile.extensions["solver"]["strategy"] != "adaptive"
    listed = sorted(x[0] for row in expl.blocks for x in row.transfers)
    assert listed == sorted(t.trap for t in profile.schedule)
    assert expl.budget_left_bytes == profile.config.budget_bytes - profile.predicted.peak_bytes
    doc = json.loads(json.dumps(explanation_json(expl)))
    assert len(doc["tensors"]) == len(expl.tensors)
    assert doc["makespan_ms"] == profile.predicted.makespan_ms
    problem = problem_from_stats(_tied_stats(), profile.config)
    assert doc["bound_ms"] == staging_bound_ms(problem) <= doc["makespan_ms"] * (1 + 1e-9)
    assert doc["bound_ms"] > problem.compute_ms  # copy-bound: the bound is the staging term


def _reasons(profile: Profile) -> dict[str, str]:
    return {t.name: t.reason for t in explain_profile(profile).tensors}


def _equal_layers(compute_ms: float, per_trap: int, traps: int = 3) -> Stats:
    """`traps` traps of `per_trap` 1 MiB tensors on a 10 GB/s link (a copy: 0.105 ms)."""
    dev = replace(device(1e10), memory_bytes=10**9)
    return Stats("equal", dev, tuple(
        TrapStat(f"t{i}", compute_ms, tuple(tensor(f"t{i}.w{k}", 2**19) for k in range(per_trap)))
        for i in range(traps)))  # fmt: skip


def test_latency_reasons_compare_the_copy_with_the_window() -> None:
    # every copy fits its 10 ms window: the plan streaming one trap ties on makespan and peak
    # with streaming all three and streams fewer bytes (the reason was "does not fit")
    why = _reasons(plan_profile(_equal_layers(10.0, 1), PlanConfig()))
    kept = [r for r in why.values() if not r.startswith("streamed")]
    assert kept and all(r == (
        "latency mode: its copy (0.105 ms) fits the window (10.000 ms), but the plan the solver "
        "ranked first keeps it resident: plans rank by predicted makespan (30.000 ms here, and no "
        "plan predicts less, no stall), then by lower peak (3 MiB here), then by fewer streamed "
        "bytes (the nth-layer plan won)") for r in kept), kept  # fmt: skip
    assert not any("does not fit" in r for r in why.values())
    short = _reasons(plan_profile(_equal_layers(0.01, 1), PlanConfig()))
    assert short["t1.w0"] == ("latency mode: its copy (0.105 ms) is longer than the compute "
                              "before its trap (0.010 ms), so streaming it would stall")  # fmt: skip
    shared = _reasons(plan_profile(_equal_layers(0.15, 2, traps=4), PlanConfig()))
    assert shared["t1.w1"] == ("latency mode: its copy (0.105 ms) fits the window (0.150 ms) "
                               "alone, but its trap already streams 1 MiB, and both copies "
                               "(0.210 ms) do not fit it")  # fmt: skip


def test_memory_reason_quotes_the_budget() -> None:
    # the reason was "the budget holds without streaming it (0 bytes left); resident avoids a copy"
    profile = plan_profile(_equal_layers(0.01, 2, traps=4), PlanConfig(budget_bytes=7 * 2**20))
    assert _reasons(profile)["t0.w0"] == (
        "memory mode (peak 7 MiB of the 7 MiB budget, 0 B left): its copy (0.105 ms) is longer "
        "than the compute before its trap (0.010 ms), so streaming it would stall")  # fmt: skip


def test_an_alias_split_from_its_tie_names_the_other_member_not_itself() -> None:
    """Discovery records each member's own reason, but a profile keeps one per tie group (the
    canonical's: 'shares storage with head.w'), and --explain gave it to head.w too: 'head.w
    ... shares storage with head.w'. The alias now names the canonical tensor and its trap."""
    split = "and tied tensors split over traps stay resident"
    embed = replace(tensor("embed.w", 4000, offloadable=False),
                    pin_reason=f"it shares storage with 'head.w' (trap 'head'), {split}")  # fmt: skip
    head = replace(tensor("head.w", 4000, tie="embed.w", offloadable=False),
                   pin_reason=f"it shares storage with 'embed.w' (trap 'embed'), {split}")  # fmt: skip
    traps = [TrapStat("embed", 0.5, (embed,))]
    traps += [TrapStat(f"l{i}", 2.0, (tensor(f"l{i}.a", 3000),)) for i in range(3)]
    traps.append(TrapStat("head", 0.5, (head,)))
    why = _reasons(plan_profile(Stats("tied", device(2e6), tuple(traps)), PlanConfig()))
    assert why["head.w"] == ("kept resident: not offloadable: it shares storage with 'embed.w' "
                             f"(trap 0 'embed'), {split}")  # fmt: skip
    assert "'head.w'" in why["embed.w"] and "'embed.w'" not in why["embed.w"]


def test_not_offloadable_reasons_say_which_rule() -> None:
    traps = [TrapStat("embed", 0.5, (tensor("embed.w", 4000),))]
    traps += [TrapStat(f"l{i}", 2.0, (tensor(f"l{i}.a", 3000), tensor(f"l{i}.b", 3000)))
              for i in range(4)]  # fmt: skip
    excluded = replace(tensor("l1.b", 3000, offloadable=False),
                       pin_reason="the exclude pattern '*.b' matches it")  # fmt: skip
    traps[2] = TrapStat("l1", 2.0, (tensor("l1.a", 3000), excluded))
    buffer = replace(tensor("l2.pos", 3000, offloadable=False), kind="buffer")
    traps[3] = TrapStat("l2", 2.0, (tensor("l2.a", 3000), buffer))
    traps.append(TrapStat("head", 0.5, (tensor("head.w", 4000, tie="embed.w", offloadable=False),)))
    stats = Stats("pinned", device(2e6), tuple(traps))
    profile = plan_profile(stats, PlanConfig())
    why = _reasons(profile)
    assert why["l1.b"] == "kept resident: not offloadable: the exclude pattern '*.b' matches it"
    assert why["l2.pos"].startswith("kept resident: not offloadable: it is a buffer, and buffers "
                                    "stay resident unless an include pattern names them (add "
                                    "--include 'l2.pos' to the include patterns)")  # fmt: skip
    # marked not offloadable with no recorded reason (older stats): the profile shows the tie
    assert why["head.w"] == ("kept resident: not offloadable: it shares storage with 'embed.w' "
                             "(trap 0 'embed'), and tied tensors split over traps stay resident")  # fmt: skip
    assert why["embed.w"] == ("kept resident: not offloadable: it shares storage with 'head.w' "
                              "(trap 5 'head'), and tied tensors split over traps stay resident")  # fmt: skip
    doc = explanation_json(explain_profile(profile))
    assert {t["name"]: t["reason"] for t in doc["tensors"]} == why  # --json: the same reasons
    # re-planned from the profile, the recorded reason is kept (and the bytes are the same)
    again = plan_profile(stats_from_profile(profile), PlanConfig(), command="test")
    assert _reasons(again)["l1.b"] == why["l1.b"]


def test_explain_has_no_bound_when_the_measurements_no_longer_solve() -> None:
    profile = _profile(_tied_stats(), 0.6)
    broken = replace(profile, config=replace(profile.config, assignment="no-such-assignment"))
    assert explain_profile(broken).bound_ms is None


def test_timeline_replays_the_predicted_iteration(tmp_path) -> None:
    profile = _profile(uniform_stats(8), 0.5)
    sim = simulate_profile(profile)
    assert sim.makespan_ms == pytest.approx(profile.predicted.makespan_ms)
    assert sim.trap_stall_ms == pytest.approx(profile.predicted.trap_stall_ms)
    out = plot_timeline(profile, tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_copy_lane_shows_one_period() -> None:
    assert one_period(-10.0, -5.0, 100.0) == [(90.0, 5.0)]  # issued the iteration before
    assert one_period(-2.0, 3.0, 100.0) == [(98.0, 2.0), (0.0, 3.0)]  # wraps: split
    assert one_period(10.0, 20.0, 100.0) == [(10.0, 10.0)] and one_period(5.0, 5.0, 100.0) == []
    profile = _profile(uniform_stats(8), 0.5)
    sim = simulate_profile(profile)
    pieces = [p for _, a, b in sim.copy_spans_ms for p in one_period(a, b, sim.makespan_ms)]
    assert any(a < 0 for _, a, _ in sim.copy_spans_ms)  # this plan prefetches cyclically
    assert all(a >= 0 and a + w <= sim.makespan_ms + 1e-9 for a, w in pieces)
    assert sum(w for _, w in pieces) == pytest.approx(sim.copy_busy_ms)


@pytest.mark.filterwarnings("error::UserWarning")  # a glyph no font has warns
@pytest.mark.parametrize(
    ("command", "drawn"),
    [
        ("ftc plan \x1b[2J", "ftc plan \\x1b[2J"),  # a control character as its escape
        ("ftc plan $x^$", "ftc plan $x^$"),  # `$...$` is not read as math
        ("ftc $\\frac{$ x", "ftc $\\frac{$ x"),
    ],
)
def test_timeline_draws_the_recorded_command_as_written(
    tmp_path, command: str, drawn: str
) -> None:
    from xml.sax.saxutils import escape

    import matplotlib

    profile = _profile(uniform_stats(8), 0.5)
    odd = replace(profile, meta=replace(profile.meta, command=command))
    out = plot_timeline(odd, tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        svg = plot_timeline(odd, tmp_path / "t.svg").read_text()
    assert f">{escape(drawn)}: makespan " in svg


def test_parse_fractions() -> None:
    assert parse_fractions("0.2:0.4:0.1") == (0.2, 0.3, 0.4)
    assert parse_fractions("0.5,0.7") == (0.5, 0.7)
    assert parse_fractions("0.5,0.7,0.5,0.50") == (0.5, 0.7)  # each budget once
    for bad in ("0.4:0.2:0.1", "a:b:c", "0.1:1:0", "-0.5"):
        with pytest.raises(ConfigError):
            parse_fractions(bad)


def test_sweep_spans_infeasible_to_all_resident(tmp_path) -> None:
    stats = uniform_stats(10)
    points = sweep(stats, PlanConfig(), (0.01, 0.5, 1.0))
    assert points[0].makespan_ms is None and "budget" in points[0].error
    mid, full = points[1], points[2]
    assert mid.makespan_ms is not None and mid.peak_bytes is not None
    assert mid.peak_bytes <= mid.budget_bytes and (mid.streamed_bytes or 0) > 0
    assert full.stall_ms == 0 and full.peak_bytes is not None
    assert full.makespan_ms == pytest.approx(sum(t.compute_ms for t in stats.traps))
    assert points[0].bound_ms is None  # no plan: no bound shown
    for p in (mid, full):  # the bound never exceeds what the plan predicts; all resident: equal
        assert p.bound_ms is not None and p.bound_ms <= p.makespan_ms * (1 + 1e-9)
    assert full.bound_ms == pytest.approx(full.makespan_ms)
    # ranked by makespan, then peak: a larger budget never gets a higher peak at the same speed
    if mid.makespan_ms == pytest.approx(full.makespan_ms):
        assert full.peak_bytes <= mid.peak_bytes
    out = plot_sweep(points, tmp_path / "s.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_sweep_reports_progress_once_per_budget() -> None:
    ticks: list[int] = []
    points = sweep(uniform_stats(6), PlanConfig(), (0.01, 0.5, 1.0), lambda: ticks.append(1))
    assert len(ticks) == len(points) == 3  # an infeasible budget counts too


def test_sweep_peak_never_rises_with_the_budget_at_equal_makespan() -> None:
    stats = load_stats(GOLDEN_STATS)
    points = [p for p in sweep(stats, PlanConfig(), parse_fractions("0.3:1.0:0.1"))
              if p.makespan_ms is not None]  # fmt: skip
    assert len(points) >= 5
    for lo, hi in itertools.pairwise(points):
        assert hi.makespan_ms is not None and lo.makespan_ms is not None
        assert hi.makespan_ms <= lo.makespan_ms * (1 + 1e-9)
        if hi.makespan_ms == pytest.approx(lo.makespan_ms, rel=1e-9):
            assert hi.peak_bytes is not None and lo.peak_bytes is not None
            assert hi.peak_bytes <= lo.peak_bytes, (lo, hi)


def test_stats_recovered_from_a_profile_replan_to_the_same_plan() -> None:
    profile = _profile(_tied_stats(), 0.6)
    again = plan_profile(stats_from_profile(profile), profile.config, command="test")
    assert again.traps == profile.traps and again.schedule == profile.schedule


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0.5,nan", "every fraction must be a positive number"),
        ("0.5,inf", "every fraction must be a positive number"),
        ("0.1:inf:0.1", "use START:STOP:STEP"),
        ("0.1:1:0.0000001", r"give 9000001 budgets, more than 1000; use a larger STEP"),
        ("0.5:0.6:1e-300", r"give 1e\+299 budgets, more than 1000; use a larger STEP"),
    ],
)
def test_parse_fractions_rejects_non_finite_and_endless_sweeps(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_fractions(spec)


def test_smallest_budget_near_the_fastest_plan() -> None:
    def point(frac: float, ms: float | None) -> SweepPoint:
        return SweepPoint(frac, int(frac * 1000), frac, ms, 0.0, 0, 0, "x" if ms else None)

    points = (point(0.2, None), point(0.4, 130.0), point(0.6, 104.0), point(0.8, 100.0),
              point(1.0, 100.0))  # fmt: skip
    assert smallest_near_fastest(points, 0.0) == points[3]  # the first of the fastest
    assert smallest_near_fastest(points, 0.05) == points[2]
    assert smallest_near_fastest(points, 0.5) == points[1]
    assert smallest_near_fastest(points[:1], 0.05) is None
    # float sums of one plan differ in the last bits: still the same makespan
    noisy = (point(0.6, 100.0 + 3e-12), point(0.8, 100.0))
    assert smallest_near_fastest(noisy, 0.0) == noisy[0]


def test_budgets_with_a_slower_plan_than_a_smaller_budget_are_named() -> None:
    from flextensor_compile.cli.sweep_cmd import _pick_lines
    from flextensor_compile.sweep import slower_than_smaller

    def point(frac: float, ms: float | None) -> SweepPoint:
        return SweepPoint(frac, int(frac * 1000), frac, ms, 0.0, 0, 0, "x" if ms else None)

    points = (point(0.2, None), point(0.4, 130.0), point(0.6, 100.0), point(0.7, 100.0 + 1e-12),
              point(0.8, 103.0), point(0.9, 101.0), point(1.0, 99.0))  # fmt: skip
    assert slower_than_smaller(points) == [(points[4], points[2]), (points[5], points[2])]
    lines = _pick_lines(points, 1000)
    assert ("frac 0.80 plans 103.000 ms, slower than frac 0.60's 100.000 ms, whose plan fits it "
            "too: --budget 600 gets that plan") in lines  # fmt: skip
    assert not [x for x in lines if x.startswith("frac 0.70")]


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e3, 1e3, allow_nan=False), st.floats(0, 500, allow_nan=False),
       st.floats(1e-3, 300, allow_nan=False))  # fmt: skip
def test_one_period_keeps_a_copy_whole_and_inside_the_period(start, width, period) -> None:
    pieces = one_period(start, start + width, period)
    assert sum(w for _, w in pieces) == pytest.approx(min(width, period), abs=1e-6)
    assert all(a >= 0 and a + w <= period * (1 + 1e-12) and w > 0 for a, w in pieces)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.none() | st.floats(0.1, 1e4)), min_size=1,
                max_size=12), st.floats(0, 1))  # fmt: skip
@example([(1, 0.10000000000000002), (1, 0.1)], 0.0)  # equal up to float rounding: either
def test_smallest_near_fastest_is_the_smallest_budget_that_qualifies(raw, within) -> None:
    points = tuple(SweepPoint(b / 1e6, b, b / 1e6, ms, 0.0, 0, 0, "x" if ms else None)
                   for b, ms in raw)  # fmt: skip
    got = smallest_near_fastest(points, within)
    planned = [p for p in points if p.makespan_ms is not None]
    if not planned:
        assert got is None
        return
    # makespans within SAME_MAKESPAN (relative) of each other are the same plan's float sums
    limit = min(p.makespan_ms for p in planned) * (1 + within + SAME_MAKESPAN)
    assert got is not None and got.makespan_ms <= limit
    assert all(p.budget_bytes >= got.budget_bytes for p in planned if p.makespan_ms <= limit)
