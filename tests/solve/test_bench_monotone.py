"""`python -m bench.plan_quality.monotone`: its instances are seeded, and what it reports is
what solving at the two budgets gives."""

from __future__ import annotations

import random
import sys

import pytest

from bench.plan_quality import monotone
from flextensor_compile.solve import problem_from_stats, solve
from flextensor_runtime.profile import PlanConfig


def _makespan(seed: int, fraction: float) -> tuple[float, int]:
    stats, reserve = monotone.random_instance(random.Random(seed))
    weights = sum(t.bytes for trap in stats.traps for t in trap.tensors)
    config = PlanConfig(budget_bytes=int(weights * fraction) + reserve,
                        activation_reserve_bytes=reserve)  # fmt: skip
    plan = solve(problem_from_stats(stats, config))
    return plan.makespan_ms, plan.peak_bytes


def test_instances_are_seeded() -> None:
    a, b = (monotone.random_instance(random.Random(7)) for _ in range(2))
    assert a == b
    assert monotone.random_instance(random.Random(8)) != a


@pytest.mark.parametrize("seed", [22, 50])
def test_a_reported_finding_is_what_the_two_solves_give(seed: int) -> None:
    rise, peak = monotone.sweep_one(seed)
    for found in (rise, peak):
        if found is None:
            continue
        small_ms, small_peak = _makespan(seed, found.small)
        large_ms, large_peak = _makespan(seed, found.large)
        assert found.small < found.large
        if found is rise:
            assert large_ms / small_ms == pytest.approx(found.ratio) and found.ratio > 1
        else:
            assert large_ms == pytest.approx(small_ms, rel=1e-9) and large_peak > small_peak


def test_the_command_prints_its_counts(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["monotone", "--instances", "2", "--seed", "22"])
    monotone.main()
    out = capsys.readouterr().out
    assert "2 random instances" in out
    assert "a larger budget got a slower plan:" in out
    assert "a larger budget got an as fast plan with a higher peak:" in out


def test_compare_counts_faster_and_slower_plans() -> None:
    before = {"1 0.5": [2.0, 10], "1 0.6": [1.0, 10], "2 0.5": None, "3 0.5": [1.0, 5]}
    after = {"1 0.5": [1.0, 10], "1 0.6": [1.5, 10], "2 0.5": [1.0, 1], "3 0.5": [1.0, 4]}
    faster, slower = monotone.compare(before, after)
    assert faster == [2.0] and slower == [("1 0.6", 1.5)]
