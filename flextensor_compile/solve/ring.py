"""The ring layout: every streamed tensor in one staging block, placed where bytes free up first.

Owns: placing a selection's streamed tensors (trap by trap, largest first) at byte offsets of a
single block of `ring_bytes`, each where the bytes it needs are released earliest (lowest offset
on ties; never over bytes its own trap holds), or beside the trap's tensors already placed when
those bytes are free no later than the trap's copy needs anyway, so the copy engine can fill the
next traps' tensors into whatever the running trap does not hold; the mirrored placement (traps
alternate between the ring's two ends, smallest tensors outermost); the stacked placement (every
trap from offset 0, as one block holds them: one copy a trap); turning a placement into
transfers (a trap's tensors that are adjacent and can be issued at the same trap entry form one
transfer); the issue point of each (the entry of the trap after the last reader of any
byte it overwrites, cyclically; the trap's own entry when that reader is the trap just before:
an on-entry copy); and `ring_need`, the staging a selection needs so the engine never idles
(in bytes, or in whole tensors: what the mirrored placement needs).
A two-block plan stages two transfers at once; the ring stages one transfer plus what the engine
copies while it is read.
Which placement last wrote each byte, and where bytes free up first, is `ring_paint`'s.
Must not know: time beyond one trap's compute (for `ring_need`), budgets, the profile format.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from flextensor_compile.solve.problem import ALIGN_BYTES, Problem
from flextensor_compile.solve.ring_paint import RingPaint

__all__ = ["RingPiece", "ring_layout", "ring_need"]


class RingPiece(NamedTuple):
    """One transfer of the ring: a run of one trap's adjacent tensors at `offset` (in address
    order). A named tuple: a layout makes one per transfer, and a solve makes many layouts."""

    trap: int
    offset: int
    bytes: int
    items: tuple[int, ...]
    issue_at: int


def _place(problem: Problem, selection: tuple[tuple[int, ...], ...], paint: RingPaint,
           base: int, first: int = 0) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """The placement of traps `first`.. from `paint`'s state: (trap, item, offset, slot
    bytes). Each tensor goes where its bytes free up first, so part of a trap's copy can run
    while the trap before it computes; a trap whose tensors do not fit one by one (the free
    bytes are too fragmented) goes as one run where its whole transfer frees up first."""
    out: list[tuple[int, int, int, int]] = []
    streaming = [o for o, ch in enumerate(selection) if ch]
    after = {o: streaming[(j + 1) % len(streaming)] for j, o in enumerate(streaming)}
    for order in range(first, len(selection)):
        chosen = selection[order]
        if not chosen:
            continue
        slots = problem.item_slot_bytes[order]
        now = base + order
        sizes = list(map(slots.__getitem__, chosen))
        # the last traps keep off the bytes the next iteration's next trap was given (its copy
        # would wait for this trap); within the iteration the next trap is placed after this one
        nxt = after[order]
        avoid = _merged([(a, a + n) for o, _, a, n in out if o == nxt]) if nxt <= order else ()
        split = _split(paint, order, chosen, sizes, now, avoid)
        if split is not None:
            out.extend(split)
            continue
        at, _ = paint.earliest(sum(sizes), now, avoid)
        if at < 0:
            return None
        for k, size in zip(chosen, sizes, strict=True):
            paint.write(at, at + size, now)
            out.append((order, k, at, size))
            at += size
    return out


def _merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """`ranges` as the fewest disjoint ranges covering the same bytes (a trap of many tensors
    placed side by side is one range to keep clear of, not one per tensor)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _split(paint: RingPaint, order: int, chosen: tuple[int, ...], sizes: list[int], now: int,
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
        _flush(paint, runs, now)  # no stretch has room: where its bytes free up first
        at, when = paint.earliest(size, now, avoid)
        if at < 0:
            paint.starts, paint.when = saved
            return None
        if when > needed:
            needed = when
        paint.write(at, at + size, now)
        _join(runs, at, at + size)
        for run in runs:  # what is free beside each stretch by `needed` (it may be later)
            run[2], run[3] = paint.free_beside(run[0], run[1], needed, now, avoid)
        out.append((order, chosen[ranked[i]], at, size))
        i += 1
    _flush(paint, runs, now)
    out.sort(key=itemgetter(2))  # address order
    return out


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


def _mirror(problem: Problem, selection: tuple[tuple[int, ...], ...], ring_bytes: int
            ) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """The mirrored placement: streaming traps alternate between the ring's two ends, each
    contiguous, its smallest tensors outermost. The outer tensors of a trap lie farthest from the
    trap before it, so the engine copies them while that trap computes, and the rest as soon as
    it has finished; the ring needs each trap's bytes plus the next trap's outer tensors that
    cover the copy engine during its compute (`ring_need` with the selection). None when a
    trap's tensors exceed the ring."""
    out: list[tuple[int, int, int, int]] = []
    top = False
    for order, chosen in enumerate(selection):
        if not chosen:
            continue
        slots = problem.item_slot_bytes[order]
        ranked = sorted(sorted(chosen), key=slots.__getitem__)  # by size, then index
        if sum([slots[k] for k in ranked]) > ring_bytes:
            return None
        if top:
            at, down = ring_bytes, []
            for k in ranked:
                at -= slots[k]
                down.append((order, k, at, slots[k]))
            down.sort(key=itemgetter(2))  # address order
            out.extend(down)
        else:
            at = 0
            for k in ranked:
                out.append((order, k, at, slots[k]))
                at += slots[k]
        top = not top
    return out  # by trap, then offset


def _stack(problem: Problem, selection: tuple[tuple[int, ...], ...], ring_bytes: int
           ) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """The stacked placement: every streaming trap's tensors from offset 0, in index order, as
    one block would hold them. Each trap's copy waits for the trap before it (fewest copies:
    where each copy costs a latency, fewer can beat copying ahead). None when a trap's tensors
    exceed the ring."""
    out: list[tuple[int, int, int, int]] = []
    for order, chosen in enumerate(selection):
        slots, at = problem.item_slot_bytes[order], 0
        for k in chosen:
            out.append((order, k, at, slots[k]))
            at += slots[k]
        if at > ring_bytes:
            return None
    return out  # by trap, then offset


def ring_layout(
    problem: Problem, selection: tuple[tuple[int, ...], ...], ring_bytes: int,
    mirrored: bool = False, stacked: bool = False,
) -> tuple[RingPiece, ...] | None:  # fmt: skip
    """The ring's transfers for `selection` in a block of `ring_bytes` (None: a trap's
    tensors do not fit in it), placed by release (default), mirrored (`_mirror`) or stacked
    (`_stack`). The placement by release is made for the steady state: the iteration's last
    traps (twice the ring's bytes) are placed into an empty ring first, and the kept pass starts
    from where they left it."""
    n = len(problem.traps)
    ring_bytes -= ring_bytes % ALIGN_BYTES
    if mirrored or stacked:
        placed = (_stack if stacked else _mirror)(problem, selection, ring_bytes)
        if placed is None:
            return None
        runs = _runs(placed)
        paint, shift = RingPaint(ring_bytes), 0  # the kept placement, repeated
        for order, a, b, _, _ in runs:
            paint.write(a, b, order)
    else:
        paint = RingPaint(ring_bytes)
        first, tail, slot_bytes = n, 0, problem.item_slot_bytes
        while first > 0 and tail < 2 * ring_bytes:
            first -= 1
            slots = slot_bytes[first]
            tail += sum([slots[k] for k in selection[first]])
        if _place(problem, selection, paint, 0, first) is None:
            return None
        placed = _place(problem, selection, paint, n)
        if placed is None:
            return None
        runs, shift = _runs(placed), n  # the kept pass painted each placed byte n + its trap
    pieces, items = _pieces(placed, runs, paint, n, shift)  # a piece's items are adjacent
    return tuple([RingPiece(o, a, end - a, tuple(items[lo:hi]), i)
                  for o, lo, hi, a, end, i in pieces])  # fmt: skip


def _pieces(placed: list[tuple[int, int, int, int]], runs: list[tuple[int, int, int, int, int]],
            cyclic: RingPaint, n: int, shift: int
            ) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """[trap, lo, hi, offset, end, issue_at] of each transfer (`placed[lo:hi]`), and the items
    of `placed`: a tensor is issued after the last writer of its bytes in steady state, and
    joins the transfer before it when that is its trap's, issued at the same point and adjacent.
    `cyclic` holds, on every placed byte, `shift` + the last trap whose tensors cover it (the
    previous iteration's last writer; what it holds elsewhere is never read); each trap done
    paints its runs `shift` + n + trap, so this iteration's writers rank above."""
    offsets = [x[2] for x in placed]
    pieces: list[list[int]] = []
    last: list[int] = [-1, 0, 0, 0, -1, -1]  # the last piece (trap, lo, hi, offset, end, issue)
    written = 0  # runs before this one are painted as done
    for r, (order, a, b, lo, hi) in enumerate(runs):
        for x, y, writer in _units(cyclic, offsets, a, b, lo, hi):
            issue = ((writer % n if writer >= 0 else order) + 1) % n  # after the last writer
            at, end = offsets[x], offsets[y] if y < hi else b
            if last[0] == order and last[5] == issue and last[4] == at:
                last[2], last[4] = y, end
            else:
                last = [order, x, y, at, end, issue]
                pieces.append(last)
        if r + 1 == len(runs) or runs[r + 1][0] != order:  # the trap is done: it writes
            for _, x, y, _, _ in runs[written : r + 1]:
                cyclic.write(x, y, shift + n + order)
            written = r + 1
    return pieces, [x[1] for x in placed]


def _units(cyclic: RingPaint, offsets: list[int], a: int, b: int, lo: int, hi: int
           ) -> list[tuple[int, int, int]]:  # fmt: skip
    """(x, y, latest writer) of each stretch `x:y` of the run [a, b) of adjacent tensors
    `lo:hi` (at `offsets`) whose tensors have the same latest writer in `cyclic`: the
    tensors inside one of its segments, and each tensor that reaches over a segment's end."""
    starts, when = cyclic.starts, cyclic.when
    count = len(starts)
    s = bisect_right(starts, a) - 1  # the segment holding tensor x's first byte
    units: list[tuple[int, int, int]] = []
    x = lo
    while s + 1 < count and starts[s + 1] < b:
        cut = starts[s + 1]
        y = bisect_left(offsets, cut, x, hi)  # tensors x:y start in segment s
        if y < hi and offsets[y] == cut:  # none reaches over the segment's end
            units.append((x, y, when[s]))
            x, s = y, s + 1
            continue
        if y - 1 > x:
            units.append((x, y - 1, when[s]))
        end = offsets[y] if y < hi else b  # tensor y - 1 reaches over `cut` to here
        j = bisect_left(starts, end, s + 1)
        units.append((y - 1, y, max(when[s:j])))
        if y == hi:
            return units
        x, s = y, bisect_right(starts, end, s) - 1
    units.append((x, hi, when[s]))
    return units


def _runs(placed: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int, int]]:
    """(trap, start, end, lo, hi) of each stretch of adjacent bytes one trap's tensors were
    given: `placed[lo:hi]`."""
    runs: list[tuple[int, int, int, int, int]] = []
    trap, start, end, lo = -1, 0, 0, 0  # the run being grown
    for j, (order, _, at, size) in enumerate(placed):
        if order == trap and at == end:
            end += size
            continue
        if trap >= 0:
            runs.append((trap, start, end, lo, j))
        trap, start, end, lo = order, at, at + size, j
    if trap >= 0:
        runs.append((trap, start, end, lo, len(placed)))
    return runs


