"""`ftc sweep STATS_OR_PROFILE`: predicted makespan, stall and streamed bytes against the budget.

Owns: the sweep command's options, its progress bar (one step per budget) and its table.
Must not know: how plans are searched (sweep).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flextensor_compile.cli.help import FLAG, FtcCommand
from flextensor_compile.cli.profile_cmd import ASSIGNMENT_HELP, STRATEGY_HELP
from flextensor_compile.cli.progress import PhaseBars
from flextensor_compile.cli.streams import dash_is_stdout

if TYPE_CHECKING:
    from flextensor_compile.stats import Stats
    from flextensor_compile.sweep import SweepPoint
    from flextensor_runtime.profile import PlanConfig

__all__ = ["register"]


def _load(path: Path) -> tuple[Stats, PlanConfig]:
    """(stats, config) from a stats JSON file (default config) or a compiled profile (its own)."""
    from flextensor_compile.cli.inputs import read_measurements
    from flextensor_runtime.profile import PlanConfig

    stats, config = read_measurements(path)
    return stats, config or PlanConfig()


def _checked_fractions(fractions: str, plot: Path | None, source: Path) -> tuple[float, ...]:
    """The budgets, after the plot path and the fractions are checked (nothing read yet)."""
    from flextensor_compile.cli.limits import check_fractions
    from flextensor_compile.cli.paths import check_distinct, check_image_file
    from flextensor_compile.sweep import parse_fractions

    check_image_file(plot, "--plot")
    check_distinct([("--plot", plot)], [("the input", source)])
    budgets = parse_fractions(fractions)
    check_fractions(fractions, budgets)
    return budgets


def _override(config: PlanConfig, strategy: str | None, assignment: str | None) -> PlanConfig:
    from dataclasses import replace

    if strategy is not None:
        config = replace(config, strategy=strategy)
    if assignment is not None:
        config = replace(config, assignment=assignment)
    return config


_FRACTIONS_HELP = (
    "Budgets as fractions of the weight bytes: START:STOP:STEP or a list like 0.3,0.5."
)
_STRATEGY_HELP = STRATEGY_HELP.rstrip(".") + " (default: the profile's, or adaptive)."
_ASSIGNMENT_HELP = (
    ASSIGNMENT_HELP.rstrip(".") + " (default: the profile's, or optimized-round-robin)."
)
_JOBS_HELP = (
    "Worker processes for the budgets, at most one per CPU (1: none; default: one per CPU when "
    "the first budget's solve says the rest would take over 2 s)."
)


def sweep(
    source: Path = typer.Argument(..., help="A stats file (JSON) or a profile (.msgpack)."),
    fractions: str = typer.Option("0.2:1.0:0.05", "--fractions", help=_FRACTIONS_HELP),
    strategy: str = typer.Option(None, "--strategy", help=_STRATEGY_HELP),
    assignment: str = typer.Option(None, "--assignment", help=_ASSIGNMENT_HELP),
    plot: Path = typer.Option(
        None, "--plot", help="Also draw the curve to this PNG.", callback=dash_is_stdout
    ),
    jobs: int = typer.Option(None, "--jobs", min=1, help=_JOBS_HELP),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print the points as JSON."),
) -> None:
    """The memory/speed curve: re-solve at each budget and show what the plan predicts."""
    from flextensor_compile.cli.paths import write_image
    from flextensor_compile.cli.render import print_json
    from flextensor_compile.cli.streams import check_stdout_outputs, text_off_stdout
    from flextensor_compile.sweep import largest_fraction, plot_sweep, weight_bytes
    from flextensor_compile.sweep import sweep as run_sweep

    budgets = _checked_fractions(fractions, plot, source)
    check_stdout_outputs(as_json, [("--plot", plot)])
    stats, config = _load(source)
    config = _override(config, strategy, assignment)
    with PhaseBars(quiet=False) as bars:  # on stderr, and only on a terminal
        bars.start("sweep", len(budgets))
        points = run_sweep(stats, config, budgets, lambda: bars.advance("sweep"), jobs)
    planned = any(p.makespan_ms is not None for p in points)
    if plot is not None and planned:  # no plan, no curve: an empty chart is not written
        write_image(plot, lambda tmp, fmt: plot_sweep(points, tmp, fmt))
    with text_off_stdout(plot):  # `--plot /dev/stdout`: the image alone on stdout
        if as_json:
            print_json([asdict(p) for p in points])
            return
        picks = _pick_lines(points, weight_bytes(stats), largest_fraction(stats),
                            _plan_options(config))  # fmt: skip
        lines = [*picks, *_notes(config, plot, planned)]
        _print_points(points, lines)


def _notes(config: PlanConfig, plot: Path | None, planned: bool) -> list[str]:
    """What the table does not show: a reserve kept from the profile, where the plot went."""
    from flextensor_compile.units import format_bytes

    notes = []
    if config.activation_reserve_bytes:
        notes.append(f"each budget keeps {format_bytes(config.activation_reserve_bytes)} for "
                     "activations (the profile's activation reserve)")  # fmt: skip
    if plot is not None:
        notes.append(f"plot written to {plot}" if planned
                     else f"no plot drawn to {plot}: no budget swept has a plan")  # fmt: skip
    return notes


def _print_points(points: tuple[SweepPoint, ...], lines: list[str]) -> None:
    """The table, then `lines` (where to look when picking a budget, notes)."""
    from flextensor_compile.cli.render import out_console, safe, sweep_table

    console = out_console()
    console.print(sweep_table(points))
    for line in lines:
        console.print(safe(line))


def _plan_options(config: PlanConfig) -> str:
    """The `ftc plan` options besides the budget that solve as this sweep does (those that
    differ from its defaults: a strategy, blocks, an assignment, a profile's reserve)."""
    from dataclasses import replace

    from flextensor_compile.config import plan_command

    text = plan_command(replace(config, budget_bytes=None, mem_fraction=None, seed=0))
    kept = [part for part in text.split(" --")[1:] if part != "strategy adaptive"]
    return "".join(f" --{part}" for part in kept)


def _pick_lines(
    points: tuple[SweepPoint, ...], weights: int, most: float | None = None, options: str = ""
) -> list[str]:
    """Where to look when picking a budget: the smallest budget within 5% and 20% of the
    fastest plan swept; with no plan at all, the smallest budget one fits. `options`: the
    `ftc plan` options besides `--budget` that get the sweep's plans."""
    from flextensor_compile.sweep import smallest_near_fastest
    from flextensor_compile.units import format_bytes, format_fraction, format_ms

    fastest = smallest_near_fastest(points, 0.0)
    if fastest is None or fastest.makespan_ms is None:
        return [_no_plan_line(points, weights, most)]
    lines = [f"fastest: {format_ms(fastest.makespan_ms)} ms, first at frac "
             f"{format_fraction(fastest.fraction)} ({format_bytes(fastest.budget_bytes)})"]  # fmt: skip
    shown = [fastest]
    for within in (0.05, 0.20):
        near = smallest_near_fastest(points, within)
        if near is not None and near not in shown and near.makespan_ms is not None:
            shown.append(near)
            lines.append(f"within {within:.0%} of it from frac {format_fraction(near.fraction)} "
                         f"({format_bytes(near.budget_bytes)}): {format_ms(near.makespan_ms)} ms")  # fmt: skip
    return [*lines, *_slower_lines(points, options)]


def _slower_lines(points: tuple[SweepPoint, ...], options: str) -> list[str]:
    """Budgets whose plan is slower than one a smaller budget got (it fits there too): which,
    and the budget (with the sweep's other `ftc plan` `options`) to pass for the faster plan."""
    from flextensor_compile.sweep import slower_than_smaller
    from flextensor_compile.units import format_fraction, format_ms

    lines = []
    for p, faster in slower_than_smaller(points):
        assert p.makespan_ms is not None and faster.makespan_ms is not None
        lines.append(f"frac {format_fraction(p.fraction)} plans {format_ms(p.makespan_ms)} ms, "
                     f"slower than frac {format_fraction(faster.fraction)}'s "
                     f"{format_ms(faster.makespan_ms)} ms, whose plan fits it too: "
                     f"--budget {faster.budget_bytes}{options} gets that plan")  # fmt: skip
    return lines


def _no_plan_line(points: tuple[SweepPoint, ...], weights: int, most: float | None) -> str:
    """Why no budget swept has a plan, and which fractions to sweep instead (up to `most`, the
    largest fraction the device holds, when it holds less than every weight)."""
    from flextensor_compile.sweep import NO_FIT
    from flextensor_compile.units import format_bytes

    least = min((p.least_bytes for p in points if p.least_bytes), default=None)
    if least is None:
        over = [p for p in points if p.status != NO_FIT]
        why = over[0].error if over else "no plan fits any budget swept"
        return f"no budget swept has a plan: {why}"
    start = math.ceil(least / max(weights, 1) * 1000) / 1000  # budgets: fractions of the weights
    found = (f"no budget swept has a plan: the smallest feasible budget is {format_bytes(least)} "
             f"(frac {start:.3f} of the weights)")  # fmt: skip
    if most is not None and start > most:  # (an emulated device holds any budget)
        return (f"{found}, more than the device holds (frac {most:.3f}); plan for a larger "
                "device (`ftc profile --target` or `--device-memory`)")  # fmt: skip
    stop = 1.0 if most is None else min(most, 1.0)
    upto = "1.0" if stop >= 1.0 else f"{stop:.3f}"
    span = f"{start:.3f}:{upto}:0.05" if start < stop - 0.05 else f"{start:.3f}"
    return f"{found}; sweep from there, e.g. --fractions {span}"


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=FtcCommand)(sweep)
