"""`ftc plan STATS_OR_PROFILE`: re-solve recorded measurements into a profile, without the model.

Owns: the plan command's options (budget, strategy, blocks, output). Must not know: how plans
are searched (planning) or how profiles are encoded (the profile package).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flextensor_compile.cli.help import FLAG, FtcCommand
from flextensor_compile.cli.profile_cmd import ASSIGNMENT_HELP, RESERVE_HELP, STRATEGY_HELP
from flextensor_compile.cli.streams import dash_is_stdout

if TYPE_CHECKING:
    from flextensor_runtime.profile import Profile

__all__ = ["register"]


_STATS_HELP = "A stats file (JSON) written by `ftc profile`, or a profile (.msgpack)."
_OUT_HELP = "Where to write the profile (.msgpack)."
_FRACTION_HELP = "Fraction of device memory weights may use (memory mode)."
_BLOCKS_HELP = "Blocks to assign into: at most this many (default: 1, 2 and 3 tried)."
_SEED_HELP = "Seed recorded in the plan (as `ftc profile`'s)."
_JSON_HELP = "Print the profile's inspect document."


def plan(
    stats: Path = typer.Argument(..., help=_STATS_HELP),
    out: Path = typer.Option(..., "-o", "--output", help=_OUT_HELP, callback=dash_is_stdout),
    mem_fraction: float = typer.Option(None, "--mem-fraction", help=_FRACTION_HELP),
    budget: str = typer.Option(None, "--budget", help="Bytes weights may use, e.g. 6GiB."),
    activation_reserve: str = typer.Option(None, "--activation-reserve", help=RESERVE_HELP),
    strategy: str = typer.Option("adaptive", "--strategy", help=STRATEGY_HELP),
    num_blocks: int = typer.Option(None, "--num-blocks", help=_BLOCKS_HELP),
    min_blocks: int = typer.Option(1, "--min-blocks", help="Fewest memory blocks to use."),
    assignment: str = typer.Option("optimized-round-robin", "--assignment", help=ASSIGNMENT_HELP),
    seed: int = typer.Option(0, "--seed", help=_SEED_HELP),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help=_JSON_HELP),
) -> None:
    """Solve a stats file (or a profile's measurements) into an offload profile.

    Memory mode with --budget or --mem-fraction, else latency mode."""
    from flextensor_compile.cli.inputs import read_input
    from flextensor_compile.cli.streams import check_stdout_outputs
    from flextensor_compile.config import plan_command
    from flextensor_compile.planning import plan_profile
    from flextensor_compile.units import parse_size
    from flextensor_runtime.profile import PlanConfig, save

    _check(stats, out, mem_fraction, budget, num_blocks, min_blocks, seed)
    check_stdout_outputs(as_json, [("-o", out)])
    config = PlanConfig(
        budget_bytes=None if budget is None else parse_size(budget, "--budget"),
        mem_fraction=mem_fraction, strategy=strategy, num_blocks=num_blocks,
        min_blocks=min_blocks, assignment=assignment, seed=seed,
        activation_reserve_bytes=0 if activation_reserve is None
        else parse_size(activation_reserve, "--activation-reserve"),
    )  # fmt: skip
    # The canonical command (not argv): `ftc profile` records the same text for the same options,
    # so a profile re-planned from its stats is byte-identical.
    measured, source = read_input(stats)
    profile = plan_profile(measured, config, command=plan_command(config))
    save(profile, out)
    _report(profile, out, as_json)
    _note_dropped_sections(source)


def _note_dropped_sections(source: Profile | None) -> None:
    """A profile input's caches or vram sections are not in the new profile (`ftc plan` writes
    the plan only): a deployment of it would run without them, so say so (on stderr)."""
    from flextensor_compile.cli.render import err_console, safe
    from flextensor_compile.emit import SOLVER_SECTION

    dropped = sorted(k for k in (source.extensions if source else {}) if k != SOLVER_SECTION)
    if not dropped:
        return
    fix = ("; `ftc profile --cache`/`--vram` writes those"
           if {"caches", "vram"} & set(dropped) else "")  # fmt: skip
    noun = "section is" if len(dropped) == 1 else "sections are"
    err_console().print(f"note: the input's {safe(', '.join(dropped))} {noun} not in the new "
                        f"profile (ftc plan writes the plan only){fix}", soft_wrap=True)  # fmt: skip


def _report(profile: Profile, out: Path, as_json: bool) -> None:
    """The inspect document or the summary line, on stderr when the profile went to stdout."""
    from flextensor_compile.cli.render import print_json
    from flextensor_compile.cli.streams import text_off_stdout
    from flextensor_compile.inspect_doc import inspect_document

    with text_off_stdout(out):  # `-o /dev/stdout`: the profile alone on stdout
        if as_json:
            print_json(inspect_document(profile))
        else:
            _print_summary(profile, out)


def _print_summary(profile: Profile, out: Path) -> None:
    """One line: what was written and what it predicts."""
    from flextensor_compile.cli.render import out_console, safe
    from flextensor_compile.units import count_of, format_bytes, format_ms

    p = profile.predicted
    limit = profile.config.budget_bytes
    out_console().print(
        f"wrote {safe(out)}: resident {format_bytes(p.resident_bytes)}, streamed "
        f"{format_bytes(p.streamed_bytes)} in {count_of(len(profile.schedule), 'copy')}, "
        f"{count_of(len(profile.blocks), 'block')}; peak {format_bytes(p.peak_bytes)}"
        + ("" if limit is None else f" of {format_bytes(limit)}")
        + f"; makespan {format_ms(p.makespan_ms)} ms (compute {format_ms(p.compute_ms)}, stall "
        f"{format_ms(p.stall_ms)})"
    )


def _check(stats: Path, out: Path, mem_fraction: float | None, budget: str | None,
           num_blocks: int | None, min_blocks: int, seed: int) -> None:  # fmt: skip
    """The options and the output path, before the stats file is read."""
    from flextensor_compile.cli.limits import MAX_BLOCKS, check_at_most, check_seed
    from flextensor_compile.cli.paths import check_distinct, check_output_file
    from flextensor_runtime.errors import ConfigError

    if mem_fraction is not None and budget is not None:
        raise ConfigError("both --mem-fraction and --budget were given; pass only one")
    check_at_most({"--num-blocks": num_blocks, "--min-blocks": min_blocks}, MAX_BLOCKS,
                  "more blocks than the model has tensors")  # fmt: skip
    check_seed(seed)
    check_output_file(out, "-o", "profile.msgpack")
    check_distinct([("-o", out)], [("the input", stats)])


def register(app: typer.Typer) -> None:
    app.command("plan", cls=FtcCommand)(plan)
