"""The memory/speed curve: predicted makespan, stall and streamed bytes against the budget.

Owns: re-solving one model at a range of budgets (fractions of its weight bytes) with the staging
bound at each (the least makespan any plan at that budget can predict), the fraction
range syntax `start:stop:step`, recovering stats from a compiled profile (so a sweep can start
from either), and the optional plot (matplotlib, as for the timeline). The budgets are
independent solves: a long sweep runs them in worker processes (`workers`).
Must not know: the CLI, rendering, files.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from flextensor_compile.emit import SOLVER_SECTION
from flextensor_compile.planning import solve_stats
from flextensor_compile.solve.bound import staging_bound_ms
from flextensor_compile.solve.problem import discovery_pin, over_device_memory
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_compile.timeline import import_pyplot
from flextensor_compile.workers import parallel_jobs, run_calls
from flextensor_runtime.errors import BudgetError, ConfigError
from flextensor_runtime.profile import TIMING_SOURCES, PlanConfig, Profile, TensorEntry

__all__ = ["NO_FIT", "OVER_MEMORY", "SweepPoint", "largest_fraction", "parse_fractions", "plot_sweep",
           "slower_than_smaller", "smallest_near_fastest", "stats_from_profile", "sweep",
           "weight_bytes"]  # fmt: skip

NO_FIT = "does not fit"  # `SweepPoint.status`: no plan fits the budget (`error` says the least)
OVER_MEMORY = "over device memory"  # the budget is more than the device has: not solved


@dataclass(frozen=True)
class SweepPoint:
    """One budget. `makespan_ms` is None when no plan fits or the budget is more than the
    device's memory (`status` says which, `error` why)."""

    fraction: float
    budget_bytes: int
    mem_fraction: float  # the same budget as a fraction of device memory
    makespan_ms: float | None
    stall_ms: float | None
    streamed_bytes: int | None
    peak_bytes: int | None
    strategy: str | None
    error: str = ""
    bound_ms: float | None = None  # the staging bound: no plan at this budget predicts less
    status: str = "planned"  # or NO_FIT, or OVER_MEMORY (then nothing was solved)
    least_bytes: int | None = None  # NO_FIT: the smallest budget a plan fits, when known


_MAX_POINTS = 1000  # budgets one sweep solves: each is a full solve


def parse_fractions(spec: str) -> tuple[float, ...]:
    """`0.2:1.0:0.05` -> 0.2, 0.25, ..., 1.0 (inclusive); `0.3,0.5` -> 0.3, 0.5 (in the order
    given, each once)."""
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if not all(map(math.isfinite, (start, stop, step))):
                raise ValueError
            if stop < start or step <= 0:
                why = "STOP is below START" if stop < start else "STEP must be positive"
                raise ConfigError(f"bad fractions {spec!r}: {why}; e.g. --fractions "
                                  f"{min(start, stop):g}:{max(start, stop):g}:{abs(step) or 0.05:g}")  # fmt: skip
            if start <= 0:
                raise ValueError
            span = (stop - start) / step + 1e-9
            if span >= _MAX_POINTS:  # before int(): a tiny step makes a count of 300 digits
                raise OverflowError(int(span) + 1 if span < 1e12 else f"{span:.3g}")
            count = int(span) + 1
            values = tuple(round(start + k * step, 10) for k in range(count))
        else:
            values = tuple(float(x) for x in spec.split(","))
    except OverflowError as exc:
        raise ConfigError(
            f"fractions {spec!r} give {exc.args[0]} budgets, more than {_MAX_POINTS}; use a "
            "larger STEP"
        ) from None
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(
            f"bad fractions {spec!r}; use START:STOP:STEP (e.g. 0.2:1.0:0.05) or a list like "
            "0.3,0.5 with positive values"
        ) from None
    if not values or any(not v > 0 or not math.isfinite(v) for v in values):
        raise ConfigError(f"bad fractions {spec!r}; every fraction must be a positive number")
    if len(values) > _MAX_POINTS:
        raise ConfigError(f"fractions {spec!r} list more than {_MAX_POINTS} budgets; list fewer")
    return tuple(dict.fromkeys(values))  # a fraction listed twice is solved and shown once


