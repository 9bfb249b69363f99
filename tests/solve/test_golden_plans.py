"""The solver's golden plans: fixed recorded measurements under fixed options give pinned bytes.

A change to the solver that changes a plan changes these bytes; regenerate them with
`make golden` only when that change is intended (and say so in the commit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flextensor_runtime.profile import dumps, load
from profiles.regenerate import SOLVER_GOLDENS, solver_golden

PROFILES = Path(__file__).parents[2] / "profiles"


@pytest.mark.parametrize("case", sorted(SOLVER_GOLDENS))
def test_solver_golden_bytes_are_pinned(case: str) -> None:
    path = PROFILES / f"tiny_transformer.{case}.msgpack"
    assert dumps(solver_golden(case)) == path.read_bytes()


@pytest.mark.parametrize("case", sorted(SOLVER_GOLDENS))
def test_solver_goldens_respect_their_budget(case: str) -> None:
    profile = load(PROFILES / f"tiny_transformer.{case}.msgpack")
    budget = profile.config.budget_bytes
    assert budget is None or profile.predicted.peak_bytes <= budget
    assert profile.predicted.stall_ms >= 0.0
