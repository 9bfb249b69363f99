"""`ftc sweep STATS_OR_PROFILE`: predicted makespan, stall and streamed bytes against the budget.

Owns: the sweep command's options, its progress bar (one step per budget) and its table.
Must not know: how plans are searched (sweep).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flextensor_compile.cli.help import FLAG, FtcCommand
from flextensor_compile.cli.profile_cmd import ASSIGNMENT_HELP, STRATEGY_HELP
from flextensor_compile.cli.progress import PhaseBars

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


def sweep(
    source: Path = typer.Argument(..., help="A stats file (JSON) or a profile (.msgpack)."),
    fractions: str = typer.Option(
        "0.2:1.0:0.05",
        "--fractions",
        help="Budgets as fractions of the weight bytes: START:STOP:STEP or a list like 0.3,0.5.",
    ),
    strategy: str = typer.Option(
        None,
        "--strategy",
        help=STRATEGY_HELP.rstrip(".") + " (default: the profile's, or adaptive).",
    ),
    assignment: str = typer.Option(
        None,
        "--assignment",
        help=ASSIGNMENT_HELP.rstrip(".") + " (default: the profile's, or optimized-round-robin).",
    ),
    plot: Path = typer.Option(None, "--plot", help="Also draw the curve to this PNG."),
    jobs: int = typer.Option(
        None,
        "--jobs",
        min=1,
        help="Worker processes for the budgets, at most one per CPU (1: none; default: one per "
        "CPU when the first budget's solve says the rest would take over 2 s).",
    ),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print the points as JSON."),
) -> None:
    """The memory/speed curve: re-solve at each budget and show what the plan predicts."""
    from flextensor_compile.cli.paths import atomic_output, image_format
    from flextensor_compile.cli.render import print_json
    from flextensor_compile.sweep import plot_sweep
    from flextensor_compile.sweep import sweep as run_sweep

    budgets = _checked_fractions(fractions, plot, source)
    stats, config = _load(source)
    config = _override(config, strategy, assignment)
    with PhaseBars(quiet=False) as bars:  # on stderr, and only on a terminal
        bars.start("sweep", len(budgets))
        points = run_sweep(stats, config, budgets, lambda: bars.advance("sweep"), jobs)
    if plot is not None:
        with atomic_output(plot) as tmp:
            plot_sweep(points, tmp, image_format(plot))
    if as_json:
        print_json([asdict(p) for p in points])
    else:
        _print_points(points, plot)


def _print_points(points: tuple[SweepPoint, ...], plot: Path | None) -> None:
    """The table, where to look when picking a budget, and where the plot went."""
    from flextensor_compile.cli.render import out_console, safe, sweep_table

    console = out_console()
    console.print(sweep_table(points))
    for line in _pick_lines(points):
        console.print(line)
    if plot is not None:
        console.print(f"plot written to {safe(plot)}")


def _pick_lines(points: tuple[SweepPoint, ...]) -> list[str]:
    """Where to look when picking a budget: the smallest budget within 5% and 20% of the
    fastest plan swept."""
    from flextensor_compile.sweep import smallest_near_fastest
    from flextensor_compile.units import format_bytes

    fastest = smallest_near_fastest(points, 0.0)
    if fastest is None or fastest.makespan_ms is None:
        return []
    lines = [f"fastest: {fastest.makespan_ms:.3f} ms, first at frac {fastest.fraction:.2f} "
             f"({format_bytes(fastest.budget_bytes)})"]  # fmt: skip
    for within in (0.05, 0.20):
        near = smallest_near_fastest(points, within)
        if near is not None and near is not fastest and near.makespan_ms is not None:
            lines.append(f"within {within:.0%} of it from frac {near.fraction:.2f} "
                         f"({format_bytes(near.budget_bytes)}): {near.makespan_ms:.3f} ms")  # fmt: skip
    return lines


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=FtcCommand)(sweep)
