"""The ring layout: every streamed tensor in one staging block, placed where bytes free up first.

Owns: placing a selection's streamed tensors (trap by trap, largest first) at byte offsets of a
single block of `ring_bytes`, each where the bytes it needs are released earliest (lowest offset
on ties; never over bytes its own trap holds), or beside the trap's tensors already placed when
those bytes are free no later than the trap's copy needs anyway, so the copy engine can fill the
next traps' tensors into whatever the running trap does not hold; the mirrored placement (traps
alternate between the ring's two ends, smallest tensors outermost); turning a placement into
transfers (a trap's tensors that are adjacent and can be issued at the same trap entry form one
transfer); the issue point of each (the entry of the trap after the last reader of any
byte it overwrites, cyclically; the trap's own entry when that reader is the trap just before:
an on-entry copy); and `ring_need`, the staging a selection needs so the engine never idles
(in bytes, or in whole tensors: what the mirrored placement needs).
A two-block plan stages two transfers at once; the ring stages one transfer plus what the engine
copies while it is read.
Must not know: time beyond one trap's compute (for `ring_need`), budgets, the profile format.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import NamedTuple

from flextensor_compile.solve.problem import ALIGN_BYTES, Problem

__all__ = ["RingPiece", "ring_layout", "ring_need"]

_OWN = 1 << 62  # "held by the trap being placed": never overwritten by its own tensors
_AVOID = _OWN - 1  # bytes the next trap (next iteration) reads: only if nothing else fits


class RingPiece(NamedTuple):
    """One transfer of the ring: a run of one trap's adjacent tensors at `offset` (in address
    order). A named tuple: a layout makes one per transfer, and a solve makes many layouts."""

    trap: int
    offset: int
    bytes: int
    items: tuple[int, ...]
    issue_at: int


class _Paint:
    """Which placement last wrote each byte of the ring: sorted, disjoint segments covering it
    (each ends where the next starts, the last at `ring`)."""

    def __init__(self, ring_bytes: int) -> None:
        self.ring = ring_bytes
        self.starts = [0]
        self.when = [-1]  # global placement time of the writer's trap (-1: never written)

    def earliest(
        self, size: int, own: int, avoid: tuple[tuple[int, int], ...] = ()
    ) -> tuple[int, int]:
        """(offset, availability) of the `size`-byte range whose latest writer is oldest, never
        one `own` (the latest time painted: the trap being placed) wrote; a range overlapping
        `avoid` only when no other fits."""
        best_at, best_time = -1, _OWN
        starts, when, ring = self.starts, self.when, self.ring
        for i, a in enumerate(starts):
            end = a + size
            if end > ring:
                break
            latest = when[i]
            if latest >= best_time:  # its latest writer is no older: not better
                continue
            j = bisect_left(starts, end, i + 1)
            if j > i + 1:
                latest = max(when[i:j])
            if latest == own:  # `own` is the latest time painted: it counts as `_OWN`
                continue
            if latest < best_time and any(a < y and x < end for x, y in avoid):
                latest = _AVOID
            if latest < best_time:
                best_at, best_time = a, latest
        return best_at, best_time

    def latest(self, a: int, b: int, own: int = -2) -> int:
        """The latest writer of [a, b) (`_OWN` where it is `own`)."""
        starts = self.starts
        i = bisect_right(starts, a) - 1
        writers = self.when[i : bisect_left(starts, b, i + 1)]
        return _OWN if own in writers else max(writers)

    def write(self, a: int, b: int, when: int) -> None:
        """Paint [a, b) as written at `when`; neighbours painted at the same time merge (a
        window starting inside such a run is never better than one starting at its start)."""
        starts, whens = self.starts, self.when
        i = bisect_right(starts, a) - 1
        j = bisect_left(starts, b, i)  # the first segment starting at or after b
        count = len(starts)
        if j == i + 1 and self._within(i, a, b, when):
            return
        new_s, new_w = [a], [when]
        if starts[i] < a:
            new_s, new_w = [starts[i], a], [whens[i], when]
        if (starts[j] if j < count else self.ring) > b:  # the last segment goes on after b
            new_s.append(b)
            new_w.append(whens[j - 1])
        if i > 0 and new_w[0] == whens[i - 1]:  # merge with the run before
            i -= 1
            new_s[0] = starts[i]
        if j < count and new_w[-1] == whens[j]:  # and with the run after
            j += 1
        starts[i:j], whens[i:j] = new_s, new_w

    def _within(self, i: int, a: int, b: int, when: int) -> bool:
        """`write` of [a, b) inside segment i, in the two common cases, with no list made:
        from its start (after a run of `when`, which grows), or up to its end; False (nothing
        done) otherwise."""
        starts, whens = self.starts, self.when
        j = i + 1
        end = starts[j] if j < len(starts) else self.ring
        kept = whens[i]
        if i > 0 and whens[i - 1] == (when if starts[i] == a else kept):
            if starts[i] == a and end > b and (j == len(starts) or whens[j] != kept):
                starts[i] = b  # the run of `when` before grows over [a, b)
                return True
            return False
        if starts[i] == a:
            if end > b and (j == len(starts) or whens[j] != kept):
                whens[i] = when
                starts.insert(j, b)
                whens.insert(j, kept)
                return True
            return False
        if end == b:
            if j < len(starts) and whens[j] == when:
                starts[j] = a  # the run of `when` after grows over [a, b)
            else:
                starts.insert(j, a)
                whens.insert(j, when)
            return True
        return False


def _place(problem: Problem, selection: tuple[tuple[int, ...], ...], paint: _Paint,
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
        sizes = [slots[k] for k in chosen]
        # the last traps keep off the bytes the next iteration's next trap was given (its copy
        # would wait for this trap); within the iteration the next trap is placed after this one
        nxt = after[order]
        avoid = tuple((a, a + n) for o, _, a, n in out if o == nxt) if nxt <= order else ()
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


def _split(paint: _Paint, order: int, chosen: tuple[int, ...], sizes: list[int], now: int,
           avoid: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int, int]] | None:  # fmt: skip
    """Trap `order`'s tensors (trap, item, offset, slot bytes), largest first, each where its
    bytes free up first, or next to the trap's tensors already placed when that frees up no
    later than the trap's copy needs anyway (fewer, larger copies); in address order. None
    (state unchanged) when the free bytes are too fragmented."""
    if len(chosen) == 1:  # one tensor: where its bytes free up first
        size = sizes[0]
        at, _ = paint.earliest(size, now, avoid)
        if at < 0:
            return None
        paint.write(at, at + size, now)
        return [(order, chosen[0], at, size)]
    saved = (list(paint.starts), list(paint.when))
    out: list[tuple[int, int, int, int]] = []
    runs: list[list[int]] = []  # [start, end] of the trap's placed bytes
    needed = -1  # the latest availability among the trap's tensors placed so far
    for j in sorted(range(len(chosen)), key=sizes.__getitem__, reverse=True):  # stable
        size = sizes[j]
        at = _beside(paint, runs, size, now, needed, avoid) if runs else -1
        if at < 0:
            at, when = paint.earliest(size, now, avoid)
            if at < 0:
                paint.starts, paint.when = saved
                return None
            if when > needed:
                needed = when
        end = at + size
        paint.write(at, end, now)
        out.append((order, chosen[j], at, size))
        for run in runs:  # extend the run it touches, else start one
            if run[1] == at or run[0] == end:
                if at < run[0]:
                    run[0] = at
                if end > run[1]:
                    run[1] = end
                break
        else:
            runs.append([at, end])
    out.sort(key=itemgetter(2))  # address order
    return out


def _beside(paint: _Paint, runs: list[list[int]], size: int, now: int, needed: int,
            avoid: tuple[tuple[int, int], ...]) -> int:  # fmt: skip
    """An offset right after or before the trap's placed bytes that is free by `needed`
    (-1: none)."""
    ring, starts, when = paint.ring, paint.starts, paint.when
    for a, b in runs:
        for at in (b, a - size):
            end = at + size
            if at < 0 or end > ring or (avoid and any(at < y and x < end for x, y in avoid)):
                continue
            i = bisect_right(starts, at) - 1
            latest = when[i]
            j = bisect_left(starts, end, i + 1)
            if j > i + 1:
                latest = max(when[i:j])
            if latest <= needed and latest != now:  # `now`, the latest time painted, is own
                return at
    return -1


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


def ring_layout(
    problem: Problem, selection: tuple[tuple[int, ...], ...], ring_bytes: int,
    mirrored: bool = False,
) -> tuple[RingPiece, ...] | None:  # fmt: skip
    """The ring's transfers for `selection` in a block of `ring_bytes` (None: a trap's
    tensors do not fit in it), placed by release (default) or mirrored (`_mirror`). The
    placement by release is made for the steady state: the iteration's last traps (twice the
    ring's bytes) are placed into an empty ring first, and the kept pass starts from where they
    left it."""
    n = len(problem.traps)
    ring_bytes -= ring_bytes % ALIGN_BYTES
    if mirrored:
        placed = _mirror(problem, selection, ring_bytes)
        if placed is None:
            return None
        runs = _runs(placed)
        paint, shift = _Paint(ring_bytes), 0  # the kept placement, repeated
        for order, a, b, _, _ in runs:
            paint.write(a, b, order)
    else:
        paint = _Paint(ring_bytes)
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
    pieces, ends = _pieces(placed, runs, paint, n, shift)  # a piece's items are adjacent
    return tuple([RingPiece(o, a, end - a, tuple(ks), i)
                  for (o, a, ks, i), end in zip(pieces, ends, strict=True)])  # fmt: skip


def _pieces(placed: list[tuple[int, int, int, int]], runs: list[tuple[int, int, int, int, int]],
            cyclic: _Paint, n: int, shift: int
            ) -> tuple[list[tuple[int, int, list[int], int]], list[int]]:  # fmt: skip
    """(trap, offset, items, issue_at) of each transfer, and its end: a tensor is issued after the last
    writer of its bytes in steady state, and joins the transfer before it when that is its
    trap's, issued at the same point and adjacent (a run inside one written stretch: at once).
    `cyclic` holds, on every placed byte, `shift` + the last trap whose tensors cover it (the
    previous iteration's last writer; what it holds elsewhere is never read); each trap done
    paints its runs `shift` + n + trap, so this iteration's writers rank above."""
    starts, when = cyclic.starts, cyclic.when  # `write` updates them in place
    pieces: list[tuple[int, int, list[int], int]] = []
    ends: list[int] = []
    last_trap = last_issue = last_end = -1  # the last piece's trap, issue point and end
    written = 0  # runs before this one are painted as done
    for r, (order, a, b, lo, hi) in enumerate(runs):
        i = bisect_right(starts, a) - 1
        if i + 1 == len(starts) or starts[i + 1] >= b:  # one last writer for the whole run
            units = [(a, [x[1] for x in placed[lo:hi]], b, when[i])]
        else:  # per tensor: (offset, [item], end, latest writer of its bytes)
            units = [(at, [k], at + size, max(when[bisect_right(starts, at) - 1 :
                                                   bisect_left(starts, at + size)]))
                     for _, k, at, size in placed[lo:hi]]  # fmt: skip
        for at, items, end, writer in units:
            issue = ((writer % n if writer >= 0 else order) + 1) % n  # after the last writer
            if last_trap == order and last_issue == issue and last_end == at:
                pieces[-1][2].extend(items)
                ends[-1] = end
            else:
                pieces.append((order, at, items, issue))
                ends.append(end)
                last_trap, last_issue = order, issue
            last_end = end
        if r + 1 == len(runs) or runs[r + 1][0] != order:  # the trap is done: it writes
            for _, x, y, _, _ in runs[written : r + 1]:
                cyclic.write(x, y, shift + n + order)
            written = r + 1
    return pieces, ends


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
