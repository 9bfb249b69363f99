"""Fitting a cap family to the memory budget: the least streaming whose plan fits.

Owns: bisection over a monotone cap level (a larger level streams more, so resident bytes fall
faster than block bytes grow), then a second bisection that mixes the last level that did not
fit with the first that did, trap by trap in a spread-out order (so the streamed bytes exceed
what the budget needs by at most about one trap's tensors); and the smallest feasible budget
reported by `BudgetError`, with the error itself (`budget_error`: what to raise or lower).
Must not know: which family it is fitting, simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter

from flextensor_compile.solve.assign import assign_blocks
from flextensor_compile.solve.families import Context
from flextensor_compile.solve.plan import RING, Pick, Selection, pick_memory, pick_of
from flextensor_compile.solve.problem import Problem
from flextensor_runtime.errors import BudgetError

__all__ = ["BISECT_STEPS", "LEAST_TOLERANCE", "budget_error", "fit_level", "least_budget",
           "least_peak_guess", "peak_of"]  # fmt: skip

BISECT_STEPS = 8
_PROBES = 6  # levels tried below a top level that cannot be scheduled (down to hi / 4096)


def peak_of(ctx: Context, pick: Pick, num_blocks: int, order: str) -> int | None:
    """`pick_memory`, kept per solve: the peak depends on the streamed bytes and, through the
    blocks, on the per-trap transfer sizes only."""
    key = (pick.slot_bytes, num_blocks, order)  # memory = this - streamed bytes
    cached = ctx.memory_cache.get(key, -1)
    if cached == -1:
        mem = pick_memory(ctx.problem, pick, num_blocks, order)
        cached = ctx.memory_cache[key] = None if mem is None else mem + pick.streamed_bytes
    return None if cached is None else cached - pick.streamed_bytes


def fit_level(
    ctx: Context,
    select: Callable[[float], Pick],
    hi: float,
    num_blocks: int,
    order: str,
    headroom: int = 0,
) -> Pick | None:
    """The pick at about the smallest level in [0, hi] whose peak fits the budget less
    `headroom` bytes, or None."""
    problem = ctx.problem
    assert problem.budget_bytes is not None
    budget = problem.budget_bytes - headroom

    def fits(pick: Pick) -> bool:
        mem = peak_of(ctx, pick, num_blocks, order)
        return mem is not None and mem <= budget

    low = select(0.0)
    if fits(low):
        return low
    best = select(hi)
    if not fits(best):
        if peak_of(ctx, best, num_blocks, order) is not None:
            return None  # the most streaming still peaks over the budget
        found = _schedulable(ctx, select, hi, low, best, fits)
        if found is None:
            return None
        hi, best = found
    lo = 0.0
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        pick = select(mid)
        if fits(pick):
            hi, best = mid, pick
        else:
            lo, low = mid, pick
    orders = (
        [ctx.spread] if order == RING else [ctx.spread, _by_block(ctx, best, num_blocks, order)]
    )
    mixed = min((_mix(ctx, low, best, fits, o) for o in orders), key=lambda p: p.streamed_bytes)
    mem = peak_of(ctx, mixed, num_blocks, order)  # `mixed` fitted: a cache hit
    assert mem is not None
    trimmed = _trim(ctx, mixed, budget - mem)
    return trimmed if trimmed is not mixed and fits(trimmed) else mixed


def _schedulable(
    ctx: Context,
    select: Callable[[float], Pick],
    hi: float,
    low: Pick,
    top: Pick,
    fits: Callable[[Pick], bool],
) -> tuple[float, Pick] | None:
    """A level and a pick that fits, when the top level's pick cannot be scheduled (with few
    blocks, every trap streaming leaves a block reused by adjacent traps: e.g. two blocks and an
    odd number of traps). Tries `hi` / 4, / 16, ... (`_PROBES` levels), then the top pick with
    one, two, ... (`_PROBES`) traps in spread order taking the lowest level's choice instead."""
    level = hi
    for _ in range(_PROBES):
        level /= 4
        pick = select(level)
        if fits(pick):
            return level, pick
    n = len(low.slot_bytes)
    for count in range(n - 1, max(0, n - 1 - _PROBES), -1):
        pick = ctx.mix(low, top, count, ctx.spread[::-1])
        if fits(pick):
            return hi, pick
    return None


