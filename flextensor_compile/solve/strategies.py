"""The strategies: each decides what streams, then shares assignment, schedule and simulation.

Owns: `solve(problem, strategy) -> Plan` (and `try_solve`): which block layouts are tried, which
candidates are built and ranked, the ring's refits, the smallest feasible budget of a
`BudgetError`. Each strategy's selections are made in `generators`; their algorithms:
- knapsack: per transfer window, the exact largest subset whose copy fits scale x window;
- greedy: per trap, largest tensors first up to one uniform byte cap;
- nth-layer: every n-th trap streams whole (n as large as the budget allows);
- adaptive-knapsack: exact subsets against time windows when copies can hide in compute,
  against bytes in proportion to each trap's weights when copies dominate;
- global-offload: per trap, largest tensors first that fit the window before it;
- global-tensor-selection: exact subsets for the whole model at one level of two cap families
  (a uniform byte cap; each window plus a uniform extra), and when copies dominate, with two
  blocks paired caps (one cap per block class, `paired`) and with one or two blocks or the
  ring the fewest, largest transfers that cover the deficit (`cover`), keeping the best
  simulated;
- adaptive (default): all of the above, and when copies dominate or no plan is within 0.1% of
  the bound the plans of the traps merged by parent module or stack element lifted back
  (`grouping`); best by makespan, then peak, then streamed bytes.
In memory mode every strategy bisects its level to the least streaming that fits the budget,
for each layout tried (block count x block order); latency mode streams what fits the windows
scaled by `transfer_budget_scale`, uncapped.
Must not know: the profile format, files, clocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial

from flextensor_compile.solve.assign import orders_for
from flextensor_compile.solve.families import Context, make_context
from flextensor_compile.solve.generators import (
    GENERATORS,
    Layout,
    copies_dominate,
    copy_floor_ms,
    known_selection,
    nth_selection,
    slots_floor_ms,
)
from flextensor_compile.solve.grouping import grouped_plans
from flextensor_compile.solve.plan import (
    RING,
    Pick,
    Plan,
    Ranked,
    RingCandidate,
    Selection,
    build_plan,
    copies_of,
    ring_candidate,
)
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.search import (
    budget_error,
    least_budget,
    least_peak_guess,
)
from flextensor_runtime.errors import ConfigError

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "nth_selection", "solve", "try_solve"]

DEFAULT_STRATEGY = "adaptive"
STRATEGIES = ("adaptive", "knapsack", "greedy", "nth-layer", "adaptive-knapsack",
              "global-offload", "global-tensor-selection")  # fmt: skip
_BLOCK_COUNTS = (1, 2, 3)
# ring headroom, x the largest transfer
_RING_HEADROOM = (0.125, 0.25, 0.5, 1.0)
_RING_FAMILIES = ("knapsack", "adaptive-knapsack", "global-tensor-selection", "nth-layer",
                  "greedy", "global-offload")  # fmt: skip
_RING_GAIN = 1e-3  # the ring is skipped when the best plan is this close to the bound
_GROUP_GAIN = 1e-3  # so are grouped candidates, unless copies dominate
_TIGHT_TRIES = 12  # traps the tight ring's descent tries keeping resident per round
_TIGHT_ROUNDS = 4  # and its rounds (each keeps one more trap resident)


def layouts(p: Problem) -> tuple[Layout, ...]:
    """Block counts (the configured one, else 1 to 3 within `min_blocks`) x block orders, and
    with optimized round robin the ring when one block is allowed (before the one-block
    orders, which are then a fallback); the ring alone with the ring assignment."""
    if p.assignment == RING:
        return ((1, RING, 0),)
    if p.num_blocks is not None:
        counts: tuple[int, ...] = (p.num_blocks,)
    else:
        counts = tuple(k for k in _BLOCK_COUNTS if k >= p.min_blocks) or (p.min_blocks,)
    out = tuple((k, o, 0) for k in counts for o in orders_for(p.assignment, k))
    if 1 in counts and p.assignment == "optimized-round-robin":
        one = tuple(lay for lay in out if lay[0] == 1)
        out = (*(lay for lay in out if lay[0] != 1), (1, RING, 0), *one)
    return out


def _one_block_fallback(p: Problem) -> bool:
    """With the ring in memory mode a one-block layout mostly adds the plans that fit the
    smallest budgets (every other trap streaming): a family tries it when none of its plans
    with blocks fitted (under `adaptive` too, so it is never slower than the family alone)."""
    return p.budget_bytes is not None and p.assignment == "optimized-round-robin"


def _bound_ms(p: Problem) -> float:
    """No plan runs faster: all compute, or copying what the budget cannot hold."""
    if p.budget_bytes is None:
        return p.compute_ms
    need = p.total_bytes + p.reserve_bytes - p.budget_bytes
    return max(p.compute_ms, p.bandwidth.copy_ms(need))


def _cannot_win(ctx: Context, sel: Selection, lay: Layout, best_ms: float) -> bool:
    """Whether `sel`'s copies alone take longer than the best plan so far, so its plan cannot
    rank first: the ring skips ties too (its plans are refits of plans already seen), blocks
    only a floor above the best by more than the rank's rounding (a tie may still win on peak)."""
    if best_ms == math.inf:
        return False
    return _beaten(copy_floor_ms(ctx, sel), lay, best_ms)


