"""A count of one reads in the singular in every message and report ("1 tensor", not "1 tensors")."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.planning import plan_profile
from flextensor_compile.solve import problem_from_stats
from flextensor_compile.stats import Stats, TrapStat
from flextensor_compile.trap_granularity import _describe
from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ProfileFormatError, StatsFormatError
from flextensor_runtime.profile import PlanConfig, check_profile, save
from tests.solve.instances import device, tensor


def _one_tensor_gap() -> Stats:
    traps = (
        TrapStat("l0", 1.0, (tensor("l0.w", 100),)),
        TrapStat("gap", 1.0, (tensor("g.w", 100),), "gap"),
    )
    return Stats("gap", device(), traps)


def test_the_plural_rule() -> None:
    assert [count_of(n, "tensor") for n in (0, 1, 2)] == ["0 tensors", "1 tensor", "2 tensors"]
    assert count_of(1, "copy") == "1 copy" and count_of(3, "copy") == "3 copies"


def test_a_gap_trap_owning_one_tensor() -> None:
    with pytest.raises(StatsFormatError, match="gap trap 'gap' owns 1 tensor; mark it"):
        problem_from_stats(_one_tensor_gap(), PlanConfig())


def test_a_profile_whose_gap_trap_owns_one_tensor() -> None:
    stats = Stats("two", device(), (TrapStat("l0", 1.0, (tensor("l0.w", 100),)),
                                    TrapStat("l1", 1.0, (tensor("l1.w", 100),))))  # fmt: skip
    profile = plan_profile(stats, PlanConfig())
    gap = dataclasses.replace(profile.traps[1], kind="gap")
    with pytest.raises(ProfileFormatError, match="gap trap 'l1' owns 1 tensor;"):
        check_profile(dataclasses.replace(profile, traps=(profile.traps[0], gap)))


def test_granularity_note_with_one_trap() -> None:
    assert "modules (1 trap) fit no plan" in _describe("modules", None, None, (1, 2))
    assert "leaves (2 traps) fit no plan" in _describe("modules", None, None, (1, 2))


def test_inspect_of_a_one_tensor_model(tmp_path, capsys) -> None:
    stats = Stats("one", device(), (TrapStat("l0", 1.0, (tensor("l0.w", 100),)),))
    path = save(plan_profile(stats, PlanConfig()), tmp_path / "p.msgpack")
    assert run_guarded(lambda: app(["inspect", str(path)], prog_name="ftc"), False) == 0
    out = capsys.readouterr().out
    assert "1 tensor, " in out and "1 tensors" not in out
    assert run_guarded(lambda: app(["inspect", str(path), "--json"], prog_name="ftc"), False) == 0
    assert json.loads(capsys.readouterr().out)["model"]["tensor_count"] == 1
