"""Strategy replan: re-time the traps under the real runtime and rebuild the schedule once.

Owns: arming measurement for the next N iterations of an installed model, turning the measured
per-trap times into a new plan (same placements and blocks; each copy re-issued as late as its
measured transfer window allows, never before the previous holder of its bytes is released;
at the entry of its own trap when that holder is the trap just before, and never after a trap
that reads it through a tied tensor), re-predicting stalls, swapping the new schedule into the running traps, and saving it.
Must not know: the compiler's solver, files beyond `profile.save`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from torch import nn

from flextensor_runtime import profile as profile_format
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import Predicted, Profile, TensorEntry, Transfer
from flextensor_runtime.schedule import build_tables, entry_issue_order
from flextensor_runtime.traps import Runtime

__all__ = ["ReplanRequest", "rebuild_schedule", "replan"]


@dataclass
class ReplanRequest:
    """An armed replan: drive `iters` forwards, then `profile` holds the rebuilt plan."""

    model: nn.Module
    iters: int
    save: Path | None
    profile: Profile | None = None

    @property
    def done(self) -> bool:
        return self.profile is not None

    def __repr__(self) -> str:  # the model and the profile would print whole
        model = type(self.model).__name__
        return (
            f"ReplanRequest(model={model}, iters={self.iters}, save={self.save}, done={self.done})"
        )


def _window_ms(compute_ms: Sequence[float], start: int, end: int, n: int) -> float:
    return sum(compute_ms[j % n] for j in range(start, end))


def _overlaps(a: Transfer, b: Transfer) -> bool:
    return a.block == b.block and a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _carries(t: Transfer, e: TensorEntry) -> bool:
    return e.block == t.block and e.offset is not None and t.offset <= e.offset < t.offset + t.bytes


def _early_readers(profile: Profile) -> dict[int, int]:
    """id(transfer) -> the first trap before the transfer's own that reads it (a tied tensor)."""
    owner = {e.name: i for i, trap in enumerate(profile.traps) for e in trap.tensors}
    out: dict[int, int] = {}
    for i, trap in enumerate(profile.traps):
        for e in trap.tensors:
            if e.tie is None or e.placement == "resident" or owner.get(e.tie, -1) <= i:
                continue
            for t in profile.schedule:
                if t.trap == owner[e.tie] and _carries(t, e):
                    out[id(t)] = min(out.get(id(t), i), i)
    return out


def rebuild_schedule(profile: Profile, compute_ms: Sequence[float]) -> Profile:
    """Same placements and blocks; each transfer issued at the latest trap whose window hides
    its copy (or the earliest its bytes are free; at its own trap's entry when that is the
    trap's order); new predictions. Pure: no torch, no clock."""
    n = len(profile.traps)
    dev = profile.device
    schedule = []
    early = _early_readers(profile)
    for t in profile.schedule:
        prev = t.release_after - n  # no conflicting holder: the previous iteration's own copy
        for u in profile.schedule:
            if u is not t and _overlaps(t, u):
                r = u.release_after if u.release_after < t.trap else u.release_after - n
                prev = max(prev, r)
        copy_ms = t.bytes / dev.h2d_bytes_per_s * 1e3 + dev.h2d_latency_ms
        pos = prev + 1
        for p in range(t.trap - 1, prev, -1):
            if _window_ms(compute_ms, p, t.trap, n) >= copy_ms:
                pos = p
                break
        pos = min(pos, early.get(id(t), pos))
        schedule.append(replace(t, issue_at=pos % n))
    traps = tuple(
        replace(tr, compute_ms=float(ms)) for tr, ms in zip(profile.traps, compute_ms, strict=True)
    )
    new = replace(profile, traps=traps, schedule=tuple(schedule),
                  meta=replace(profile.meta, timing_source="replan"))  # fmt: skip
    return replace(new, predicted=_predict(new))


