"""A discrete-event model of one inference iteration under a plan, in steady state.

Owns: the timing semantics the runtime follows. One compute stream runs traps in order; one
copy engine runs copies first-in first-out. At the entry of trap `issue_at` (the moment the
previous trap finishes) the host issues the copies scheduled there, in trap order; a copy starts
when the engine is free. A trap starts once it has entered and its own copy has finished; the
wait is its stall. Copies scheduled at or after their own trap (cyclic prefetch) are issued in the
previous iteration, except those scheduled at their own trap (`issue_at == trap`: issued as the
trap is entered, same iteration; the trap waits for them); the first iteration issues the
cyclic ones at time 0. A trap may have several copies: it starts once all have finished.
Iterations repeat back to back and
the figures are those of the last of `ITERATIONS`, by when the pipeline is periodic.
Must not know: tensors, bytes, blocks (block reuse is already encoded in `issue_at`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ITERATIONS", "CopyJob", "Simulation", "simulate", "simulate_copies"]

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
    copy_jobs: tuple[int, ...] = ()  # per copy span: the index of its job in `jobs`


def simulate(compute_ms: tuple[float, ...], jobs: tuple[CopyJob, ...]) -> Simulation:
    """Run `ITERATIONS` iterations and report the last one (times relative to its start)."""
    return simulate_copies(compute_ms, [job.trap for job in jobs],
                           [job.issue_at for job in jobs], [job.copy_ms for job in jobs])  # fmt: skip


def simulate_copies(compute_ms: tuple[float, ...], traps: list[int], issue_at: list[int],
                    copy_ms: list[float]) -> Simulation:  # fmt: skip
    """`simulate` of the jobs (traps[k], issue_at[k], copy_ms[k])."""
    n = len(compute_ms)
    order = sorted(range(len(traps)), key=traps.__getitem__)
    engine_free = 0.0
    copy_end = [-math.inf] * ((ITERATIONS + 1) * n)  # per global trap: when its last copy ends
    for k in order:  # first iteration's cyclic prefetch
        if issue_at[k] > traps[k]:
            engine_free += copy_ms[k]
            copy_end[traps[k]] = engine_free
    at_entry = _at_entry(n, order, traps, issue_at, copy_ms)
    spans: list[tuple[float, float]] = []  # the last iteration's
    copies: list[tuple[int, int, float, float]] = []
    prev_end = origin = 0.0
    last = ITERATIONS - 1
    for r in range(ITERATIONS):
        # the copies the last iteration's traps read: next round's (issued in the round before
        # the last), then the last round's own
        kept = 1 if r == last - 1 else 0 if r == last else -1
        engine_free, prev_end = _round(compute_ms, at_entry, copy_end, r * n, engine_free,
                                       prev_end, kept, copies, spans if r == last else None)  # fmt: skip
        if r == last - 1:
            origin = prev_end
    return _last_iteration(compute_ms, spans, origin, copies)


_Entry = tuple[int, int, float, int, int]  # (job, its trap, its time, need, next round's: 0/1)


def _at_entry(n: int, order: list[int], traps: list[int], issue_at: list[int],
              copy_ms: list[float]) -> list[list[_Entry]]:  # fmt: skip
    """Per trap entry, the copies it issues, by trap from it on (`need`: the trap, + n when it
    is next round's)."""
    at_entry: list[list[_Entry]] = [[] for _ in range(n)]
    cyclic = [0] * n  # per entry: how many of its copies (the first, in trap order) wrap around
    for k in order:
        i, trap = issue_at[k], traps[k]
        if trap < i:
            at_entry[i].append((k, trap, copy_ms[k], trap + n, 1))
            cyclic[i] += 1
        else:
            at_entry[i].append((k, trap, copy_ms[k], trap, 0))
    for i, c in enumerate(cyclic):
        if c:  # from the entry's own trap on: the wrapped-around copies go last
            entries = at_entry[i]
            at_entry[i] = entries[c:] + entries[:c]
    return at_entry


def _round(compute_ms: tuple[float, ...], at_entry: list[list[_Entry]], copy_end: list[float],
           base: int, engine_free: float, prev_end: float, kept: int,
           copies: list[tuple[int, int, float, float]],
           spans: list[tuple[float, float]] | None) -> tuple[float, float]:  # fmt: skip
    """One iteration from global trap `base`: copies whose next-round flag is `kept` are
    recorded in `copies`, the traps' spans in `spans` (when given); (engine free, last end)."""
    for i, entries in enumerate(at_entry):
        entry = prev_end
        for k, trap, ms, need, nxt in entries:
            start = entry if entry > engine_free else engine_free
            engine_free = start + ms
            copy_end[base + need] = engine_free  # copies run in issue order: it ends last
            if nxt == kept:
                copies.append((k, trap, start, engine_free))
        ready = copy_end[base + i]  # -inf (no copy): the trap starts as it is entered
        start = entry if entry > ready else ready
        prev_end = start + compute_ms[i]
        if spans is not None:
            spans.append((start, prev_end))
    return engine_free, prev_end


def _last_iteration(
    compute_ms: tuple[float, ...],
    last: list[tuple[float, float]],
    origin: float,
    copies: list[tuple[int, int, float, float]],
) -> Simulation:
    entries = [origin] + [end for _, end in last[:-1]]
    waits = [s - e for (s, _), e in zip(last, entries, strict=True)]
    stalls = tuple([w if w > 0.0 else 0.0 for w in waits])  # `max(0.0, w)`
    rel_copies = tuple([(t, a - origin, b - origin) for _, t, a, b in copies])
    return Simulation(
        makespan_ms=last[-1][1] - origin,
        compute_ms=sum(compute_ms),
        stall_ms=sum(stalls),
        trap_stall_ms=stalls,
        trap_spans_ms=tuple([(s - origin, e - origin) for s, e in last]),
        copy_spans_ms=rel_copies,
        copy_busy_ms=sum([b - a for _, a, b in rel_copies]),
        copy_jobs=tuple([k for k, _, _, _ in copies]),
    )
