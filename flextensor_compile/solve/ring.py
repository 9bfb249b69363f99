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
Which placement last wrote each byte, and where bytes free up first, is `ring_paint`'s; how one
trap's tensors are split over the free bytes, `ring_split`'s.
Must not know: time beyond one trap's compute (for `ring_need`), budgets, the profile format.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import NamedTuple

from flextensor_compile.solve.problem import ALIGN_BYTES, Problem
from flextensor_compile.solve.ring_paint import RingPaint
from flextensor_compile.solve.ring_split import split_trap

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
        split = split_trap(paint, order, chosen, sizes, now, avoid)
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