def stats_from_profile(profile: Profile) -> Stats:
    """The measurements a profile was compiled from (placements dropped; tensors the solver
    recorded as not offloadable stay so)."""
    section = profile.extensions.get(SOLVER_SECTION)
    pinned = section.get("pinned", {}) if isinstance(section, dict) else {}
    fixed: dict[str, str | None] = {}  # not offloadable -> discovery's reason
    for name, why in pinned.items() if isinstance(pinned, dict) else ():
        marked, detail = discovery_pin(why) if isinstance(why, str) else (False, None)
        if marked:
            fixed[name] = detail

    def tensor(e: TensorEntry) -> TensorStat:
        return TensorStat(e.name, e.bytes, e.dtype, e.shape, e.stride, e.kind, e.tie,
                          offloadable=e.name not in fixed, pin_reason=fixed.get(e.name))  # fmt: skip

    traps = tuple(TrapStat(t.name, t.compute_ms, tuple(tensor(e) for e in t.tensors), t.kind,
                           t.calls) for t in profile.traps)  # fmt: skip
    source = profile.meta.timing_source  # one a stats file cannot record (a profile made by
    source = source if source in TIMING_SOURCES else "stats"  # hand) is re-solved as "stats"
    return Stats(profile.meta.command or "profile", profile.device, traps,
                 tuple(tensor(e) for e in profile.untrapped), source)  # fmt: skip


def weight_bytes(stats: Stats) -> int:
    every = [t for trap in stats.traps for t in trap.tensors] + list(stats.untrapped)
    return sum(t.bytes for t in every if t.tie is None)


def largest_fraction(stats: Stats) -> float | None:
    """The largest fraction of the weight bytes, in thousandths, whose budget (`int(fraction *
    weights)`, as `sweep` makes it) the device holds; None when every budget is held (an
    emulated device) or none is."""
    weights, memory = weight_bytes(stats), stats.device.memory_bytes
    if stats.device.kind == "emulated" or weights <= 0:
        return None
    k = memory * 1000 // weights
    while int((k + 1) / 1000 * weights) <= memory:  # the float product may round either way
        k += 1
    while k > 0 and int(k / 1000 * weights) > memory:
        k -= 1
    return k / 1000 if k > 0 else None


def sweep(stats: Stats, config: PlanConfig, fractions: tuple[float, ...],
          progress: Callable[[], None] | None = None, jobs: int | None = 1,
          ) -> tuple[SweepPoint, ...]:  # fmt: skip
    """Solve at each fraction of the weight bytes (the rest of `config` kept); `progress` is
    called after each budget. `jobs`: worker processes for the budgets (1, the default: none;
    None: one per CPU for the budgets after the first when its solve says they would take over
    `workers.MIN_PARALLEL_S` in one process, what `ftc sweep` does). A script that asks for
    workers must guard its entry point (`if __name__ == "__main__":`): spawned workers import
    it. The points are the same either way."""
    weights = weight_bytes(stats)
    memory = stats.device.memory_bytes or 1
    calls = []
    for f in fractions:
        budget = max(1, int(f * weights))
        calls.append((stats, replace(config, budget_bytes=budget, mem_fraction=None), f,
                      budget / memory))  # fmt: skip
    if jobs is not None:
        return tuple(run_calls(_point, calls, parallel_jobs(jobs, len(calls), 0.0), progress))
    start = time.perf_counter()
    first = run_calls(_point, calls[:1], 1, progress)
    rest = calls[1:]
    expected_s = (time.perf_counter() - start) * len(rest)
    return (*first, *run_calls(_point, rest, parallel_jobs(jobs, len(rest), expected_s), progress))


def _point(stats: Stats, config: PlanConfig, fraction: float, mem_fraction: float) -> SweepPoint:
    budget = config.budget_bytes
    assert budget is not None
    if over_device_memory(stats, budget):  # a model larger than its device: the top fractions
        memory, most = stats.device.memory_bytes, largest_fraction(stats)
        fix = f"sweep fractions up to {most:.3f}" if most else "record its memory"
        why = (f"budget of {budget} bytes is more than {stats.device.name}'s {memory} bytes of "
               f"memory; {fix}")  # fmt: skip
        return SweepPoint(fraction, budget, mem_fraction, None, None, None, None, None, why,
                          status=OVER_MEMORY)  # fmt: skip
    try:
        problem, plan = solve_stats(stats, config)
    except BudgetError as exc:
        return SweepPoint(fraction, budget, mem_fraction, None, None, None, None, None, str(exc),
                          status=NO_FIT, least_bytes=exc.least_bytes)  # fmt: skip
    bound = staging_bound_ms(problem)
    return SweepPoint(fraction, budget, mem_fraction, plan.makespan_ms, plan.simulation.stall_ms,
                      plan.streamed_bytes, plan.peak_bytes, plan.strategy,
                      bound_ms=bound if math.isfinite(bound) else None)  # fmt: skip


