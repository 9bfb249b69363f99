"""`compile_profile`: the Python API of `ftc profile` (discover -> measure -> solve -> emit).

Owns: the order of the phases, turning discovery and measurement into a `Stats` record, the
profiling cost (forwards, seconds), progress callbacks for front ends, and the instrumentation
document (how each component was configured). Planning goes through the stats' JSON form, so
`ftc plan stats.json` with the same options gives the same bytes.
Must not know: rich, typer, files other than what the caller asks for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from torch import nn

from flextensor_compile.compile_notes import activation_note, discovery_notes, unused_timing_note
from flextensor_compile.config import OffloadConfig, plan_command
from flextensor_compile.discover import Discovery, discover, is_meta_model
from flextensor_compile.measure import DeviceChoice, choose_device, measure_compute, roofline_ms
from flextensor_compile.measure.residence import Residence
from flextensor_compile.measure.targets import get_target
from flextensor_compile.measure.timing import place_whole
from flextensor_compile.model_file import Inputs, inputs_on, normalize_inputs
from flextensor_compile.stats import Stats, TrapStat, canonical_stats
from flextensor_compile.trap_granularity import splittable
from flextensor_runtime.errors import BudgetError, ConfigError
from flextensor_runtime.model_tensors import model_tensor_entries
from flextensor_runtime.profile import PlanConfig, Profile, TensorEntry

__all__ = ["INSTRUMENT_PARTS", "Compilation", "ProfilingCost", "ProgressSink", "collect_stats",
           "compile_profile", "instrumentation", "plan_command", "plan_stats",
           "summary_document"]  # fmt: skip

# The parts `instrumentation` returns: `--instrument DIR` writes DIR/<part>.json for each.
INSTRUMENT_PARTS = ("config", "discovery", "measurement", "plan")


class ProgressSink(Protocol):
    """What a front end implements to show progress (the CLI draws rich bars from it)."""

    def start(self, phase: str, total: int) -> None: ...

    def advance(self, phase: str) -> None: ...


@dataclass(frozen=True)
class ProfilingCost:
    """What measuring cost: run() calls of each kind and wall seconds."""

    discovery_forwards: int
    warmup_forwards: int
    profiling_forwards: int
    seconds: float

    @property
    def forwards(self) -> int:
        return self.discovery_forwards + self.warmup_forwards + self.profiling_forwards


@dataclass(frozen=True)
class Compilation:
    """Everything measured for one model: the stats plus how they were obtained."""

    stats: Stats
    discovery: Discovery
    device: DeviceChoice
    cost: ProfilingCost
    config: OffloadConfig
    notes: tuple[str, ...]
    granularity: str = "modules"  # the traps the stats hold: "modules" or "leaves"


def _inputs(example_inputs: Any) -> Inputs:
    if isinstance(example_inputs, Inputs):
        return example_inputs
    return normalize_inputs(example_inputs() if callable(example_inputs) else example_inputs)


def _stats(name: str, disc: Discovery, device: DeviceChoice, compute_ms: dict[str, float]) -> Stats:
    traps = tuple(
        TrapStat(
            name=slot,
            compute_ms=max(0.0, float(compute_ms.get(slot, 0.0))),
            tensors=disc.tensors.get(slot, ()),
            kind=disc.plan.kinds[slot],
            calls=disc.plan.calls.get(slot, 1),
        )
        for slot in disc.plan.order
    )
    return Stats(name=name, device=device.spec, traps=traps, untrapped=disc.untrapped,
                 timing_source=device.timing_source)  # fmt: skip


def _check_arguments(api: str, model: Any, config: Any, run: Any) -> None:
    """The arguments' types, before anything runs (one-line `ConfigError`s)."""
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{api} needs a torch.nn.Module, got {type(model).__name__}; pass the built model "
            "(for a model file use `ftc profile model.py`)"
        )
    if config is not None and not isinstance(config, OffloadConfig):
        raise ConfigError(
            f"{api} config={config!r:.40} is not an OffloadConfig; pass "
            "OffloadConfig(max_gpu_mem_fraction=0.6, ...) or leave it out"
        )
    if run is not None and not callable(run):
        raise ConfigError(
            f"{api} run={run!r:.40} is not callable; pass a function run(model, inputs) or "
            "leave it out"
        )


def collect_stats(
    model: nn.Module,
    example_inputs: Any,
    config: OffloadConfig | None = None,
    run: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    source: str = "model",
    progress: ProgressSink | None = None,
) -> Compilation:
    """Discover (one forward) and measure (warm-up + profiling forwards, or the roofline), at the
    configured granularity; `auto` measures module traps, and leaf traps too when the module
    plan stalls or does not fit, and keeps the stats whose plan is better (`choose_granularity`)."""
    _check_arguments("collect_stats", model, config, run)
    config = config or OffloadConfig()
    inputs = _inputs(example_inputs)
    if config.granularity != "auto":
        return _collect(model, inputs, config, run, config.granularity == "leaves", name, source,
                        progress)  # fmt: skip
    from flextensor_compile.trap_granularity import choose_granularity

    first: list[DeviceChoice] = []  # both measurements plan for the device (and rate) measured once

    def at(leaves: bool) -> Compilation:
        sink = _Suffixed(progress, " (leaves)") if leaves and progress is not None else progress
        c = _collect(model, inputs, config, run, leaves, name, source, sink,
                     first[0] if first else None)  # fmt: skip
        first.append(c.device)
        return c

    return choose_granularity(at, _plan_config(config))


