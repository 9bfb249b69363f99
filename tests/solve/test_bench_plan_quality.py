"""The plan-quality benchmark runs on one instance and its rows hold together (no peer)."""

from __future__ import annotations

import json
import sys

import pytest

from bench.plan_quality import __main__ as bench


def test_plan_quality_bench_on_one_instance(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["plan_quality", "--instances", "wan-14b-480p", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(bench, "REPEATS", 1)
    bench.main()
    printed = capsys.readouterr().out
    assert "FlexTensor 0.5 not run" in printed and "against the staging bound" in printed
    rows = json.loads(out.read_text())
    assert len(rows) == 2 * len(bench.FRACTIONS)  # two links x the budgets
    for row in rows:
        assert row["ratio"] >= 1 - 1e-9 and row["ratio_star"] >= 1 - 1e-9
        assert row["lb_star_ms"] >= row["lb_ms"] * (1 - 1e-9)
        assert row["peak_over_budget"] <= 1.0
        assert row["ratio"] == pytest.approx(row["ratio_star"] * row["lb_star_ms"] / row["lb_ms"])