def _trim(ctx: Context, pick: Pick, slack: int) -> Pick:
    """Return streamed tensors to residency while the budget's slack pays for them, largest
    first, the spread order then the selection's order on ties (a transfer keeps at least one
    tensor, so blocks and the schedule stay as they are: removing bytes from a transfer never
    grows a block, so the peak grows by at most the bytes). A trap's tensors of one size are
    one option (`Context.size_runs`), so a trap of many equal tensors (experts) costs a step
    per size, not one per tensor."""
    if slack <= 0:
        return pick
    item_bytes, sel, smallest = ctx.problem.item_bytes, pick.selection, ctx.smallest
    options: list[tuple[int, int, tuple[int, ...]]] = []  # (bytes, trap, its tensors of them)
    for o in ctx.spread:  # a tensor larger than the slack never fits it (the slack only shrinks)
        if smallest[o] <= slack and len(sel[o]) > 1:
            if ctx.repeating[o]:
                options.extend([(size, o, ks) for size, ks in ctx.size_runs(o, sel[o])
                                if size <= slack])  # fmt: skip
            else:
                counted = item_bytes[o]
                options.extend([(counted[k], o, (k,)) for k in sel[o] if counted[k] <= slack])
    options.sort(key=itemgetter(0), reverse=True)  # largest first, stable
    least = options[-1][0] if options else 0
    removed: dict[int, list[int]] = {}
    for size, o, items in options:
        if slack < least:  # no option left fits
            break
        if size <= slack:
            take = min(len(items), slack // size, len(sel[o]) - len(removed.get(o, ())) - 1)
            if take > 0:
                removed.setdefault(o, []).extend(items[:take])
                slack -= take * size
    if not removed:
        return pick
    new_sel, slots, streamed = list(sel), list(pick.slot_bytes), list(pick.trap_streamed)
    slot_bytes = ctx.problem.item_slot_bytes
    for o, taken in removed.items():
        out = set(taken)
        new_sel[o] = tuple([k for k in sel[o] if k not in out])
        slots[o] -= sum([slot_bytes[o][k] for k in taken])
        streamed[o] -= sum([item_bytes[o][k] for k in taken])
    return Pick(tuple(new_sel), tuple(slots), tuple(streamed))


def _by_block(ctx: Context, high: Pick, num_blocks: int, order: str) -> tuple[int, ...]:
    """Trap orders grouped by the block `high` gives them (upgrading the users of one block
    first leaves the other blocks as small as the lower level's)."""
    traps = tuple(o for o, s in enumerate(high.slot_bytes) if s)
    sizes = tuple(high.slot_bytes[o] for o in traps)
    a = assign_blocks(traps, sizes, len(high.slot_bytes), num_blocks, order,
                      ctx.problem.min_blocks)  # fmt: skip
    block = [1 << 30] * len(high.slot_bytes)  # traps without a transfer come last
    if a is not None:
        for o, b in zip(traps, a.blocks, strict=True):
            block[o] = b
    return tuple(sorted(ctx.spread, key=block.__getitem__))  # stable: spread order within


def _mix(
    ctx: Context, low: Pick, high: Pick, fits: Callable[[Pick], bool], order: tuple[int, ...]
) -> Pick:
    a, b = 0, len(low.slot_bytes)  # mixing `a` traps does not fit; all `b` does (= high)
    best = high
    while b - a > 1:
        c = (a + b) // 2
        pick = ctx.mix(low, high, c, order)
        if fits(pick):
            b, best = c, pick
        else:
            a = c
    return best


LEAST_TOLERANCE = 1024  # the smallest budget is found to within 1/1024 of itself


def least_budget(problem: Problem, peak_at: Callable[[int], int | None],
                 guess: int | None = None) -> int | None:  # fmt: skip
    """The smallest budget at which a solve finds a plan, to within 1/`LEAST_TOLERANCE` of it:
    a bisection over budgets with real solves (`peak_at(budget)`: the plan's peak, None when
    none fits) between a budget known to fail (the bytes that cannot stream plus the reserve,
    less one) and one known to hold (every weight resident). `guess` (`least_peak_guess`) is
    tried first, and the budget just under it: when the guess holds and that fails, two solves
    settle it. A budget that holds lowers the top to its plan's peak when a solve there holds
    too. None without a budget that holds."""
    reserve = problem.reserve_bytes
    lo = max(0, problem.total_bytes - problem.streamable_bytes + reserve - 1)
    hi = problem.total_bytes + reserve  # all resident: `solve` falls back to it there
    if peak_at(hi) is None:
        return None
    probes = [guess] if guess is not None else []
    while hi - lo > max(1, hi // LEAST_TOLERANCE):
        mid = probes.pop() if probes else (lo + hi) // 2
        if not lo < mid < hi:
            continue
        peak = peak_at(mid)
        if peak is None:
            lo = mid
            continue
        hi = mid
        if lo < peak < mid and peak_at(peak) is not None:
            hi = peak  # plans peak at few distinct values: jump to this one
        if mid == guess:
            probes.append(hi - max(1, hi // LEAST_TOLERANCE))
    return hi


def least_peak_guess(problem: Problem, layouts: tuple[tuple[int, str], ...],
                     selections: tuple[Selection, ...], tight: bool = False) -> int | None:  # fmt: skip
    """The least peak of a few plans' selections (usually the smallest budget, for
    `least_budget` to confirm): each of `selections` in each block layout, where its
    assignment uses the blocks `min_blocks` asks for; `tight`: a ring may be as small as the
    largest transfer when every trap streams (`adaptive`'s tight ring)."""
    found = []
    for sel in selections:
        pick = pick_of(problem, sel)
        for k, order in layouts:
            mem = _least_peak(problem, pick, k, order, tight)
            if mem is not None:
                found.append(mem)
    return min(found, default=None)


def _least_peak(problem: Problem, pick: Pick, num_blocks: int, order: str,
                tight: bool) -> int | None:  # fmt: skip
    if order == RING:  # a ring down to the largest transfer (it stalls) when every trap streams
        every = tight and all(len(c) == len(t.items) for c, t in zip(pick.selection,
                                                                     problem.traps, strict=True))  # fmt: skip
        resident = problem.total_bytes - pick.streamed_bytes + problem.reserve_bytes
        least = resident + max(pick.slot_bytes) if every and pick.streamed_bytes else None
        ring = pick_memory(problem, pick, num_blocks, order)
        return ring if least is None or ring is None else min(ring, least)
    traps = tuple(o for o, s in enumerate(pick.slot_bytes) if s)
    sizes = tuple(pick.slot_bytes[o] for o in traps)
    a = assign_blocks(traps, sizes, len(problem.traps), num_blocks, order, problem.min_blocks)
    if a is None or len(a.block_bytes) < min(problem.min_blocks, len(traps)):
        return None
    resident = problem.total_bytes - pick.streamed_bytes
    return resident + sum(a.block_bytes) + problem.reserve_bytes


def budget_error(problem: Problem, strategy: str, default: str,
                 least_of: Callable[[str], int | None]) -> BudgetError:  # fmt: skip
    """The error when no `strategy` plan fits: the smallest budget a `strategy` plan fits
    (`least_of(strategy)`, `least_budget` of its solves), the default strategy's when it is
    smaller, and what to raise or lower to reach it."""
    least = least_of(strategy)
    hint = f"{least} bytes" if least is not None else "more memory"
    also = ""
    if strategy != default:
        other = least_of(default)
        if other is not None and (least is None or other < least):
            also = f", or use --strategy {default} (its plans fit from {other} bytes)"
    if problem.min_blocks > 1:
        also += f", or lower --min-blocks (now {problem.min_blocks}): fewer blocks need less memory"
    if problem.reserve_bytes:
        also += f", or lower --activation-reserve (now {problem.reserve_bytes} bytes of it)"
    known = "" if least is None else f" (the smallest feasible budget is {hint}, within 0.1%)"
    return BudgetError(
        f"no {strategy} plan fits the budget of {problem.budget_bytes} bytes{known}; "
        f"{_raise_hint(problem, least, hint)}{also}{_pinned_note(problem)}",
        least_bytes=least,
    )


def _pinned_note(problem: Problem) -> str:
    """When most weight bytes cannot stream at all: how many, the commonest reason, where to
    read the rest (otherwise the smallest budget reads as the solver's failing)."""
    pinned = problem.total_bytes - problem.streamable_bytes
    if not problem.pinned or pinned * 2 < problem.total_bytes:
        return ""
    by_reason: dict[str, int] = {}
    for (_, reason), size in zip(problem.pinned, problem.pinned_sizes, strict=True):
        by_reason[reason] = by_reason.get(reason, 0) + size
    common = max(sorted(by_reason), key=by_reason.__getitem__)  # the most bytes
    _, example = max((size, name) for (name, reason), size
                     in zip(problem.pinned, problem.pinned_sizes, strict=True) if reason == common)  # fmt: skip
    return (
        f"; {pinned} of the {problem.total_bytes} weight bytes cannot stream (e.g. "
        f"{example!r}: {common}); `ftc inspect --explain` on a profile planned at a budget "
        "that fits lists each one's reason"
    )


def _raise_hint(problem: Problem, least: int | None, hint: str) -> str:
    """What to raise: the --mem-fraction the smallest budget needs, when the budget was one;
    a larger device, when that budget is more than the device has."""
    device = problem.fraction_of_bytes
    if least is None:
        return "raise --budget or --mem-fraction"
    if device is None:
        cap = problem.device_bytes
        if cap is not None and least > cap:
            return (
                f"that is more than the device's {cap} bytes: plan for a larger device "
                "(--target, --device-memory)"
            )
        return f"raise --budget to at least {hint}"
    fraction = math.ceil(least / device * 100) / 100
    while int(fraction * device) < least:  # the budget is int(fraction * device): round up
        fraction += 0.01
    if fraction > 1.0:
        return (
            f"that is more than the device's {device} bytes: plan for a larger device "
            "(--target, --device-memory)"
        )
    return f"raise --mem-fraction to at least {fraction:.2f} (or pass --budget {least})"
