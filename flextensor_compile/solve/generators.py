"""What each strategy streams: its selections for one block layout (the strategies' algorithms).

Owns: per strategy, the cap family it fits and how (exact subsets or largest first), the
latency-mode pick of the window families, nth-layer's step bisection, global-tensor-selection's
cover and paired selections, and `GENERATORS` (strategy name -> its picks: what each streams,
with the sizes that rank it before its selection is built; `known_selection` builds it and keeps
the pick for `build_plan`).
Must not know: ranking, simulation, which layouts are tried, the profile format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flextensor_compile.solve.assign import orders_for
from flextensor_compile.solve.families import MIN_WINDOW_MS, CapFamily, Context
from flextensor_compile.solve.paired import classes_of, paired_caps
from flextensor_compile.solve.plan import Pick, Selection, pick_of
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.search import fit_level, peak_of

__all__ = ["GENERATORS", "Candidate", "Generator", "Layout", "copies_dominate", "copy_floor_ms",
           "known_selection", "nth_selection", "slots_floor_ms"]  # fmt: skip

_COVER_KEPT = 2  # cover selections simulated per layout: those whose copies take least

Layout = tuple[int, str, int]  # (number of blocks, block order, ring headroom bytes)
Candidate = tuple[str, Pick]  # (strategy label, what it streams)
Generator = Callable[[Context, Layout], Iterator[Candidate]]


def _fit(ctx: Context, name: str, family: CapFamily, exact: bool, hi: float, lay: Layout,
         tag: tuple[object, ...], windowed: bool = False) -> Iterator[Candidate]:  # fmt: skip
    """The least streaming that fits the budget; for a time-window family (`windowed`) also the
    latency-mode pick (what the windows hide), which streams more and so peaks lower: when it
    fits, a larger budget never gets a higher peak at the same makespan. `tag` names the
    family, so picks at a level are shared between layouts (the bisections revisit levels)."""
    choose = ctx.exact if exact else ctx.greedy

    def select(x: float) -> Pick:
        key = (tag, exact, x)
        if key not in ctx.pick_cache:
            ctx.pick_cache[key] = choose(family(x))
        return ctx.pick_cache[key]

    p = ctx.problem
    if p.budget_bytes is None or windowed:
        yield name, select(p.transfer_budget_scale)
    if p.budget_bytes is None:
        return
    pick = fit_level(ctx, select, hi, lay[0], lay[1], lay[2])
    if pick is not None:
        yield name, pick


def known_selection(ctx: Context, pick: Pick) -> Selection:
    """`pick`'s selection, its pick kept for `build_plan`."""
    ctx.plans.picks.setdefault(pick.selection, pick)
    return pick.selection


def _bytes_hi(ctx: Context) -> float:
    return float(max(ctx.streamable, default=0)) + 1.0