@dataclass(frozen=True)
class _Suffixed:
    """A progress sink whose phases carry a suffix (the second measurement of `auto`)."""

    sink: ProgressSink
    suffix: str

    def start(self, phase: str, total: int) -> None:
        self.sink.start(phase + self.suffix, total)

    def advance(self, phase: str) -> None:
        self.sink.advance(phase + self.suffix)


def _collect(
    model: nn.Module,
    inputs: Inputs,
    config: OffloadConfig,
    run: Callable[..., Any] | None,
    leaves: bool,
    name: str | None,
    source: str,
    progress: ProgressSink | None,
    device: DeviceChoice | None = None,
) -> Compilation:
    started = time.perf_counter()
    # the tensors as the model was built (a placed copy is dense and ties only by object):
    # what the profile records and the deployment binds against
    entries = model_tensor_entries(model)
    if device is None:
        weight_bytes = sum(e.bytes for e in entries if e.tie is None)
        device = choose_device(config, weight_bytes, is_meta_model(model))
    placed = None if device.measure_on is None else Residence(device.measure_on)
    try:  # on a GPU, discovery and timing there when the model fits; it goes back after
        if placed is not None and place_whole(placed, model):
            inputs = inputs_on(inputs, placed.device)
        return _measured(model, inputs, config, run, leaves, name, source, progress, device,
                         started, entries)  # fmt: skip
    finally:
        if placed is not None:
            placed.restore()


def _measured(
    model: nn.Module, inputs: Inputs, config: OffloadConfig, run: Callable[..., Any] | None,
    leaves: bool, name: str | None, source: str, progress: ProgressSink | None,
    device: DeviceChoice, started: float, entries: list[TensorEntry],
) -> Compilation:  # fmt: skip
    """Discovery, then timing (or the roofline), into the stats of one granularity."""
    if progress is not None:
        progress.start("discovery", 1)
    disc = discover(model, inputs, run, config.include_patterns, config.exclude_patterns,
                    source=source, count_flops=device.measure_on is None, leaves=leaves,
                    entries=entries)  # fmt: skip
    if progress is not None:
        progress.advance("discovery")
    warmup = iters = 0
    peak: int | None = None
    unused: tuple[str, ...] = ()
    if device.measure_on is None:
        assert device.target is not None
        compute_ms = roofline_ms(disc, get_target(device.target.name))
        unused = unused_timing_note(config)
    else:
        warmup, iters = config.warmup_iters, config.profiling_iters
        if progress is not None:
            progress.start("profiling", warmup + iters)
        sink = progress
        timing = measure_compute(
            model, inputs, run, disc, iters=iters, warmup=warmup, device=device.measure_on,
            source=source, on_iteration=(lambda: sink.advance("profiling")) if sink else None,
        )  # fmt: skip
        compute_ms = timing.compute_ms
        peak = timing.activation_peak_bytes
    cost = ProfilingCost(1, warmup, iters, time.perf_counter() - started)
    stats = _stats(name or type(model).__name__, disc, device, compute_ms)
    granularity = "leaves" if leaves else "modules"
    notes = (*discovery_notes(disc, device), *unused,
             *activation_note(peak, config, device.spec.memory_bytes))  # fmt: skip
    return Compilation(stats, disc, device, cost, config, notes, granularity)


def plan_stats(stats: Stats, config: OffloadConfig, *, command: str = "") -> Profile:
    """Solve and emit from stats, exactly as `ftc plan` does from the saved stats file."""
    from flextensor_compile.planning import plan_profile

    plan_config = _plan_config(config)
    try:
        return plan_profile(canonical_stats(stats), plan_config,
                            command=command or plan_command(plan_config))  # fmt: skip
    except BudgetError as exc:
        if config.granularity != "modules" or not splittable(stats):
            raise
        raise BudgetError(
            f"{exc}; or pass --granularity auto: traps at the modules inside these that own "
            "the weights stage less, so a smaller budget may fit",
            least_bytes=exc.least_bytes,
        ) from None


def _plan_config(config: OffloadConfig) -> PlanConfig:
    # Patterns (and the granularity) were applied by discovery (their effect is in the stats'
    # traps and `offloadable` flags); `ftc plan` cannot know them, so the plan's config leaves
    # them out.
    return replace(config.to_plan_config(), include_patterns=(), exclude_patterns=())