SAME_MAKESPAN = 1e-9  # relative: makespans this close are the same (float sums of one plan)


def smallest_near_fastest(points: tuple[SweepPoint, ...], within: float) -> SweepPoint | None:
    """The planned point with the smallest budget whose makespan is within `within` (a
    fraction, e.g. 0.05; 0: the fastest, up to `SAME_MAKESPAN`) of the fastest planned
    point's; None when no point has a plan."""
    planned = [p for p in points if p.makespan_ms is not None]
    if not planned:
        return None
    fastest = min(p.makespan_ms for p in planned if p.makespan_ms is not None)
    near = [p for p in planned if p.makespan_ms is not None
            and p.makespan_ms <= fastest * (1 + within + SAME_MAKESPAN)]  # fmt: skip
    return min(near, key=lambda p: (p.budget_bytes, p.fraction))


def slower_than_smaller(points: tuple[SweepPoint, ...]) -> list[tuple[SweepPoint, SweepPoint]]:
    """(point, the fastest point at a smaller budget) wherever a plan is slower than one found
    at a smaller budget (that plan fits the larger budget too: the solver's fit at this budget
    missed it); in budget order."""
    planned = sorted((p for p in points if p.makespan_ms is not None),
                     key=lambda p: (p.budget_bytes, p.fraction))  # fmt: skip
    out, best = [], None
    for p in planned:
        assert p.makespan_ms is not None
        if (
            best is not None
            and best.makespan_ms is not None
            and (p.makespan_ms > best.makespan_ms * (1 + SAME_MAKESPAN))
        ):
            out.append((p, best))
        if best is None or best.makespan_ms is None or p.makespan_ms < best.makespan_ms:
            best = p
    return out


def _axis_unit(largest: int) -> tuple[int, str]:
    """The binary unit the largest budget reads best in (a 40 MiB model is not 0.04 GiB)."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if largest >= scale:
            return scale, unit
    return 1, "B"


def plot_sweep(
    points: tuple[SweepPoint, ...], path: str | os.PathLike[str], image_format: str | None = None
) -> Path:
    """Makespan, the staging bound and stall (upper panel) and streamed bytes (lower panel, same
    budget axis: on one axis the two lines, both falling with the budget, hide each other), and
    the smallest budget within 5% of the fastest plan marked in both."""
    plt = import_pyplot()
    ok = [p for p in points if p.makespan_ms is not None]
    scale, unit = _axis_unit(max((p.budget_bytes for p in ok), default=0))
    fig, (ax, low) = plt.subplots(2, 1, figsize=(8, 5), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
    xs = [p.budget_bytes / scale for p in ok]
    ax.plot(xs, [p.makespan_ms for p in ok], marker="o", label="makespan (ms)")
    ax.plot(xs, [p.stall_ms for p in ok], marker=".", label="stall (ms)")
    bounded = [p for p in ok if p.bound_ms is not None]
    ax.plot([p.budget_bytes / scale for p in bounded], [p.bound_ms for p in bounded],
            linestyle=":", color="black", label="staging bound (ms)")  # fmt: skip
    near = smallest_near_fastest(points, 0.05)
    if near is not None and near.makespan_ms is not None:  # where to look when picking a budget
        x = near.budget_bytes / scale
        for axis in (ax, low):
            axis.axvline(x, color="green", linestyle="--", linewidth=0.8)
        ax.plot([x], [near.makespan_ms], marker="*", markersize=12, color="green",
                linestyle="none", label=f"within 5% of the fastest ({x:.3g} {unit})")  # fmt: skip
    ax.set_ylabel("ms per iteration")
    ax.legend(loc="best", fontsize="small")  # where it covers the fewest points
    low.plot(xs, [(p.streamed_bytes or 0) / scale for p in ok], color="gray", marker=".")
    low.set_ylabel(f"streamed {unit}")
    low.set_xlabel(f"budget ({unit})")
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=120, format=image_format)
    plt.close(fig)
    return target
