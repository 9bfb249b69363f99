"""The block-shape floors of `python -m bench.plan_quality.floors`: hand-worked values, the
edge cases, and the command on one instance."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest

from bench.plan_quality import floors
from flextensor_compile.solve import problem_from_stats
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, uniform_stats


def _problem(budget: int, compute_ms: float = 0.1):
    # ten traps of a 2000-byte and a 1000-byte tensor; 1000 bytes/ms plus 0.1 ms a copy
    stats = replace(uniform_stats(10, compute_ms), device=device(1e6, 0.1))
    return problem_from_stats(stats, PlanConfig(budget_bytes=budget))


def test_floors_by_hand() -> None:
    p = _problem(24_000)  # 30,000 bytes of weights: 6,000 must stream
    # two blocks: x = 1000 streams 8000 in 8 copies of 1.1 ms; x = 2000 streams 10,000 in 5 of 2.1
    assert floors.block_floor_ms(p, 2) == (pytest.approx(8.8), 1000)
    # one block: x = 1000 streams 7000 in 7 copies, each 1.1 ms + a 0.1 ms read (8.4 ms);
    # x = 2000 streams 8000 in 4 of 2.2 ms (8.8 ms)
    assert floors.block_floor_ms(p, 1) == (pytest.approx(8.4), 1000)


def test_floors_never_under_compute_and_edge_cases() -> None:
    assert floors.block_floor_ms(_problem(24_000, compute_ms=1.0), 2) == (pytest.approx(10.0), 1000)
    assert floors.block_floor_ms(_problem(40_000), 2) == (pytest.approx(1.0), 0)  # all resident
    assert floors.block_floor_ms(_problem(2_000), 1) == (math.inf, 0)  # no size has enough bytes
    with pytest.raises(ValueError, match="blocks must be 1 or 2"):
        floors.block_floor_ms(_problem(24_000), 3)


def test_floors_command_on_one_instance(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["floors", "wan-14b-480p", "--fractions", "0.9"])
    floors.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "copy model: curve" and "2 blocks/LB" in lines[1] and "2 any/LB" in lines[1]
    rows = [line.split() for line in lines[2:]]
    assert [r[:3] for r in rows] == [
        ["wan-14b-480p", "pcie4", "90%"],
        ["wan-14b-480p", "pcie5", "90%"],
    ]
    for row in rows:  # compute-bound: every column is at least the compute, here LB itself
        assert all(float(v) >= 1 - 1e-3 for v in (row[4], row[6], row[8], row[9], row[10]))


def test_any_size_floor_by_hand() -> None:
    p = _problem(24_000)  # D = 6000 bytes at 1000 bytes/ms plus 0.1 ms a copy
    # (6000 + 2x) (0.1 / x + 0.001) is least at x = sqrt(6000 * 0.1 / 0.002) = 547.7: between
    # the integers 547 and 548, and below the best of the instance's own sizes (x = 1000: 8.8 ms)
    ms, x = floors.any_size_floor_ms(p)
    assert x in (547, 548)
    assert ms == pytest.approx((6000 + 2 * x) * (0.1 / x + 0.001))
    assert ms == pytest.approx(min((6000 + 2 * y) * (0.1 / y + 0.001) for y in range(1, 6001)))
    assert ms < floors.block_floor_ms(p, 2)[0]
    assert floors.any_size_floor_ms(_problem(24_000, compute_ms=1.0)) == (pytest.approx(10.0), x)
    assert floors.any_size_floor_ms(_problem(40_000)) == (pytest.approx(1.0), 0)  # all resident
