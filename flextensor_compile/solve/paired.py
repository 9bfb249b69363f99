"""Paired caps: one byte cap per staging block, chosen jointly (the copy-bound case).

Owns: splitting the traps that can stream into two alternating classes (the two blocks a
two-block round robin gives them), and the search for the pair of caps (one per class) whose
exact picks need the fewest streamed bytes while streamed - blocks covers what the budget
requires. With two blocks the staging bytes are the two largest transfers, one per class, so a
uniform cap pays twice the larger class's transfer; paired caps let one class stream little
(small block) while the other streams a lot. The estimate assumes strict alternation; the
planner checks every pick with the real assignment.
Must not know: schedules, simulation, budgets beyond the byte requirement it is given.
"""

from __future__ import annotations

from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.solve.subset import SubsetTable, union_of_sums

__all__ = ["CAP_POINTS", "classes_of", "paired_caps"]

CAP_POINTS = 64  # candidate caps per class (distinct achievable sums, thinned evenly)


def classes_of(streamable: tuple[int, ...]) -> tuple[int, ...]:
    """Per trap: 0 or 1 by parity among the traps that can stream (-1: it does not). With an
    odd count the trap with the fewest streamable bytes sits out, so the classes also alternate
    across the iteration boundary."""
    able = [o for o, s in enumerate(streamable) if s]
    if len(able) % 2:
        able.remove(min(able, key=lambda o: (streamable[o], o)))
    out = [-1] * len(streamable)
    for k, o in enumerate(able):
        out[o] = k % 2
    return tuple(out)


def _candidates(tables: list[SubsetTable]) -> list[int]:
    sums = union_of_sums(tables)
    if len(sums) <= CAP_POINTS:
        return sums
    step = (len(sums) - 1) / (CAP_POINTS - 1)
    return sorted({sums[round(k * step)] for k in range(CAP_POINTS)})


def _profile(
    tables: list[SubsetTable], before_ms: list[float], caps: list[int], bw: BandwidthModel
) -> list[tuple[int, int, float]]:
    """Per cap: (total streamed, largest transfer, extra ms) of the class's exact picks. Extra:
    the copies' time beyond the link's full rate (latency, the small-copy curve), plus the copy
    engine's idle time: a copy is issued when the trap before its trap starts (its block's
    previous reader is done), so the engine idles while that trap computes longer than the
    copy takes."""
    out = []
    copy_ms: dict[int, float] = {}  # tables repeat: each distinct sum's copy time once
    distinct = list({id(t): t for t in tables}.values())  # identical traps share a table
    index = {id(t): k for k, t in enumerate(distinct)}
    which = [index[id(t)] for t in tables]
    for cap in caps:
        each = [t.within(cap) for t in distinct]
        picked = [each[k] for k in which]
        for s in picked:
            if s not in copy_ms:
                copy_ms[s] = bw.copy_ms(s)
        copy = [copy_ms[s] for s in picked]
        idle = sum([ms - c if ms > c else 0.0 for c, ms in zip(copy, before_ms, strict=True)])
        slow = sum(copy) - sum(picked) / bw.tail_bytes_per_ms  # latency, small-copy curve
        out.append((sum(picked), max(picked, default=0), idle + slow))
    return out


def paired_caps(
    tables: tuple[SubsetTable, ...],
    classes: tuple[int, ...],
    compute_ms: tuple[float, ...],
    bw: BandwidthModel,
    need_bytes: int,
) -> tuple[int, int] | None:
    """(cap of class 0, cap of class 1) with the least estimated copy time (`need_bytes` plus
    both blocks at the link's rate, plus the idle estimate) whose picks can stream at least
    `need_bytes` plus the two largest transfers; None when no pair does."""
    groups: list[list[SubsetTable]] = [[], []]
    before: list[list[float]] = [[], []]
    for order, (table, c) in enumerate(zip(tables, classes, strict=True)):
        if c >= 0:
            groups[c].append(table)
            before[c].append(compute_ms[order - 1])
    if not groups[0] or not groups[1]:
        return None
    caps = [_candidates(g) for g in groups]
    prof = [_profile(g, b, c, bw) for g, b, c in zip(groups, before, caps, strict=True)]
    best: tuple[float, int, int] | None = None
    rate = bw.tail_bytes_per_ms
    ones = [(s1 - b1, b1, idle1, cap1) for (s1, b1, idle1), cap1 in zip(prof[1], caps[1],
                                                                          strict=True)]  # fmt: skip
    for (s0, b0, idle0), cap0 in zip(prof[0], caps[0], strict=True):
        short, need_b0 = need_bytes - (s0 - b0), need_bytes + b0
        for spare1, b1, idle1, cap1 in ones:
            if spare1 < short:  # s0 - b0 + s1 - b1 < need_bytes
                continue
            # the plan streams about need + both blocks (the fit returns the excess)
            score = (need_b0 + b1) / rate + idle0 + idle1
            if best is None or score < best[0]:
                best = (score, cap0, cap1)
    return None if best is None else (best[1], best[2])