def _predict(profile: Profile) -> Predicted:
    """One steady-state iteration: copies serial on one stream in the runtime's issue order,
    each trap waits for all its transfers; cyclic copies are done when the iteration starts."""
    dev = profile.device
    n = len(profile.traps)
    schedule = sorted(profile.schedule, key=lambda t: (t.trap, t.block, t.offset))
    ready = [0.0] * len(schedule)
    own: list[list[int]] = [[] for _ in range(n)]
    for k, t in enumerate(schedule):
        own[t.trap].append(k)
    copy_free, now = 0.0, 0.0
    stalls = []
    for i, issued in enumerate(entry_issue_order(schedule, n)):
        for k in issued:
            t = schedule[k]
            copy_free = (
                max(now, copy_free) + t.bytes / dev.h2d_bytes_per_s * 1e3 + dev.h2d_latency_ms
            )
            if t.issue_at <= t.trap:
                ready[k] = copy_free
        start = max([now, *(ready[k] for k in own[i])])
        stalls.append(start - now)
        now = start + profile.traps[i].compute_ms
    p = profile.predicted
    compute = sum(t.compute_ms for t in profile.traps)
    return replace(p, compute_ms=compute, makespan_ms=now, stall_ms=sum(stalls),
                   trap_stall_ms=tuple(stalls))  # fmt: skip


def _finish(request: ReplanRequest, timings: list[tuple[int, int, int]]) -> None:
    from flextensor_runtime.deploy import handle

    dep = handle(request.model).deployment
    profile = dep.profile
    total_ns = [0] * len(profile.traps)
    for i, start, end in timings:
        total_ns[i] += end - start
    measured = [
        total_ns[i] / 1e6 / request.iters if trap.kind != "gap" or total_ns[i] else trap.compute_ms
        for i, trap in enumerate(profile.traps)
    ]
    new = rebuild_schedule(profile, measured)
    profile_format.check_profile(new)
    assert dep.runtime is not None and dep.tables is not None
    virtual = {i for i, t in enumerate(profile.traps)
               if t.kind == "gap" and t.name not in dep.binding.modules}  # fmt: skip
    tables = build_tables(new, virtual)
    dep.runtime.set_tables(tables)
    dep.profile, dep.tables = new, tables
    if request.save is not None:
        profile_format.save(new, request.save)
    request.profile = new


def replan(
    model: nn.Module, iters: int = 3, save: str | os.PathLike[str] | None = None
) -> ReplanRequest:
    """Measure per-trap times over the next `iters` forwards of the installed model (e.g. after
    torch.compile), then rebuild the schedule once and, with `save`, write the new profile.

    Returns a `ReplanRequest`; after the forwards, `request.profile` is the rebuilt profile.
    """
    from flextensor_runtime.deploy import handle

    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ConfigError(f"replan iters={iters!r} must be at least 1; pass iters=3 or more")
    if save is not None and (not isinstance(save, (str, os.PathLike)) or Path(save).is_dir()):
        raise ConfigError(
            f"replan save={save!r} is not a file path; pass the .msgpack file to write, e.g. "
            "save='p2.msgpack'"
        )
    runtime = handle(model).deployment.runtime
    assert runtime is not None
    if runtime.timing is not None:
        raise ConfigError("a replan is already measuring this model; drive its forwards first")
    request = ReplanRequest(model, iters, Path(save) if save is not None else None)
    last = max((i for i, t in enumerate(handle(model).profile.traps) if t.kind != "gap"), default=0)
    runtime.timing = []
    runtime.on_exit = _countdown(request, runtime, last)
    return request


def _countdown(request: ReplanRequest, runtime: Runtime, last: int) -> Callable[[int], None]:
    left = [request.iters]

    def on_exit(i: int) -> None:
        if i != last:
            return
        left[0] -= 1
        if left[0] == 0:
            timings, runtime.timing, runtime.on_exit = runtime.timing, None, None
            assert timings is not None
            _finish(request, timings)

    return on_exit
