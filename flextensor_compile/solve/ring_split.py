"""One trap's tensors in the ring: each beside the trap's bytes already placed, or where its
bytes free up first.

Owns: the order a trap's tensors are placed in (largest first), the stretches of bytes it holds
and what is free beside each (no later than its copy needs anyway), growing a stretch by one
tensor or by a run of equal ones, and painting what the stretches grew by.
Must not know: the other traps' order, transfers, time, the problem (offsets and the paint's
placement counters only).
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter

from flextensor_compile.solve.ring_paint import RingPaint

__all__ = ["split_trap"]


def split_trap(paint: RingPaint, order: int, chosen: tuple[int, ...], sizes: list[int], now: int,
           avoid: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """Trap `order`'s tensors (trap, item, offset, slot bytes), largest first, each where its
    bytes free up first, or next to the trap's tensors already placed when that frees up no
    later than the trap's copy needs anyway (fewer, larger copies); in address order. None
    (state unchanged) when the free bytes are too fragmented. Tensors placed beside are
    painted before the next is placed where its bytes free up first, or when the trap is done
    (the paint's segments are maximal, so that paints the same)."""
    if len(chosen) == 1:  # one tensor: where its bytes free up first
        size = sizes[0]
        at, _ = paint.earliest(size, now, avoid)
        if at < 0:
            return None
        paint.write(at, at + size, now)
        return [(order, chosen[0], at, size)]
    saved = (list(paint.starts), list(paint.when))
    out: list[tuple[int, int, int, int]] = []
    runs: list[list[int]] = []  # the trap's placed bytes and what is free beside: `_beside`
    needed = -1  # the latest availability among the trap's tensors placed so far
    ranked = sorted(range(len(chosen)), key=sizes.__getitem__, reverse=True)  # stable
    i = same = 0
    while i < len(ranked):
        size = sizes[ranked[i]]
        if i == same:  # ranked[i:same]: the tensors of this size left (placed beside at once)
            same = i + 1
            while same < len(ranked) and sizes[ranked[same]] == size:
                same += 1
        if same - i == 1:  # one tensor of this size (the common case)
            at = _beside(runs, size)
            if at >= 0:
                out.append((order, chosen[ranked[i]], at, size))
                i += 1
                continue
        else:
            ats = _beside_many(runs, size, same - i)
            if ats:
                items = map(chosen.__getitem__, ranked[i : i + len(ats)])
                out.extend(zip(repeat(order), items, ats, repeat(size)))
                i += len(ats)
            if i == same:
                continue
        at, needed = _where_free_first(paint, runs, size, now, avoid, needed)
        if at < 0:
            paint.starts, paint.when = saved
            return None
        out.append((order, chosen[ranked[i]], at, size))
        i += 1
    _flush(paint, runs, now)
    out.sort(key=itemgetter(2))  # address order
    return out


def _where_free_first(paint: RingPaint, runs: list[list[int]], size: int, now: int,
                      avoid: tuple[tuple[int, int], ...], needed: int) -> tuple[int, int]:  # fmt: skip
    """Place a tensor no stretch has room beside where its bytes free up first (painted, a
    stretch of its own or grown into one): (its offset, or -1 when none fits; the latest
    availability among the trap's tensors), every stretch's free bytes updated to it."""
    _flush(paint, runs, now)
    at, when = paint.earliest(size, now, avoid)
    if at < 0:
        return -1, needed
    if when > needed:
        needed = when
    paint.write(at, at + size, now)
    _join(runs, at, at + size)
    for run in runs:  # what is free beside each stretch by `needed` (it may be later)
        run[2], run[3] = paint.free_beside(run[0], run[1], needed, now, avoid)
    return at, needed


def _beside(runs: list[list[int]], size: int) -> int:
    """The offset of a `size`-byte tensor placed right after or before a stretch of the trap's
    placed bytes (the first stretch with room; after before before), that stretch grown over
    it (-1: none has room). `runs` holds [start, end, low, high, painted start, painted end]
    of each stretch: [low, start) and [end, high) are free no later than the trap's copy
    needs anyway, and [painted start, painted end) is painted yet. A stretch the tensor
    touches that comes first would have had room, so the one grown is the first it touches;
    the free bytes beside the others end where it begins."""
    for run in runs:
        at = run[1]
        if at + size <= run[3]:
            run[1] = end = at + size
            break
        end = run[0]
        if end - size >= run[2]:
            run[0] = at = end - size
            break
    else:
        return -1
    if len(runs) > 1:
        _shrink_others(runs, run, at, end)
    return at


def _shrink_others(runs: list[list[int]], run: list[int], at: int, end: int) -> None:
    """The other stretches' free bytes end where `run`'s new bytes [at, end) begin."""
    for other in runs:
        if other is not run:
            if other[1] <= at < other[3]:
                other[3] = at
            elif other[2] < end <= other[0]:
                other[2] = end


def _beside_many(runs: list[list[int]], size: int, count: int) -> list[int]:
    """The offsets of up to `count` tensors of `size` bytes placed one after another as
    `_beside` places each (the same offsets and the same `runs` after), up to the first that
    no stretch has room for: the stretch `_beside` grows keeps taking them while it has room
    (the stretches before it had none, and room only shrinks), so runs of equal tensors
    (experts) are placed a stretch at a time."""
    if size <= 0:
        at = _beside(runs, size)
        return [at] if at >= 0 else []
    offsets: list[int] = []
    for run in runs:
        while len(offsets) < count:
            if run[1] + size <= run[3]:  # after it first
                n = min(count - len(offsets), (run[3] - run[1]) // size)
                ats = range(run[1], run[1] + n * size, size)
                run[1] += n * size
            elif run[0] - size >= run[2]:
                n = min(count - len(offsets), (run[0] - run[2]) // size)
                ats = range(run[0] - size, run[0] - (n + 1) * size, -size)
                run[0] -= n * size
            else:
                break
            if len(runs) > 1:
                for at in ats:  # what `_beside` does to the other stretches, placement by placement
                    _shrink_others(runs, run, at, at + size)
            offsets.extend(ats)
        if len(offsets) == count:
            break
    return offsets


def _join(runs: list[list[int]], at: int, end: int) -> None:
    """Add the painted bytes [at, end) to `runs` (as `_beside` has them): the first stretch
    they touch grows, else a new one starts."""
    for run in runs:
        if run[1] == at or run[0] == end:
            if at < run[0]:
                run[0] = run[4] = at
            if end > run[1]:
                run[1] = run[5] = end
            return
    runs.append([at, end, at, end, at, end])


def _flush(paint: RingPaint, runs: list[list[int]], now: int) -> None:
    """Paint what the stretches in `runs` grew by since they were last painted."""
    for run in runs:
        if run[0] < run[4]:
            paint.write(run[0], run[4], now)
            run[4] = run[0]
        if run[5] < run[1]:
            paint.write(run[5], run[1], now)
            run[5] = run[1]
