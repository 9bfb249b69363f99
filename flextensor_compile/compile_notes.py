"""The notes `ftc profile` prints about a compilation: the device choice, what discovery kept
resident and why, and activation memory the budget leaves no room for.

Owns: the wording and the conditions of those notes.
Must not know: rich, typer, the solver, how anything was measured.
"""

from __future__ import annotations

import math

from flextensor_compile.config import OffloadConfig
from flextensor_compile.discover import Discovery
from flextensor_compile.measure import DeviceChoice
from flextensor_compile.units import count_of, format_bytes

__all__ = ["activation_note", "discovery_notes", "unused_timing_note"]


def discovery_notes(disc: Discovery, device: DeviceChoice) -> tuple[str, ...]:
    """The device choice's note and what discovery kept resident, and why."""
    r = disc.report
    notes = [device.note] if device.note else []
    never = [p for p in r.unused if p not in r.outside]
    if never:
        notes.append(f"{count_of(len(never), 'selected module')} never ran and "
                     f"{_stay(never)} resident: {_first(never)}")  # fmt: skip
    if r.outside:
        notes.append(f"{count_of(len(r.outside), 'selected module')} ran only outside the "
                     "model's forward (called by run() itself, e.g. an encoder that generate() "
                     f"runs first) and {_stay(r.outside)} resident: {_first(r.outside)}; a plan "
                     "covers the model's forward calls: to stream them, let run() reach them "
                     "through the forward (e.g. one forward with decoder_input_ids)")  # fmt: skip
    if r.conditional:
        notes.append(f"conditional traps kept resident: {', '.join(r.conditional[:3])}")
    if r.cross_reads:
        first = next(iter(r.cross_reads))
        one = len(r.cross_reads) == 1
        notes.append(f"{count_of(len(r.cross_reads), 'tensor')} read outside "
                     f"{'its trap stays' if one else 'their trap stay'} resident "
                     f"(e.g. {first} read by {', '.join(r.cross_reads[first])})")  # fmt: skip
    if r.split_ties:
        notes.append(
            f"tied weights shared across traps stay resident: {', '.join(r.split_ties[:3])}"
        )
    return tuple(notes)


def _stay(names: list[str] | tuple[str, ...]) -> str:
    return "stays" if len(names) == 1 else "stay"


def _first(names: list[str] | tuple[str, ...]) -> str:
    return f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"


def unused_timing_note(config: OffloadConfig) -> tuple[str, ...]:
    """With roofline times (`--target`, no forward timed), timing options asked for are unused."""
    defaults = type(config)()
    asked = [flag for field, flag in (("profiling_iters", "--profiling-iters"),
                                      ("warmup_iters", "--warmup-iters"), ("device", "--device"))
             if getattr(config, field) != getattr(defaults, field)]  # fmt: skip
    if not asked:
        return ()
    return (f"{', '.join(asked)} unused: with --target compute times come from the roofline "
            "and no forward is timed",)  # fmt: skip


def activation_note(
    peak_bytes: int | None, config: OffloadConfig, memory_bytes: int
) -> tuple[str, ...]:
    """A note when the budget plus what timing saw activations take (beyond the reserve the
    budget keeps) exceeds the device's memory (memory mode only: a latency plan has no budget)."""
    if config.budget_bytes is not None:
        budget = config.budget_bytes
    elif config.max_gpu_mem_fraction is not None:
        budget = int(config.max_gpu_mem_fraction * memory_bytes)
    else:
        return ()
    kept = config.activation_reserve_bytes
    if peak_bytes is None or peak_bytes <= kept or budget + peak_bytes - kept <= memory_bytes:
        return ()
    return (
        f"activations took up to {format_bytes(peak_bytes)} of device memory while timing; with "
        f"the budget ({format_bytes(budget)}, {format_bytes(kept) if kept else 'none'} of it kept "
        f"for activations) that is more than the device's {format_bytes(memory_bytes)}: pass "
        f"--activation-reserve {math.ceil(peak_bytes / 2**20)}MiB (more for larger inputs) or "
        "a smaller budget",
    )