def compile_profile(
    model: nn.Module,
    example_inputs: Any,
    config: OffloadConfig | None = None,
    run: Callable[..., Any] | None = None,
    *,
    command: str = "",
) -> Profile:
    """Compile an offload profile for `model` (the model is left where it was, unchanged).

    `example_inputs`: positional args (tuple), kwargs (dict), `(args, kwargs)`, or a function
    returning one of those. `run(model, inputs)`: one iteration of the real workload. The
    config's section options (`cache_spec`, `vram_spec`, ...) add the profile's `caches` and
    `vram` sections.
    """
    from flextensor_compile.profile_sections import add_sections, section_options

    _check_arguments("compile_profile", model, config, run)
    config = config or OffloadConfig()
    sections = section_options(config)  # bad specs fail before any forward
    stats = collect_stats(model, example_inputs, config, run).stats
    return add_sections(plan_stats(stats, config, command=command), stats, model, sections)


def instrumentation(compilation: Compilation, profile: Profile | None = None) -> dict[str, Any]:
    """How each component was configured, as a JSON-ready document (`--instrument DIR`)."""
    disc, dev, cfg = compilation.discovery, compilation.device, compilation.config
    timed = dev.measure_on is not None  # else roofline times: no timed forwards
    doc: dict[str, Any] = {
        "config": cfg.as_dict(),
        "discovery": {
            "patterns": list(disc.selection.include),
            "exclude": list(disc.selection.exclude),
            "default_include": disc.selection.default,
            "granularity": compilation.granularity,
            "traps": list(disc.plan.order),
            "iterations_per_run": disc.plan.iterations,
            "whole_run_is_iteration": disc.whole_run,
            "meta_device": disc.meta,
            "report": asdict(disc.report),
        },
        "measurement": {
            "timing_source": dev.timing_source,
            "device": asdict(dev.spec),
            "target": asdict(dev.target) if dev.target else None,
            # per measurement (`--granularity auto` may measure twice; `cost` counts both)
            "warmup_iters": cfg.warmup_iters if timed else 0,
            "profiling_iters": cfg.profiling_iters if timed else 0,
            "measurements": compilation.cost.discovery_forwards,
            "cost": {**asdict(compilation.cost), "forwards": compilation.cost.forwards},
        },
        "plan": asdict(cfg.to_plan_config()),
    }
    if profile is not None:
        doc["plan"]["blocks"] = [asdict(b) for b in profile.blocks]
        doc["plan"]["predicted"] = asdict(profile.predicted)
        doc["plan"]["transfer_mode"] = profile.config.transfer_mode
    return doc


def summary_document(c: Compilation, profile: Profile, output: str | None) -> dict[str, Any]:
    """The `ftc profile --json` document: what was measured, what it cost, what was planned."""
    p = profile.predicted
    return {
        "output": output,
        "model": c.stats.name,
        "device": {
            "name": c.stats.device.name,
            "kind": c.stats.device.kind,
            "memory_bytes": c.stats.device.memory_bytes,
            "h2d_bytes_per_s": c.stats.device.h2d_bytes_per_s,
        },
        "timing_source": c.stats.timing_source,
        "budget_bytes": profile.config.budget_bytes,
        "granularity": c.granularity,
        "traps": sum(1 for t in c.stats.traps if t.kind != "gap"),
        "gap_traps": sum(1 for t in c.stats.traps if t.kind == "gap"),
        "profiling_cost": {**asdict(c.cost), "forwards": c.cost.forwards},
        "predicted": {
            "compute_ms": p.compute_ms,
            "makespan_ms": p.makespan_ms,
            "stall_ms": p.stall_ms,
            "peak_bytes": p.peak_bytes,
            "resident_bytes": p.resident_bytes,
            "streamed_bytes": p.streamed_bytes,
        },
        "notes": [*c.notes, *_granularity_hint(c, profile)],
        "sections": _sections_summary(profile),
    }


def _granularity_hint(c: Compilation, profile: Profile) -> list[str]:
    """When module traps stall under a budget and hold several weights each: the option that
    may plan faster (it measures the finer traps too, so it is not done unasked)."""
    stall = profile.predicted.stall_ms
    if (c.config.granularity != "modules" or profile.config.budget_bytes is None
            or stall <= 0 or not splittable(c.stats)):  # fmt: skip
        return []
    return [f"the plan stalls {stall:.3f} ms per iteration; --granularity auto also measures the "
            "modules inside each trap that own its weights (finer traps stage less) and keeps "
            "them if they plan faster"]  # fmt: skip


def _sections_summary(profile: Profile) -> dict[str, Any]:
    """What the optional sections hold: the cached module, the vram disk tier's size."""
    ext, out = profile.extensions, {}
    if "caches" in ext:
        out["caches"] = {
            "module": ext["caches"].get("module"),
            "policy": ext["caches"].get("policy"),
        }
    if "vram" in ext:
        out["vram"] = {"disk_tensors": len(ext["vram"].get("disk_tensors", ()))}
    return out
