"""`ftc profile MODEL`: load a model file, discover, measure, solve and write a profile.

Owns: the profile command's options and the summary it prints (its progress bars are
`progress.PhaseBars`). Parsing and rendering only: the work is `flextensor_compile.compile_api`.
Heavy imports (torch, the compiler) happen inside the command so `ftc --help` stays instant.
Must not know: how discovery, measurement or solving work.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import typer

from flextensor_compile.cli.help import FLAG, FtcCommand
from flextensor_compile.cli.progress import PhaseBars
from flextensor_compile.cli.streams import (
    check_stdout_outputs,
    dash_is_stdout,
    is_stdout,
    stdout_to_stderr,
    text_off_stdout,
)

__all__ = ["register"]


def _check_limits(opts: dict[str, Any]) -> None:
    from flextensor_compile.cli import limits as lim

    blocks = {"--num-blocks": opts["num_blocks"], "--min-blocks": opts["min_blocks"]}
    lim.check_at_most(blocks, lim.MAX_BLOCKS, "more blocks than the model has tensors")
    iters = {"--profiling-iters": opts["profiling_iters"], "--warmup-iters": opts["warmup_iters"]}
    lim.check_at_most(iters, lim.MAX_ITERS, "each is a full forward; the median settles in a few")
    lim.check_seed(opts["seed"])


def _config(opts: dict[str, Any]) -> Any:
    from flextensor_compile.config import OffloadConfig
    from flextensor_compile.units import parse_rate, parse_size

    _check_limits(opts)

    values: dict[str, Any] = {
        "include_patterns": tuple(opts["include"] or ()),
        "exclude_patterns": tuple(opts["exclude"] or ()),
        "max_gpu_mem_fraction": opts["mem_fraction"],
        "budget_bytes": parse_size(opts["budget"], "--budget") if opts["budget"] else None,
        "activation_reserve_bytes": parse_size(opts["activation_reserve"], "--activation-reserve")
        if opts["activation_reserve"] else 0,
        "target": opts["target"],
        "device_memory_bytes": parse_size(opts["device_memory"], "--device-memory")
        if opts["device_memory"] else None,
        "h2d_bytes_per_s": parse_rate(opts["bandwidth"], "--bandwidth") if opts["bandwidth"] else None,
        "load_strategy": opts["strategy"],
        "num_blocks": opts["num_blocks"],
        "min_blocks": opts["min_blocks"],
        "assignment_strategy": opts["assignment"],
        "profiling_iters": opts["profiling_iters"],
        "warmup_iters": opts["warmup_iters"],
        "device": opts["device"],
        "granularity": opts["granularity"],
        "seed": opts["seed"],
        "cache_spec": opts["cache"],
        "vram_spec": opts["vram"],
        "host_memory_bytes": parse_size(opts["host_memory"], "--host-memory")
        if opts["host_memory"] else None,
        "vram_checkpoint": opts["checkpoint"],
    }  # fmt: skip
    return OffloadConfig(**values)


RESERVE_HELP = (
    "Memory mode: bytes of the budget kept free for activations, e.g. 2GiB (resident weights "
    "+ blocks + this <= budget)."
)
STRATEGY_HELP = (
    "Offloading strategy: adaptive, knapsack, greedy, nth-layer, adaptive-knapsack, "
    "global-offload or global-tensor-selection."
)
ASSIGNMENT_HELP = (
    "Block assignment: optimized-round-robin (blocks or the ring, whichever simulates faster), "
    "strict-round-robin, or ring (one staging block, tensors placed where bytes free up first)."
)


def _render(doc: dict[str, Any], notes_to: Any) -> None:
    from flextensor_compile.cli.render import safe
    from flextensor_compile.units import count_of, format_bytes, format_ms, printable

    c, p = doc["profiling_cost"], doc["predicted"]
    dev = doc["device"]
    for line in doc["notes"]:
        notes_to.print(f"note: {safe(line)}", soft_wrap=True)
    notes_to.print(
        f"profiling cost: {count_of(c['forwards'], 'forward')} ({c['discovery_forwards']} discovery, "
        f"{c['warmup_forwards']} warm-up, {c['profiling_forwards']} profiling), "
        f"{c['seconds']:.2f} s; timing: {safe(doc['timing_source'])}",
        soft_wrap=True,
    )
    print(
        f"wrote {printable(doc['output'])}: {count_of(doc['traps'], 'trap')} + "
        f"{count_of(doc['gap_traps'], 'gap trap')} for "
        f"{printable(dev['name'])} ({format_bytes(dev['memory_bytes'])}); resident "
        f"{format_bytes(p['resident_bytes'])}, streamed {format_bytes(p['streamed_bytes'])}, "
        f"peak {format_bytes(p['peak_bytes'])}; predicted {format_ms(p['makespan_ms'])} ms per "
        f"iteration ({format_ms(p['stall_ms'])} ms stall)"
    )
    sections = doc["sections"]
    if "caches" in sections:
        print(f"caches section: {sections['caches']['policy']} on {sections['caches']['module']!r}")
    if "vram" in sections:
        print(
            f"vram section: {count_of(sections['vram']['disk_tensors'], 'tensor')} served from disk"
        )


def profile(
    model: str = typer.Argument(..., help="A model file (model.py) or package.module:build_model."),
    inputs: str = typer.Option(None, "--inputs", help="Example inputs from package.module:fn or inputs.py:fn (replaces example_inputs)."),
    mem_fraction: float = typer.Option(None, "--mem-fraction", help="Fraction of device memory weights may use (memory mode)."),
    budget: str = typer.Option(None, "--budget", help="Bytes weights may use, e.g. 6GiB (memory mode)."),
    activation_reserve: str = typer.Option(None, "--activation-reserve", help=RESERVE_HELP),
    target: str = typer.Option(None, "--target", help="Plan for a built-in GPU: rtx4090, a100-40g, a100-80g, h100-pcie, h100-sxm, h200, l4."),
    device_memory: str = typer.Option(None, "--device-memory", help="Device memory size, e.g. 24GiB."),
    bandwidth: str = typer.Option(None, "--bandwidth", help="Host-to-device copy rate, e.g. 25GB/s."),
    strategy: str = typer.Option("adaptive", "--strategy", help=STRATEGY_HELP),
    include: list[str] = typer.Option(None, "--include", help="Include pattern (repeatable): glob on module/parameter paths, or class:Name."),
    exclude: list[str] = typer.Option(None, "--exclude", help="Exclude pattern (repeatable): an excluded module is not a trap, an excluded tensor stays resident."),
    num_blocks: int = typer.Option(None, "--num-blocks", help="Blocks to assign into: at most this many (default: 1, 2 and 3 tried)."),
    min_blocks: int = typer.Option(1, "--min-blocks", help="Fewest memory blocks."),
    assignment: str = typer.Option("optimized-round-robin", "--assignment", help=ASSIGNMENT_HELP),
    profiling_iters: int = typer.Option(5, "--profiling-iters", help="Timed iterations (median)."),
    warmup_iters: int = typer.Option(1, "--warmup-iters", help="Untimed iterations first."),
    device: str = typer.Option("auto", "--device", help="Where to time: auto, cpu or cuda."),
    granularity: str = typer.Option("auto", "--granularity", help="Traps: auto (default: module traps, and leaf traps too when the module plan stalls; the better plan kept), modules (each selected module), or leaves (the modules inside them that own the weights)."),
    save_stats: Path = typer.Option(None, "--save-stats", help="Also write the measurements (stats.json) for `ftc plan`.", callback=dash_is_stdout),
    output: Path = typer.Option(Path("profile.msgpack"), "-o", "--output", help="Where to write the profile.", callback=dash_is_stdout),
    seed: int = typer.Option(0, "--seed", help="Seed recorded in the plan (ties broken deterministically)."),
    quiet: bool = typer.Option(False, "--quiet", metavar=FLAG, help="No progress bars or notes."),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print a machine-readable summary."),
    instrument: Path = typer.Option(None, "--instrument", help="Write each component's resolved configuration as JSON into DIR."),
    cache: str = typer.Option(None, "--cache", help="Write a caches section, e.g. fixed-step:module=transformer;skip=2-18/2."),
    vram: str = typer.Option(None, "--vram", help="Write a vram section, e.g. map=Linear:linear,LayerNorm:module;offload_device=cpu;computation_device=cuda."),
    host_memory: str = typer.Option(None, "--host-memory", help="With --vram: host memory for weights, e.g. 32GiB; wrapped modules beyond it are read from disk."),
    checkpoint: str = typer.Option(None, "--checkpoint", help="With --vram: the safetensors file (or index.json) the disk tier reads."),
) -> None:  # fmt: skip
    """Compile an offload profile: discover (one forward), measure, solve, write."""
    _run(dict(locals()))


def _run(opts: dict[str, Any]) -> None:
    """Check outputs and sections first, then discover, measure, solve and write."""
    model, inputs, output = opts["model"], opts["inputs"], opts["output"]
    save_stats, instrument = opts["save_stats"], opts["instrument"]
    quiet, as_json = opts["quiet"], opts["as_json"]
    config = _config(opts)
    _check_outputs(model, output, save_stats, instrument, as_json)
    from flextensor_compile import compile_api
    from flextensor_compile.model_file import build_model, load_model_spec, make_inputs
    from flextensor_compile.profile_sections import add_sections, section_options
    from flextensor_compile.stats import save_stats as write_stats
    from flextensor_runtime.profile import save

    sections = section_options(config)  # bad specs fail before the model is built
    # Absolute now: a model file may change the working folder (names are printed as given).
    output_at = output.absolute()
    stats_at = None if save_stats is None else save_stats.absolute()
    instrument_at = None if instrument is None else instrument.absolute()
    # With --json (or an output on stdout) stdout carries one document: what the model file
    # prints goes to stderr; the outputs are written after, to the real stdout if named so.
    keep = as_json or is_stdout(output) or is_stdout(save_stats)
    with PhaseBars(quiet or as_json) as bars:
        with stdout_to_stderr() if keep else nullcontext():
            spec = load_model_spec(model, inputs)
            config = config.with_patterns(spec.include, spec.exclude)
            built = build_model(spec)
            example = make_inputs(spec)
            stem = Path(model).stem if model.endswith(".py") else model
            c = compile_api.collect_stats(built, example, config, spec.run, name=stem,
                                          source=spec.source, progress=bars)  # fmt: skip
        if stats_at is not None:
            write_stats(c.stats, stats_at)
        bars.start("solving", 1)
        prof = add_sections(_plan(compile_api, c.stats, config, save_stats), c.stats, built,
                            sections)  # fmt: skip
        bars.advance("solving")
    save(prof, output_at)
    with text_off_stdout(output, save_stats):
        _finish(compile_api, c, prof, output, instrument_at, quiet, as_json, bars.console)


def _check_outputs(model: str, output: Path, save_stats: Path | None, instrument: Path | None,
                   as_json: bool) -> None:  # fmt: skip
    """Every output path is writable, distinct and not the model file: bad paths fail before
    the model is built."""
    from flextensor_compile.cli.paths import check_distinct, check_output_dir, check_output_file
    from flextensor_compile.compile_api import INSTRUMENT_PARTS

    check_output_file(output, "-o", "profile.msgpack")
    check_output_file(save_stats, "--save-stats", "stats.json")
    check_output_dir(instrument, "--instrument")
    check_stdout_outputs(as_json, [("-o", output)])
    check_stdout_outputs(as_json, [("--save-stats", save_stats)], binary=False)  # JSON text
    model_path = Path(model) if Path(model).is_file() else None
    parts = [] if instrument is None else [instrument / f"{p}.json" for p in INSTRUMENT_PARTS]
    check_distinct([("--instrument", instrument), *(("--instrument", p) for p in parts),
                    ("-o", output), ("--save-stats", save_stats)],
                   [("the model file", model_path)])  # fmt: skip


def _plan(api: Any, stats: Any, config: Any, saved: Path | None) -> Any:
    """The plan; when none fits and the measurements were saved, the error says how to re-plan
    them without profiling again (a large model's measurement takes minutes)."""
    from dataclasses import replace

    from flextensor_compile.config import plan_command
    from flextensor_compile.units import printable
    from flextensor_runtime.errors import BudgetError

    try:
        return api.plan_stats(stats, config)
    except BudgetError as exc:
        if saved is None:
            raise
        plan = config.to_plan_config()  # the options given, at the least budget when known
        if exc.least_bytes is not None:
            plan = replace(plan, budget_bytes=exc.least_bytes, mem_fraction=None)
        options = plan_command(plan).removeprefix("ftc plan")
        raise BudgetError(f"{exc}; the measurements are saved: `ftc plan {printable(saved)}"
                          f"{options} -o OUT` re-plans them without the model",
                          least_bytes=exc.least_bytes) from None  # fmt: skip


def _finish(api: Any, c: Any, prof: Any, output: Path, instrument: Path | None, quiet: bool,
            as_json: bool, console: Any) -> None:  # fmt: skip
    """Write the instrumentation files and print the summary (human, JSON, or one line)."""
    if instrument is not None:
        from flextensor_compile.cli.paths import atomic_output

        instrument.mkdir(parents=True, exist_ok=True)
        for part, doc in api.instrumentation(c, prof).items():
            with atomic_output(instrument / f"{part}.json") as tmp:
                tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    summary = api.summary_document(c, prof, str(output))
    if as_json:
        from flextensor_compile.cli.render import print_json

        print_json(summary)
    elif not quiet:
        _render(summary, console)
    else:
        from flextensor_compile.units import printable

        print(f"wrote {printable(output)}")


def register(app: typer.Typer) -> None:
    app.command("profile", cls=FtcCommand)(profile)