def _beaten(floor: float, lay: Layout, best_ms: float) -> bool:
    """`_cannot_win` of a selection whose copy floor is `floor`."""
    if lay[1] == RING:
        return floor >= best_ms
    return floor > best_ms + max(best_ms * 1e-9, 2e-9)


class _Built:
    """The plans one solve built, per (selection, layout), and their transfer sizes: a pick whose
    sizes none has was not built, so its floor is checked before its selection is made."""

    def __init__(self) -> None:
        self.plans: dict[tuple[Selection, tuple[int, str]], Ranked | None] = {}
        self.sizes: set[tuple[tuple[int, ...], tuple[int, str]]] = set()

    def plan(self, ctx: Context, label: str, pick: Pick, lay: Layout, least: float
             ) -> Ranked | None:  # fmt: skip
        """`pick`'s plan with `lay`, built once (a selection built already comes again as that
        plan); None when it cannot beat `least` (`_cannot_win`) or cannot be built."""
        sized = (pick.slot_bytes, lay[:2])
        fresh = sized not in self.sizes and least < math.inf  # not built: its floor decides
        if fresh and _beaten(slots_floor_ms(ctx, pick.slot_bytes), lay, least):
            return None
        sel = known_selection(ctx, pick)
        key = (sel, lay[:2])
        if key in self.plans:
            return self.plans[key]
        if _cannot_win(ctx, sel, lay, least):
            return None
        self.sizes.add(sized)
        p = ctx.problem
        plan = self.plans[key] = (
            ring_candidate(p, sel, label, ctx.plans) if lay[1] == RING
            else build_plan(p, sel, lay[0], label, lay[1], cache=ctx.plans))  # fmt: skip
        return plan


def _candidates(ctx: Context, strategy: str) -> Iterator[Ranked]:
    """Every generator's plans for every block layout (one block only as a fallback when the ring
    is tried in memory mode); then the ring's (`_ring_plans`), unless the best plan is already
    within 0.1% of the bound, skipping selections whose copies alone take longer than the best
    plan so far (`_cannot_win`)."""
    names = list(GENERATORS) if strategy == "adaptive" else [strategy]
    p = ctx.problem
    built = _Built()
    best = math.inf
    fitted: dict[str, float] = {}  # family -> its best plan with blocks so far

    def plans(name: str, lay: Layout, floor: float = math.inf) -> Iterator[Ranked]:
        """`name`'s plans with `lay` (the ring ranks families by their plans, so a plan another
        family built comes again)."""
        for label, pick in GENERATORS[name](ctx, lay):
            plan = built.plan(ctx, label, pick, lay, min(best, floor))
            if plan is None or len(plan.block_bytes) < min(p.min_blocks, copies_of(plan)):
                continue
            if p.budget_bytes is None or plan.peak_bytes <= p.budget_bytes:
                yield plan

    for lay in layouts(p):
        if lay[1] == RING:
            if best > _bound_ms(p) * (1 + _RING_GAIN):  # else no ring plan can gain enough
                yield from _ring_plans(ctx, names, plans)
            continue
        for name in names:
            if lay[0] == 1 and fitted.get(name, math.inf) < math.inf and _one_block_fallback(p):
                continue  # one block is the family's fallback (as when it runs alone)
            for plan in plans(name, lay):
                best = min(best, plan.makespan_ms)
                fitted[name] = min(fitted.get(name, math.inf), plan.makespan_ms)
                yield plan


