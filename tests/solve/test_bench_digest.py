"""`python -m bench.plan_quality.digest`: the same solver gives the same digests, and a changed
plan or a missing case is found."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from bench.plan_quality import digest
from flextensor_compile.solve import solve
from flextensor_compile.solve.simulate import Simulation


def test_digest_sees_the_last_bit_of_a_plan() -> None:
    key, problem = next(digest._problems(["wan-14b-480p"], (0.3,)))
    assert key == "curve wan-14b-480p pcie4 0.3 modules"
    plan = solve(problem, "adaptive")
    assert digest.plan_digest(plan) == digest.plan_digest(solve(problem, "adaptive"))
    sim: Simulation = plan.simulation
    nudged = replace(plan, simulation=replace(sim, makespan_ms=sim.makespan_ms * (1 + 2**-52)))
    assert digest.plan_digest(nudged)[0] != digest.plan_digest(plan)[0]
    assert digest.compare({"a": ["x"], "b": ["y"]}, {"a": ["x"], "b": ["z"], "c": ["w"]}) == [
        "b",
        "c",
    ]


def test_digest_command_against_itself_and_a_changed_file(tmp_path, monkeypatch, capsys) -> None:
    base = tmp_path / "base.json"
    argv = ["digest", str(base), "--instances", "wan-14b-480p", "--fractions", "0.9", "--no-wide",
            "--no-large"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    digest.main()
    doc = json.loads(base.read_text())
    assert len(doc) == 2 * 2 * 4  # copy models x links x (modules, leaves, 2 and 3 blocks)
    monkeypatch.setattr(sys, "argv", [*argv[:1], str(tmp_path / "new.json"), *argv[2:],
                                      "--against", str(base)])  # fmt: skip
    digest.main()  # the same plans: no exit
    assert "0 of 16 differ" in capsys.readouterr().out
    key = next(iter(doc))
    base.write_text(json.dumps({**doc, key: ["changed", ""]}))
    with pytest.raises(SystemExit) as exc:
        digest.main()
    assert exc.value.code == 1 and f"differs: {key}" in capsys.readouterr().out


def test_digests_cover_the_wide_instances_by_default() -> None:
    keys = [key for key, _ in digest._wide_problems()]
    assert len(keys) == 12 and len(set(keys)) == 12  # 3 shapes x 4 budgets
    assert "wide 80x24 0.3" in keys
