"""The plan-quality targets the benchmark prints last: met and missed, with and without the
FlexTensor columns."""

from __future__ import annotations

from bench.plan_quality.targets import BIG_INSTANCE, target_lines


def _row(ratio: float, auto_ratio: float, ft: float | None = None, solve_ms: float = 10.0,
         instance: str = BIG_INSTANCE) -> dict:  # fmt: skip
    row = {"instance": instance, "ratio": ratio, "auto_ratio": auto_ratio, "solve_ms": solve_ms}
    if ft is not None:
        row["ft_ratio"] = ft
    return row


def test_targets_met() -> None:
    rows = [_row(1.0, 1.0, 1.2), _row(1.02, 1.01, 1.1), _row(1.05, 1.04, 1.05)]
    lines = target_lines(rows)
    assert lines[1] == ("  modules: median 1.020 met, worst 1.050 met, never worse than "
                        "FlexTensor: met (worse on 0 of 3)")  # fmt: skip
    assert lines[2].startswith("  auto (the default): median 1.010 met, worst 1.040 met")
    assert lines[3].endswith("at most 10.0 ms met (module traps, on this machine)")


def test_targets_missed() -> None:
    rows = [_row(1.04, 1.0), _row(1.07, 1.08, 1.06, solve_ms=140.0), _row(1.035, 1.0)]
    lines = target_lines(rows)
    assert "median 1.040 MISSED, worst 1.070 MISSED" in lines[1]
    assert "never worse than FlexTensor: MISSED (worse on 1 of 1)" in lines[1]
    assert "worst 1.080 MISSED" in lines[2] and "140.0 ms MISSED" in lines[3]
    assert "FlexTensor not run" in target_lines([_row(1.0, 1.0)])[1]


def test_solve_time_in_units_of_the_cpu_reference() -> None:
    line = target_lines([_row(1.0, 1.0, solve_ms=50.0)], reference_ms=0.4)[-1]
    assert "125 x the CPU reference loop" in line and "takes up to 0.80 ms" in line