def _knapsack(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    yield from _fit(ctx, "knapsack", ctx.time_caps(), True, ctx.time_hi, lay, windowed=True,
                    tag=("time",))  # fmt: skip


def _greedy(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    if ctx.problem.budget_bytes is None:
        yield from _fit(ctx, "greedy", ctx.time_caps(), False, ctx.time_hi, lay, tag=("time",))
        return
    yield from _fit(ctx, "greedy", ctx.uniform_caps(), False, _bytes_hi(ctx), lay,
                    tag=("uniform",))  # fmt: skip


def _global_offload(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    yield from _fit(ctx, "global-offload", ctx.time_caps(), False, ctx.time_hi, lay,
                    windowed=True, tag=("time",))  # fmt: skip


def copies_dominate(ctx: Context) -> bool:
    p = ctx.problem
    if p.budget_bytes is None:
        return False
    need = max(0, p.total_bytes + p.reserve_bytes - p.budget_bytes)
    return p.bandwidth.copy_ms(need) > p.compute_ms


def _adaptive_knapsack(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    if copies_dominate(ctx):
        family, hi, tag = ctx.proportional_caps(), _bytes_hi(ctx), "proportional"
    else:
        family, hi, tag = ctx.time_caps(), ctx.time_hi, "time"
    yield from _fit(ctx, "adaptive-knapsack", family, True, hi, lay, tag=(tag,))


def _global_tensor_selection(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    name = "global-tensor-selection"
    if ctx.problem.budget_bytes is None:
        yield from _fit(ctx, name, ctx.time_caps(), True, ctx.time_hi, lay, tag=("time",))
        return
    hi = ctx.problem.bandwidth.copy_ms(int(_bytes_hi(ctx))) * 1.001 + 1e-9
    yield from _fit(ctx, name, ctx.blended_caps(0.0), True, hi, lay, tag=("bytes-ms",))
    windows = ctx.window_ms
    mean_ms = sum(windows) / max(1, len(windows))
    if mean_ms > MIN_WINDOW_MS:
        yield from _fit(ctx, name, ctx.window_plus_caps(), True, 1.0 + hi / mean_ms, lay,
                        tag=("window-plus",))  # fmt: skip
    yield from _paired(ctx, lay)
    yield from _cover(ctx, lay)


def _cover(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    """Copy-bound memory mode with one or two blocks or the ring: for each transfer size m of
    `Context.cover_sizes`, the selections covering the deficit plus the layout's staging (its blocks
    of m, or the ring's m plus its headroom) with transfers of at most m (`cover`)."""
    if lay[0] > 2 or not copies_dominate(ctx):
        return
    found = {sel for m in ctx.cover_sizes for sel in ctx.cover_selections(m, lay[0] * m + lay[2])}
    for sel in sorted(found, key=lambda s: (copy_floor_ms(ctx, s), s))[:_COVER_KEPT]:
        yield "global-tensor-selection", ctx.plans.pick(ctx.problem, sel)


def _paired(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    """Two blocks, one cap each (copy-bound only): the cap pairs the estimate likes best, each
    fitted by bisecting one class's cap with the other's fixed."""
    p = ctx.problem
    first = orders_for(p.assignment, 2)[0]  # the orders give the same plans here; fit once
    if p.budget_bytes is None or lay != (2, first, 0) or not copies_dominate(ctx):
        return
    need = p.total_bytes + p.reserve_bytes - p.budget_bytes
    classes = classes_of(ctx.streamable)
    compute = tuple(t.compute_ms for t in p.traps)
    pair = paired_caps(ctx.tables, classes, compute, p.bandwidth, need)
    if pair is not None:
        c0, c1 = pair
        for fixed, cap, hi in ((0, c0, c1), (1, c1, c0)):
            family = ctx.class_caps(classes, fixed, float(cap))
            yield from _fit(ctx, "global-tensor-selection", family, True, hi + 1.0, lay,
                            tag=("class", fixed, cap))  # fmt: skip


def nth_selection(problem: Problem, step: int) -> Selection:
    """Every trap whose order is a multiple of `step` streams whole (the last one not, when it
    would be adjacent to trap 0 across the iteration boundary)."""
    n = len(problem.traps)
    chosen = {o for o, t in enumerate(problem.traps) if t.items and o % step == 0}
    if 0 in chosen and n - 1 in chosen and n > 1:
        chosen.discard(n - 1)
    return tuple(
        tuple(range(len(t.items))) if o in chosen else () for o, t in enumerate(problem.traps)
    )


def _nth_layer(ctx: Context, lay: Layout) -> Iterator[Candidate]:
    """Bisect the step: the largest n (fewest traps streaming) whose plan fits."""
    p = ctx.problem
    if p.budget_bytes is None:
        yield "nth-layer", ctx.plans.pick(p, nth_selection(p, 2))
        return
    budget = p.budget_bytes

    def pick(step: int) -> Pick:  # the same steps recur for every layout
        key = ("nth", step)
        if key not in ctx.pick_cache:
            sel = nth_selection(p, step) if step <= len(p.traps) else tuple(() for _ in p.traps)
            ctx.pick_cache[key] = pick_of(p, sel)
        return ctx.pick_cache[key]

    def fits(step: int) -> bool:
        mem = peak_of(ctx, pick(step), lay[0], lay[1])
        return mem is not None and mem <= budget

    if fits(2):  # every other trap: the lowest peak of the family (for a larger budget too)
        yield "nth-layer", pick(2)
    lo, hi = 1, len(p.traps) + 1  # step n + 1: nothing streams
    if fits(hi):
        yield "nth-layer", pick(hi)
        return
    if not fits(lo):
        lo = 2 if len(p.traps) > 1 and fits(2) else 0
        if lo == 0:
            return
    while hi - lo > 1:  # fits(lo) holds, fits(hi) does not
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    yield "nth-layer", pick(lo)


GENERATORS: dict[str, Generator] = {
    "knapsack": _knapsack,
    "greedy": _greedy,
    "nth-layer": _nth_layer,
    "adaptive-knapsack": _adaptive_knapsack,
    "global-offload": _global_offload,
    "global-tensor-selection": _global_tensor_selection,
}


def copy_floor_ms(ctx: Context, sel: Selection) -> float:
    """No plan of `sel` runs faster: all compute, or every trap's copy back to back (a trap's
    tensors split over several copies only take longer)."""
    return slots_floor_ms(ctx, ctx.plans.pick(ctx.problem, sel).slot_bytes)


def slots_floor_ms(ctx: Context, slot_bytes: tuple[int, ...]) -> float:
    """`copy_floor_ms` of a selection with these per-trap transfer sizes."""
    p = ctx.problem
    copies = [s for s in slot_bytes if s]
    return max(p.compute_ms, sum(ctx.plans.copies_ms(p.bandwidth, copies)))