def ring_need(problem: Problem, slot_bytes: tuple[int, ...],
              selection: tuple[tuple[int, ...], ...] | None = None) -> int:  # fmt: skip
    """Ring bytes that hold each streaming trap's transfer plus what the engine can copy of the
    next one while it is read (so copies never wait for a free byte while a trap computes); with
    `selection`, in whole tensors: the next trap's smallest tensors up to that amount."""
    streaming = [(o, s, w) for o, (s, w) in enumerate(zip(slot_bytes, problem.compute_bytes,
                 strict=True)) if s]  # fmt: skip
    if not streaming:
        return 0
    nexts = streaming[1:] + streaming[:1]  # cyclically, the first follows the last
    need = max([s + _ahead(problem, selection, o, x if x < w else w)
                for (_, s, w), (o, x, _) in zip(streaming, nexts, strict=True)])  # fmt: skip
    return -(-need // ALIGN_BYTES) * ALIGN_BYTES


def _ahead(problem: Problem, selection: tuple[tuple[int, ...], ...] | None, order: int,
           ahead: int) -> int:  # fmt: skip
    """What the engine copies of trap `order`'s transfer ahead of it: `ahead` bytes, or with
    `selection` its smallest tensors up to at least that."""
    if selection is None or not ahead:
        return ahead
    items = problem.traps[order].items
    run = 0
    for size in sorted(items[k].slot_bytes for k in selection[order]):
        run += size
        if run >= ahead:
            break
    return run
