"""The plan-quality benchmark runs on one instance and its rows hold together (no peer); the
leaf-granularity instances match their module instances; `auto` keeps the cheaper plan."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from bench.plan_quality import __main__ as bench
from bench.plan_quality import auto
from bench.plan_quality.instances import BANDWIDTHS, INSTANCES, device
from bench.plan_quality.leaves import LEAF_INSTANCES, roofline_ratios
from flextensor_compile.solve import BandwidthModel, problem_from_stats, solve, staging_bound_ms
from flextensor_compile.solve.granularity import exposed_call_ms
from flextensor_compile.stats import Stats, TensorStat
from flextensor_runtime.profile import PlanConfig


def test_plan_quality_bench_on_one_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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
        assert row["leaf_ratio_star"] >= 1 - 1e-9 and row["leaf_peak_over_budget"] <= 1.0
        assert row["leaf_traps"] == len(LEAF_INSTANCES["wan-14b-480p"]().traps)
        kept = {"leaves": "leaf_ratio", "modules": "ratio"}[row["auto_pick"]]
        assert row["auto_ratio"] == row[kept]
        assert row["auto_solve_ms"] == pytest.approx(row["solve_ms"] + row["leaf_solve_ms"])
    assert "leaves: median makespan/LB" in printed and "auto: median makespan/LB" in printed
    assert "\ntargets: median makespan/LB <= 1.03" in printed and "  auto (the default): median" in printed
    reference = re.search(r"CPU reference .*: ([0-9.]+) ms on this machine", printed)
    assert reference is not None and float(reference.group(1)) > 0


NAMES = list(INSTANCES)
ROOFLINE_RANGE = (1.0, 1.14)  # leaves.py: own rooflines over the module trap's time
LAYER_TOLERANCE = 0.02  # a Wan block's leading gap (about 1%) counts with the block before


def _tensors(stats: Stats) -> list[TensorStat]:
    out = [t for trap in stats.traps for t in trap.tensors] + list(stats.untrapped)
    return sorted(out, key=lambda t: t.name)


def _layer_ms(stats: Stats) -> dict[str, float]:
    """Compute per layer or block; a gap `gap:after:X` counts with X's layer."""
    out: dict[str, float] = defaultdict(float)
    for trap in stats.traps:
        m = re.search(r"[a-z_]*(?:layers|blocks)\.\d+(?!\d)", trap.name)
        if m:
            out[m.group(0)] += trap.compute_ms
    return out


@pytest.mark.parametrize("name", NAMES)
def test_same_tensors_and_weight_bytes(name: str) -> None:
    modules, leaves = INSTANCES[name](), LEAF_INSTANCES[name]()
    ours, theirs = _tensors(leaves), _tensors(modules)
    assert ours == theirs  # names, bytes, dtypes, shapes, kind and tie flags
    assert len({t.name for t in ours}) == len(ours)
    assert sum(t.bytes for t in ours) == sum(t.bytes for t in theirs)
    assert len(leaves.traps) > 4 * len(modules.traps)


@pytest.mark.parametrize("name", NAMES)
def test_gaps_own_nothing_and_follow_a_trap(name: str) -> None:
    traps = LEAF_INSTANCES[name]().traps
    gaps = [k for k, t in enumerate(traps) if t.kind == "gap"]
    assert gaps
    for k in gaps:
        assert traps[k].tensors == ()
        assert k > 0 and traps[k - 1].kind != "gap"
        assert traps[k].name == f"gap:after:{traps[k - 1].name}"
    assert all(t.tensors for t in traps if t.kind != "gap")


@pytest.mark.parametrize("name", NAMES)
def test_leaf_times_add_up_to_the_module_times(name: str) -> None:
    modules, leaves = INSTANCES[name](), LEAF_INSTANCES[name]()
    total = sum(t.compute_ms for t in modules.traps)
    assert sum(t.compute_ms for t in leaves.traps) == pytest.approx(
        total, abs=1e-6 * len(leaves.traps)
    )  # rounding
    layers = _layer_ms(modules)
    assert len(layers) >= 32
    assert _layer_ms(leaves).keys() == layers.keys()
    for key, ms in _layer_ms(leaves).items():
        assert ms == pytest.approx(layers[key], rel=LAYER_TOLERANCE), key
    ratios = roofline_ratios(name).values()
    assert ROOFLINE_RANGE[0] <= min(ratios) and max(ratios) <= ROOFLINE_RANGE[1]


@pytest.mark.parametrize("fraction", [0.3, 0.9])
def test_auto_is_never_worse_than_modules(fraction: float) -> None:
    name = "llama-8b-decode"
    base = replace(INSTANCES[name](), device=device(BANDWIDTHS["pcie5"]))
    weights = sum(t.bytes for t in _tensors(base))
    problem = problem_from_stats(base, PlanConfig(budget_bytes=int(fraction * weights)))
    plan = solve(problem, "adaptive")
    [leaf_problem] = auto.leaf_problems([(name, base, problem)])
    leaf_plan = solve(leaf_problem, "adaptive")
    row = auto.auto_fields(1.0, (problem, plan), (leaf_problem, leaf_plan), (1.0, 2.0))
    cost = {"modules": plan.makespan_ms + exposed_call_ms(problem, plan),
            "leaves": leaf_plan.makespan_ms + exposed_call_ms(leaf_problem, leaf_plan)}  # fmt: skip
    call = {"leaves": "leaf_exposed_call_ms", "modules": "module_exposed_call_ms"}[row["auto_pick"]]
    kept = row["auto_ratio"] + row[call]  # the kept plan's makespan (LB passed as 1 ms)
    assert kept <= cost["modules"] + 1e-9 and kept == pytest.approx(min(cost.values()))
    assert row["leaf_peak_over_budget"] <= 1.0 and row["auto_solve_ms"] == 3.0


def test_lb_is_a_lower_bound_also_when_a_smaller_copy_is_faster_per_byte() -> None:
    case = next(bench._cases(["llama-8b-prefill2k"], (0.5,)))
    problem, weights = case[4], case[5]
    need = weights - problem.budget_bytes
    # the suite's curve: larger copies are no slower per byte, so LB is the one copy's time
    assert bench.lower_bound_ms(problem, weights) == pytest.approx(
        max(problem.compute_ms, problem.bandwidth.copy_ms(need)), rel=1e-12
    )
    # a measured curve whose 4 MiB copies run twice the rate of the largest (cache effects)
    fast_small = BandwidthModel.from_curve(((1 << 22, 50e9), (1 << 28, 25e9)), 25e9)
    odd = replace(problem, bandwidth=fast_small)
    lb = bench.lower_bound_ms(odd, weights)
    assert lb < fast_small.copy_ms(need) * 0.6  # not the one big copy's time
    assert lb == pytest.approx(max(odd.compute_ms, need * fast_small.copy_ms(1 << 22) / (1 << 22)))
    assert lb <= staging_bound_ms(odd) * (1 + 1e-9)  # below the bound every plan respects