def _ring_plans(ctx: Context, names: list[str],
                plans: Callable[[str, Layout, float], Iterator[Ranked]]) -> Iterator[Ranked]:  # fmt: skip
    """The ring's plans: each family's least-streaming fit (under `adaptive` the ring families,
    `_RING_FAMILIES`); in memory mode then, for each family (those whose ring plans simulate
    fastest first), the family fitted with headroom, so the ring has room to copy ahead: 1/8,
    1/4, 1/2 and 1 x the largest transfer, and 2, 4 and 8 x when compute dominates (copies then
    hide, so staging costs little; leaf traps' transfers are small against the lead a copy
    needs); selections whose copies alone take longer than the fastest ring plan are skipped."""
    p = ctx.problem
    base = (1, RING, 0)
    ranked: dict[str, tuple[float, int]] = {}  # family -> (its best ring makespan, top bytes)
    for name in names if len(names) == 1 else _RING_FAMILIES:
        for plan in plans(name, base, math.inf):
            if plan.makespan_ms < ranked.get(name, (math.inf, 0))[0]:
                ranked[name] = (plan.makespan_ms, max(ctx.plans.pick(p, plan.selection).slot_bytes))
            yield plan
    if p.budget_bytes is None:
        return
    fastest = min((made for made, _ in ranked.values()), default=math.inf)
    for name in sorted(ranked, key=lambda g: (ranked[g], g)):
        top = ranked[name][1]
        parts = _RING_HEADROOM if copies_dominate(ctx) else (*_RING_HEADROOM, 2.0, 4.0, 8.0)
        for part in parts:
            for plan in plans(name, (1, RING, int(top * part)), fastest):
                fastest = min(fastest, plan.makespan_ms)
                yield plan


def _tight_ring(ctx: Context, best: Ranked | None) -> list[Ranked]:
    """`adaptive` in memory mode with the ring allowed: every trap streaming whole (nth-layer's
    every trap) through all the ring the budget leaves, even less than `ring_need`, down to the
    largest trap's transfer; a copy then waits for the bytes the trap before it releases (it
    stalls), but budgets down to the bytes that cannot stream plus one trap's transfer fit.
    Skipped, as the ring is, when `best` is within `_RING_GAIN` of the bound or its copies alone
    take longer than `best`. From there a descent keeps traps resident (`_tight_descent`)."""
    p = ctx.problem
    if p.budget_bytes is None or not any(lay[1] == RING for lay in layouts(p)):
        return []
    every = tuple(tuple(range(len(t.items))) for t in p.traps)
    if best is not None and best.makespan_ms <= _bound_ms(p) * (1 + _RING_GAIN):
        return []
    tight = _tight_plan(ctx, every, best)
    if tight is None:
        return []
    return [_tight_descent(ctx, every, tight)]


def _tight_plan(ctx: Context, sel: Selection, best: Ranked | None) -> RingCandidate | None:
    """`sel`'s tight ring plan when it fits and may beat `best` (None otherwise)."""
    p = ctx.problem
    assert p.budget_bytes is not None
    if best is not None and _cannot_win(ctx, sel, (1, RING, 0), best.makespan_ms):
        return None
    plan = ring_candidate(p, sel, "nth-layer", ctx.plans, tight=True)
    if plan is None or plan.peak_bytes > p.budget_bytes or copies_of(plan) > 1 < p.min_blocks:
        return None
    if best is not None and plan.rank_key() >= best.rank_key():
        return None
    return plan


