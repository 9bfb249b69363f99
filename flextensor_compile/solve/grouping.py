"""Grouped candidates: solve the traps merged by their parent module, then split the plan back.

Owns: finding groups (runs of consecutive traps whose names share a parent path, with the gap
traps between them; a trap whose name ends in a number, an element of a stack such as
`layers.3`, is never grouped with its siblings), the merged problem (one trap per group: the
members' compute summed, their items in order, their pinned bytes), and lifting a selection of
the merged problem back to the members (each member streams the items it owns).
A coarse plan's structure (e.g. one MLP weight and the attention weights of each layer,
interleaved in a ring) is then available to the finer traps, which can only hold the bytes for
less time; the caller builds and simulates the lifted selection like any other.
Must not know: how the merged problem is solved (the caller passes the solver), modules, torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from flextensor_compile.solve.plan import Plan, PlanCache, Selection, build_plan
from flextensor_compile.solve.problem import Problem, TrapSpec
from flextensor_runtime.errors import BudgetError

__all__ = ["Groups", "group_traps", "grouped_plans", "lift", "merged_problem"]

Groups = tuple[tuple[int, ...], ...]  # trap orders of each group, in order, covering every trap
_MERGE_FACTOR = 1.2  # grouping must cut the trap count by this factor to be worth a solve


def _parent(name: str) -> str | None:
    """The parent path of a trap that may be grouped (None: a gap trap, a stack element, or a
    top-level name)."""
    parent, dot, last = name.rpartition(".")
    if not dot or not parent or last.isdigit() or name.startswith("gap:"):
        return None
    return parent


def group_traps(problem: Problem) -> Groups | None:
    """Runs of consecutive traps with one parent (gap traps between two members join the run);
    None when that merges too little to matter."""
    groups: list[list[int]] = []
    current: str | None = None
    pending: list[int] = []  # gap traps after the current run, joined if the run goes on
    for order, trap in enumerate(problem.traps):
        parent = None if trap.kind == "gap" else _parent(trap.name)
        if trap.kind == "gap":
            pending.append(order)
            continue
        if parent is not None and parent == current:
            groups[-1].extend([*pending, order])
        else:
            groups.extend([g] for g in pending)
            groups.append([order])
        pending, current = [], parent
    groups.extend([g] for g in pending)
    if len(problem.traps) < _MERGE_FACTOR * len(groups):
        return None
    return tuple(tuple(g) for g in groups)


def merged_problem(problem: Problem, groups: Groups) -> Problem:
    """One trap per group: summed compute, the members' items in member order, summed pins."""
    traps = []
    for members in groups:
        first = problem.traps[members[0]]
        if len(members) == 1:
            traps.append(first)
            continue
        parts = [problem.traps[o] for o in members]
        traps.append(TrapSpec(
            _parent(first.name) or first.name, "module",
            sum(t.compute_ms for t in parts),
            tuple(it for t in parts for it in t.items),
            sum(t.pinned_bytes for t in parts),
        ))  # fmt: skip
    return replace(problem, traps=tuple(traps))


def lift(problem: Problem, groups: Groups, selection: Selection) -> Selection:
    """A selection of `merged_problem(problem, groups)` as a selection of `problem`."""
    out: list[tuple[int, ...]] = [() for _ in problem.traps]
    for members, chosen in zip(groups, selection, strict=True):
        offset = 0
        picked = set(chosen)
        for order in members:
            n = len(problem.traps[order].items)
            out[order] = tuple(k for k in range(n) if offset + k in picked)
            offset += n
    return tuple(out)


def grouped_plans(
    problem: Problem,
    solve_merged: Callable[[Problem], Plan],
    layouts: tuple[tuple[int, str, int], ...],
    cache: PlanCache,
) -> Iterator[Plan]:
    """The merged problem's plan (`solve_merged`), its selection lifted onto the traps, built
    with every layout (the finer traps hold each weight for less time than their group did);
    only plans within the budget and `min_blocks`."""
    groups = group_traps(problem)
    if groups is None:
        return
    try:
        coarse = solve_merged(merged_problem(problem, groups))
    except BudgetError:
        return
    selection = lift(problem, groups, coarse.selection)
    for blocks, order, _headroom in layouts:
        plan = build_plan(problem, selection, blocks, coarse.strategy, order, cache=cache)
        if plan is None or len(plan.block_bytes) < min(problem.min_blocks, len(plan.transfers)):
            continue
        if problem.budget_bytes is None or plan.peak_bytes <= problem.budget_bytes:
            yield plan
