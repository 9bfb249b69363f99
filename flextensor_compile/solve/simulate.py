"""A discrete-event model of one inference iteration under a plan, in steady state.

Owns: the timing semantics the runtime follows. One compute stream runs traps in order; one
copy engine runs copies first-in first-out. At the entry of trap `issue_at` (the moment the
previous trap finishes) the host issues the copies scheduled there, in trap order; a copy starts
when the engine is free. A trap starts once it has entered and its own copy has finished; the
wait is its stall. Copies scheduled at or after their own trap (cyclic prefetch) are issued in the
previous iteration; the first iteration issues them at time 0. Iterations repeat back to back and
the figures are those of the last of `ITERATIONS`, by when the pipeline is periodic.
Must not know: tensors, bytes, blocks (block reuse is already encoded in `issue_at`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

__all__ = ["ITERATIONS", "CopyJob", "Simulation", "simulate"]

ITERATIONS = 3


@dataclass(frozen=True)
class CopyJob:
    """The copy a trap needs: issued at the entry of trap `issue_at`, taking `copy_ms`."""

    trap: int
    issue_at: int
    copy_ms: float


@dataclass(frozen=True)
class Simulation:
    """One steady-state iteration: its length, the stalls, and both lanes for plotting."""

    makespan_ms: float
    compute_ms: float
    stall_ms: float
    trap_stall_ms: tuple[float, ...]
    trap_spans_ms: tuple[tuple[float, float], ...]  # (start, end) of each trap's compute
    copy_spans_ms: tuple[tuple[int, float, float], ...]  # (trap, start, end) of each copy
    copy_busy_ms: float


def simulate(compute_ms: tuple[float, ...], jobs: tuple[CopyJob, ...]) -> Simulation:
    """Run `ITERATIONS` iterations and report the last one (times relative to its start)."""
    n = len(compute_ms)
    issued_at: dict[int, list[CopyJob]] = defaultdict(list)
    for job in sorted(jobs, key=lambda j: j.trap):
        issued_at[job.issue_at].append(job)
    engine_free = 0.0
    copy_end: dict[int, float] = {}  # global trap index -> its copy's end
    spans: list[tuple[float, float]] = []
    copies: list[tuple[int, float, float]] = []
    prev_end = 0.0
    for job in sorted(jobs, key=lambda j: j.trap):  # first iteration's cyclic prefetch
        if job.issue_at >= job.trap:
            start = engine_free
            engine_free = start + job.copy_ms
            copy_end[job.trap] = engine_free
    for g in range(ITERATIONS * n):
        r, i = divmod(g, n)
        entry = prev_end
        for job in sorted(issued_at.get(i, ()), key=lambda j: (j.trap - i) % n):
            need = r * n + job.trap if job.trap > i else (r + 1) * n + job.trap
            start = max(entry, engine_free)
            engine_free = start + job.copy_ms
            copy_end[need] = engine_free
            if need // n == ITERATIONS - 1:
                copies.append((job.trap, start, engine_free))
        start = max(entry, copy_end.get(g, entry))
        prev_end = start + compute_ms[i]
        spans.append((start, prev_end))
    return _last_iteration(compute_ms, spans, copies)


def _last_iteration(
    compute_ms: tuple[float, ...],
    spans: list[tuple[float, float]],
    copies: list[tuple[int, float, float]],
) -> Simulation:
    n = len(compute_ms)
    last = spans[-n:]
    origin = spans[-n - 1][1] if len(spans) > n else 0.0
    entries = [origin] + [end for _, end in last[:-1]]
    stalls = tuple(max(0.0, s - e) for (s, _), e in zip(last, entries, strict=True))
    rel_copies = tuple((t, a - origin, b - origin) for t, a, b in copies)
    return Simulation(
        makespan_ms=last[-1][1] - origin,
        compute_ms=sum(compute_ms),
        stall_ms=sum(stalls),
        trap_stall_ms=stalls,
        trap_spans_ms=tuple((s - origin, e - origin) for s, e in last),
        copy_spans_ms=rel_copies,
        copy_busy_ms=sum(b - a for _, a, b in rel_copies),
    )