def _tight_descent(ctx: Context, sel: Selection, plan: RingCandidate) -> RingCandidate:
    """From the tight ring's plan of `sel`, keep one more trap resident while that ranks better
    (the ring shrinks by its bytes, its copies go: with a per-copy latency a small trap costs
    more to copy than its bytes are worth), trying per round up to `_TIGHT_TRIES` streaming
    traps (the smallest and the largest transfers first) and at most `_TIGHT_ROUNDS` rounds."""
    for _ in range(_TIGHT_ROUNDS):
        slots = ctx.plans.pick(ctx.problem, sel).slot_bytes  # per trap: its transfer's bytes
        streaming = sorted((b, o) for o, b in enumerate(slots) if b)
        if len(streaming) < 2:
            break
        half = _TIGHT_TRIES // 2
        tries = (
            streaming if len(streaming) <= _TIGHT_TRIES else streaming[:half] + streaming[-half:]
        )
        found = None
        for _, o in tries:
            fewer = tuple(() if i == o else ch for i, ch in enumerate(sel))
            better = _tight_plan(ctx, fewer, plan if found is None else found[1])
            if better is not None:
                found = (fewer, better)
        if found is None:
            break
        sel, plan = found
    return plan


def solve(problem: Problem, strategy: str = DEFAULT_STRATEGY) -> Plan:
    """The best plan `strategy` finds; `BudgetError` (with the smallest feasible budget) if none
    fits in memory mode. `adaptive` also lifts the plan of the traps merged by parent module
    (`grouping`) back onto the traps."""
    plan = try_solve(problem, strategy)
    if plan is None:
        raise budget_error(problem, strategy, DEFAULT_STRATEGY, partial(_least_budget, problem))
    return plan


def try_solve(problem: Problem, strategy: str = DEFAULT_STRATEGY) -> Plan | None:
    """`solve`, None where no plan fits the budget (without the search for the smallest budget
    one fits that `BudgetError` states: for callers that only ask whether a plan fits)."""
    return _solve(problem, strategy, grouped=True)


def _least_budget(problem: Problem, strategy: str) -> int | None:
    """The smallest budget a `strategy` plan fits (`search.least_budget` of its solves)."""

    def peak_at(budget: int) -> int | None:
        plan = try_solve(replace(problem, budget_bytes=budget), strategy)
        return None if plan is None else plan.peak_bytes

    full = tuple(tuple(range(len(t.items))) for t in problem.traps)
    streaming = [o for o, t in enumerate(problem.traps) if t.items]
    # all but one trap: with two blocks an odd number of streaming traps cannot all stream
    but_last = tuple(() if streaming and o == streaming[-1] else c for o, c in enumerate(full))
    pairs = tuple(lay[:2] for lay in layouts(problem))
    guess = least_peak_guess(problem, pairs, (full, but_last, nth_selection(problem, 2)),
                             tight=strategy == DEFAULT_STRATEGY)  # fmt: skip
    return least_budget(problem, peak_at, guess)


def _best(plans: Iterable[Ranked], best: Ranked | None = None) -> Ranked | None:
    for plan in plans:
        if best is None or plan.rank_key() < best.rank_key():
            best = plan
    return best


def _grouping_may_gain(ctx: Context, best: Ranked | None) -> bool:
    """Grouped candidates are solved when copies dominate (coarse shapes then save staging) or
    when the best plan is not yet within `_GROUP_GAIN` of the bound."""
    gap = best is None or best.makespan_ms > _bound_ms(ctx.problem) * (1 + _GROUP_GAIN)
    return gap or copies_dominate(ctx)


def _solve(problem: Problem, strategy: str, grouped: bool) -> Plan | None:
    """The best plan, None when none fits the budget."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    ctx = make_context(problem)
    best = _best(_candidates(ctx, strategy))
    if grouped and strategy == DEFAULT_STRATEGY and _grouping_may_gain(ctx, best):
        merged = partial(_solve, strategy=DEFAULT_STRATEGY, grouped=False)
        best = _best(grouped_plans(problem, merged, layouts(problem), ctx.plans), best)
    budget = problem.budget_bytes
    if strategy == DEFAULT_STRATEGY:
        best = _best(_tight_ring(ctx, best), best)
    holds_all = budget is not None and problem.total_bytes + problem.reserve_bytes <= budget
    if holds_all or (best is None and budget is None):
        # where the budget holds every weight, keeping all resident competes (no copy can be
        # faster; a streaming plan as fast wins on its lower peak); in latency mode it is the
        # fallback (with the ring assignment and nothing to stream, no layout makes a plan)
        resident = build_plan(problem, tuple(() for _ in problem.traps), 1, strategy, "strict")
        best = _best([resident] if resident is not None else [], best)
    if best is None:
        return None
    return best.plan() if isinstance(best, RingCandidate) else best
