"""Planning: recorded stats + options -> a compiled offload profile (solve, then emit).

Owns: `plan_profile`, the one call `ftc profile` and `ftc plan` make after measuring, and the
version strings recorded in the profile's meta (read from installed package metadata, so torch
is never imported here).
Must not know: torch, files (callers save the profile), the CLI.
"""

from __future__ import annotations

from importlib import metadata

from flextensor_compile.emit import emit_profile
from flextensor_compile.solve import Plan, Problem, problem_from_stats, solve, try_solve
from flextensor_compile.stats import Stats
from flextensor_runtime.errors import BudgetError, StatsFormatError
from flextensor_runtime.profile import Meta, PlanConfig, Predicted, Profile, check_profile
from flextensor_runtime.profile.fields import MAX_NUMBER

__all__ = ["package_version", "plan_profile", "solve_stats", "try_solve_stats"]


def package_version(name: str) -> str:
    """The installed version of distribution `name`, or "unknown"."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def solve_stats(stats: Stats, config: PlanConfig) -> tuple[Problem, Plan]:
    """Build the problem from stats and solve it with the configured strategy."""
    problem = problem_from_stats(stats, config)
    plan = solve(problem, config.strategy)
    over = _over_device(stats, problem, plan)
    if over is not None:
        raise over
    return problem, plan


def try_solve_stats(stats: Stats, config: PlanConfig) -> tuple[Problem, Plan] | None:
    """`solve_stats`, None where it raises `BudgetError` (without searching for the smallest
    budget a plan fits: for callers that only ask whether one does)."""
    problem = problem_from_stats(stats, config)
    plan = try_solve(problem, config.strategy)
    if plan is None or _over_device(stats, problem, plan) is not None:
        return None
    return problem, plan


def _over_device(stats: Stats, problem: Problem, plan: Plan) -> BudgetError | None:
    """The error for a latency-mode plan that keeps more on the device than it has."""
    device_bytes = stats.device.memory_bytes
    # an emulated device is sized to the weight bytes, which block alignment may exceed
    real = stats.device.kind != "emulated"
    if real and problem.budget_bytes is None and plan.peak_bytes > device_bytes:
        reserve = problem.reserve_bytes
        held = f" (with the --activation-reserve of {reserve})" if reserve else ""
        fix = " or lower --activation-reserve" if reserve else ""
        return BudgetError(
            f"the latency-mode plan keeps {plan.peak_bytes} bytes on the device{held} but "
            f"{stats.device.name} has {device_bytes} bytes; pass --mem-fraction (e.g. 0.9) or "
            f"--budget to plan streaming within the device{fix}"
        )
    return None


def plan_profile(
    stats: Stats,
    config: PlanConfig,
    *,
    command: str = "",
    tool_version: str | None = None,
    torch_version: str | None = None,
) -> Profile:
    """Solve `stats` under `config` and emit the profile (equal inputs give equal bytes)."""
    problem, plan = solve_stats(stats, config)
    meta = Meta(
        tool_version=tool_version or package_version("flextensor-compiler"),
        torch_version=torch_version or package_version("torch"),
        command=command,
        timing_source=stats.timing_source,
    )
    profile = emit_profile(stats, config, problem, plan, meta)
    check_profile(profile)  # an inconsistency the stats checks missed surfaces here
    _check_recordable(profile.predicted)
    return profile


def _check_recordable(p: Predicted) -> None:
    """Each measurement is in range, but their sums may not be: a prediction a profile cannot
    record is an error of the stats it came from, not of a profile."""
    times = {"compute_ms": p.compute_ms, "makespan_ms": p.makespan_ms, "stall_ms": p.stall_ms}
    for name, value in times.items():
        if not value <= MAX_NUMBER:
            raise StatsFormatError(
                f"the measurements predict a {name} of {value:.4g} per iteration, more than a "
                f"profile records ({MAX_NUMBER:g}); the stats' compute_ms, calls or "
                "h2d_latency_ms are far too large: fix them or re-record with `ftc profile "
                "--save-stats`"
            )
