"""`workers`: calls in worker processes give the same results in the same order as in this
process, errors surface, a pool that cannot start falls back; `ftc sweep --jobs`."""

from __future__ import annotations

import json
import operator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flextensor_compile import workers
from flextensor_compile.cli.app import app
from flextensor_compile.stats import save_stats
from flextensor_compile.sweep import parse_fractions, sweep
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import uniform_stats

CALLS = [(k, 10 * k) for k in range(7)]
EXPECTED = [11 * k for k in range(7)]


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_results_in_order_and_each_call_reported(jobs: int) -> None:
    seen: list[int] = []
    assert workers.run_calls(operator.add, CALLS, jobs, lambda: seen.append(1)) == EXPECTED
    assert len(seen) == len(CALLS)


def test_an_error_in_a_worker_is_raised_here() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        workers.run_calls(int, [("1",), ("x",), ("3",)], 2)


def test_a_pool_that_cannot_start_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> None:
        raise OSError("no semaphores here")

    monkeypatch.setattr(workers, "_in_pool", broken)
    seen: list[int] = []
    assert workers.run_calls(operator.add, CALLS, 4, lambda: seen.append(1)) == EXPECTED
    assert len(seen) == len(CALLS)


def test_how_many_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)
    assert workers.parallel_jobs(None, 20, workers.MIN_PARALLEL_S) == 8
    assert workers.parallel_jobs(None, 3, 10.0) == 3  # never more than the calls
    assert workers.parallel_jobs(None, 20, workers.MIN_PARALLEL_S / 2) == 1  # not worth it
    assert workers.parallel_jobs(4, 20, 0.0) == 4 and workers.parallel_jobs(4, 2, 0.0) == 2
    assert workers.parallel_jobs(1000, 1000, 0.0) == 8  # never more than the CPUs
    assert workers.parallel_jobs(None, 1, 100.0) == 1


def test_sweep_in_workers_is_the_same_sweep() -> None:
    stats, fractions = uniform_stats(12), parse_fractions("0.3:1.0:0.1")
    one = sweep(stats, PlanConfig(), fractions, jobs=1)
    assert sweep(stats, PlanConfig(), fractions, jobs=2) == one
    assert sweep(stats, PlanConfig(), fractions, jobs=None) == one  # short: stays here


def test_sweep_jobs_option(tmp_path: Path) -> None:
    runner = CliRunner()
    path = save_stats(replace(uniform_stats(12)), tmp_path / "stats.json")
    args = ["sweep", str(path), "--fractions", "0.4,0.7,1.0", "--json"]
    serial = runner.invoke(app, [*args, "--jobs", "1"])
    parallel = runner.invoke(app, [*args, "--jobs", "2"])
    assert serial.exit_code == parallel.exit_code == 0, serial.output + parallel.output
    assert json.loads(serial.output) == json.loads(parallel.output)
    bad = runner.invoke(app, [*args, "--jobs", "0"])
    assert bad.exit_code != 0 and "--jobs" in bad.output
