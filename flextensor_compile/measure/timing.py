"""Per-trap compute time: the median over profiling iterations, after warm-up.

Owns: running the workload `warmup + iters` times under the trap hooks with a clock (CUDA events
on a GPU, perf_counter on CPU), turning the marks into per-slot milliseconds with the discovery's
slot rules, and taking the median per slot. On a GPU, a model that does not fit is measured trap
by trap: everything outside the module traps is placed on the device, and each trap's module is
copied in before its entry mark and its host originals put back after its exit mark, the time
of both cut out of the time line. Every tensor is put back as it came (device, storage, inner
fields) when timing ends.
Must not know: which tensors stream, the solver, the CLI.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from flextensor_compile.discover import Discovery
from flextensor_compile.discover.hooks import Event, TrapHooks
from flextensor_compile.discover.slots import attribute, drop_traps
from flextensor_compile.measure.clock import clock_for
from flextensor_compile.measure.residence import Residence, bytes_to_move
from flextensor_compile.model_file import Inputs, call_run, inputs_on
from flextensor_runtime.backend.cuda import allocatable_bytes

__all__ = ["Timing", "measure_compute", "place_for_timing", "place_whole", "streamable_traps"]

_FIT_SHARE = 0.8  # measure with the whole model on the GPU when it takes at most this share
_TIMED = ("begin", "end", "enter", "exit", "pause", "resume")  # events that carry a clock value


@dataclass(frozen=True)
class Timing:
    """Median compute time per slot (trap or gap) and what measuring cost."""

    compute_ms: dict[str, float]
    forwards: int  # run() calls: warm-up + profiling
    seconds: float
    streamed: bool  # measured trap by trap (the model did not fit on the device)
    # on a GPU with the whole model placed: the most device memory the iterations allocated
    # beyond the model and its inputs (activations, workspaces); None elsewhere
    activation_peak_bytes: int | None = None


def _move_except(residence: Residence, module: nn.Module, path: str, skip: set[str]) -> None:
    for name, child in module.named_children():
        child_path = f"{path}.{name}" if path else name
        if child_path not in skip:
            _move_except(residence, child, child_path, skip)
    residence.move(module, recurse=False)


def place_for_timing(
    residence: Residence, model: nn.Module, discovery: Discovery, fit_bytes: int | None = None
) -> bool:
    """Put the model on the residence's device for timing (`residence.restore()` puts every
    tensor back, also after a failure part way); True when traps must stream in one by one (the
    bytes still to move, ties once, exceed `fit_bytes`, by default 80% of the device's free
    memory, the allocator's cache included)."""
    device = residence.device
    if device.type != "cuda":
        return False
    if _fits(model, device, fit_bytes):
        residence.move(model)
        return False
    _move_except(residence, model, "", set(streamable_traps(discovery)))
    return True


def _fits(model: nn.Module, device: torch.device, fit_bytes: int | None = None) -> bool:
    if fit_bytes is None:
        fit_bytes = int(_FIT_SHARE * allocatable_bytes(device))
    return bytes_to_move(model, device) <= fit_bytes


def place_whole(residence: Residence, model: nn.Module) -> bool:
    """On a GPU, the whole model placed on the residence's device when it fits (so discovery
    runs there too, as models with CUDA-only kernels need); False (nothing moved) otherwise."""
    if residence.device.type != "cuda" or not _fits(model, residence.device):
        return False
    residence.move(model)
    return True


def streamable_traps(discovery: Discovery) -> tuple[str, ...]:
    """Module traps that can be copied in and out around their call while timing: not those
    holding a tensor another trap reads or a tied weight (moving it would move it for both)."""
    report = discovery.report
    shared = set(report.cross_reads) | set(report.split_ties)

    def movable(trap: str) -> bool:
        return not any(t.name in shared or t.tie is not None for t in discovery.tensors[trap])

    return tuple(
        t for t in discovery.plan.traps if discovery.plan.kinds[t] == "module" and movable(t)
    )


def _one_iteration(
    model: nn.Module, inputs: Inputs, run: Callable[..., Any] | None, discovery: Discovery,
    device: torch.device, streamed: bool, source: str,
) -> dict[str, float]:  # fmt: skip
    clock = clock_for(device)
    modules = dict(model.named_modules())
    traps = {t: modules[t] for t in discovery.plan.traps if discovery.plan.kinds[t] == "module"}
    on_enter = on_exit = None
    if streamed:
        moving = set(streamable_traps(discovery))
        calls: dict[str, Residence] = {}  # one per trap call: its exit restores only its moves

        def on_enter(name: str) -> None:
            if name in moving:
                call = Residence(device)
                try:
                    call.move(traps[name])
                except BaseException:  # no exit will come for a trap that never entered
                    call.restore()
                    raise
                calls[name] = call

        def on_exit(name: str) -> None:
            if name in calls:
                calls.pop(name).restore()

    hooks = TrapHooks(None if discovery.whole_run else model, traps, clock.mark, on_enter, on_exit)
    with torch.no_grad(), hooks.installed():
        if discovery.whole_run:
            hooks.begin()
        call_run(run, model, inputs, source)
        if discovery.whole_run:
            hooks.end()
    unknown = {
        e.name for e in hooks.events if e.kind == "enter" and e.name not in discovery.plan.kinds
    }
    events = drop_traps(hooks.events, unknown)  # e.g. a manual region discovery found nested
    timed = [i for i, e in enumerate(events) if e.kind in _TIMED]
    ms = clock.to_ms([events[i].value for i in timed])
    for i, value in zip(timed, ms, strict=True):
        events[i] = replace(events[i], value=value)
    return attribute(_without_pauses([e for e in events if e.kind != "op"]), discovery.plan)


def _without_pauses(events: list[Event]) -> list[Event]:
    """The events with each pause..resume stretch (a trap's weights copied in or put back while
    timing trap by trap) cut out of the time line, so no slot is charged for it."""
    out: list[Event] = []
    paused_ms = 0.0
    pause_at = 0.0
    for e in events:
        if e.kind == "pause":
            pause_at = float(e.value)
        elif e.kind == "resume":
            paused_ms += float(e.value) - pause_at
        else:
            out.append(replace(e, value=float(e.value) - paused_ms) if e.kind in _TIMED else e)
    return out


def measure_compute(
    model: nn.Module,
    inputs: Inputs,
    run: Callable[..., Any] | None,
    discovery: Discovery,
    *,
    iters: int,
    warmup: int,
    device: torch.device,
    source: str = "model",
    on_iteration: Callable[[], None] | None = None,
    fit_bytes: int | None = None,
) -> Timing:
    """Run `warmup + iters` iterations and return the median per-slot time of the last `iters`."""
    started = time.perf_counter()
    residence = Residence(device)
    device = residence.device  # a bare "cuda" as the index tensors report
    samples: list[dict[str, float]] = []
    try:  # from the first move: a failure part way (out of memory) still puts everything back
        streamed = place_for_timing(residence, model, discovery, fit_bytes)
        if device.type != "cpu":
            inputs = inputs_on(inputs, device)
        base = _start_peak(device) if device.type == "cuda" and not streamed else None
        for i in range(warmup + iters):
            per_slot = _one_iteration(model, inputs, run, discovery, device, streamed, source)
            if i >= warmup:
                samples.append(per_slot)
            if on_iteration is not None:
                on_iteration()
        peak = None if base is None else max(0, torch.cuda.max_memory_allocated(device) - base)
    finally:
        residence.restore()  # every tensor back where it was, pinned or mapped storage kept
    compute_ms = {
        slot: float(statistics.median(s[slot] for s in samples)) for slot in discovery.plan.order
    }
    return Timing(compute_ms, warmup + iters, time.perf_counter() - started, streamed, peak)


def _start_peak(device: torch.device) -> int:
    """Reset the device's peak-memory counter; the bytes allocated now (model and inputs)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))
