"""Covering the budget's deficit with few, large transfers: selections for copy-bound plans.

Owns: for a largest transfer of m slot bytes and the staging a layout needs (one or two blocks
of m, or the ring's m plus headroom), the selections that stream at least the deficit
(total + reserve - budget) plus that staging: each trap's largest subset within m, largest
first (the spread order breaks ties, so the streaming traps are spread over the iteration),
then either smaller subsets of other traps until the need is met (least streamed bytes) or
one trap's smallest subset that covers the rest (fewest copies); and the sizes of m tried,
around the one the staging bound values least (`staging_trap_bytes`).
When copies dominate, a plan's makespan is about its streamed bytes at the copy rate plus a
cost per copy, so these are the selections worth simulating beside the cap families.
Must not know: blocks, schedules, simulation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flextensor_compile.solve.bound import staging_trap_bytes
from flextensor_compile.solve.plan import Selection

if TYPE_CHECKING:  # the Context caches `cover_sizes` per solve
    from flextensor_compile.solve.families import Context

__all__ = ["COVER_FACTORS", "cover_selections", "cover_sizes"]

COVER_FACTORS = (1.0, 1.5, 2.0, 3.0)  # m tried: these x the staging bound's, rounded down

_Piece = tuple[int, int, int]  # (slot bytes, trap order, the subset's key in its table: its sum)


def cover_sizes(ctx: Context) -> tuple[int, ...]:
    """Distinct m: for each factor, the largest achievable trap transfer within factor x the
    staging bound's m (its alignment padding included). Once per solve: `Context.cover_sizes`."""
    base = staging_trap_bytes(ctx.problem)
    if not base:
        return ()
    pad = max((t.streamable_slot_bytes - sum(it.bytes for it in t.items)
               for t in ctx.problem.traps), default=0)  # fmt: skip
    sizes = {(ctx.largest_within(int(f * base) + pad) or ((0, 0, 0),))[0][0] for f in COVER_FACTORS}
    return tuple(sorted(s for s in sizes if s > 0))


def cover_selections(ctx: Context, m: int, staging_bytes: int) -> tuple[Selection, ...]:
    """Selections streaming at least deficit + `staging_bytes` (counted bytes) in transfers of
    at most `m` slot bytes, caps largest first: finished (one trap's smallest sufficient subset)
    at the first cap that overshoots, and filled (the smaller caps that still fit, then
    finished); () when not even every trap's cap covers the need."""
    p = ctx.problem
    assert p.budget_bytes is not None
    left = p.total_bytes + p.reserve_bytes - p.budget_bytes + staging_bytes
    caps = ctx.largest_within(m)
    chosen: dict[int, int] = {}
    out: list[Selection | None] = []
    for _, o, k in caps:
        counted = ctx.counted_bytes(o, k)
        if counted > left and not out:  # the first that overshoots: finish here
            out.append(_finished(ctx, caps, chosen, left, m))
        if counted <= left:
            chosen[o] = k
            left -= counted
            if left <= 0:
                break
    out.append(_finished(ctx, caps, chosen, left, m))  # the fill, finished when it fell short
    return tuple(dict.fromkeys(sel for sel in out if sel is not None))


def _finished(
    ctx: Context, caps: tuple[_Piece, ...], chosen: dict[int, int], left: int, m: int
) -> Selection | None:
    """`chosen` plus, while `left` counted bytes are still missing, the unchosen trap whose
    smallest subset of at least that many (within m) is smallest; None when no trap has one."""
    if left <= 0:
        return _selection(ctx, chosen)
    best: tuple[int, int, int] | None = None
    found: dict[int, int | None] = {}  # per trap kind (same table and counted bytes): its sum
    for _, o, _k in caps:
        if o in chosen:
            continue
        kind = ctx.kind[o]
        if kind not in found:
            found[kind] = _least_covering(ctx, o, left, m)
        k = found[kind]
        if k is not None and k <= m and (best is None or k < best[0]):
            best = (k, o, k)
    return None if best is None else _selection(ctx, {**chosen, best[1]: best[2]})


def _least_covering(ctx: Context, o: int, left: int, m: int) -> int | None:
    """Sum of trap `o`'s smallest subset (by slot sum) whose counted bytes reach `left`, or
    the first past `m` slot bytes, or None when none."""
    table = ctx.tables[o]
    k: int | None = table.at_least(left)
    while k is not None and k <= m and ctx.counted_bytes(o, k) < left:
        k = table.after(k)  # alignment padding: the slot sum reached `left`, the counted bytes not
    return k


def _selection(ctx: Context, chosen: dict[int, int]) -> Selection:
    return tuple(
        [ctx.tables[o].subset_of(chosen[o]) if o in chosen else () for o in range(len(ctx.tables))]
    )
