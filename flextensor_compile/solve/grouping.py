"""Grouped candidates: solve the traps merged by a common ancestor, then split the plan back.

Owns: finding groups at two levels (runs of consecutive traps whose names share a parent path,
or that lie inside one stack element such as `layers.3`, with the gap traps between them; a
trap whose name ends in a number, itself an element of a stack, is never grouped with its
siblings by parent path), the merged problem (one trap per group: the members' compute summed,
their items in order but those under 1/64 of the group's largest, which stay resident, their
pinned bytes), and lifting a plan of the merged problem back to the
members (each member streams the items it owns): its selection, rebuilt with every layout, and
its own layout, each coarse copy's region split among the members that read it, and that layout
with each copy issued as early as the bytes it overwrites are free (`issued_early`).
A coarse plan's structure (e.g. one MLP weight and the attention weights of each layer,
interleaved in a ring, or a whole layer's weights in one of two blocks) is then available to the
finer traps, which can only hold the bytes for less time.
Must not know: how the merged problem is solved (the caller passes the solver), modules, torch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import replace

from flextensor_compile.solve.plan import (
    Plan,
    PlanCache,
    PlannedTransfer,
    Selection,
    build_plan,
    plan_of_transfers,
)
from flextensor_compile.solve.problem import TINY_RATIO, Problem, TrapSpec
from flextensor_runtime.errors import ConfigError

__all__ = [
    "LEVELS",
    "Groups",
    "early_issue_points",
    "group_traps",
    "grouped_plans",
    "issued_early",
    "lift",
    "lift_plan",
    "merged_problem",
]

Groups = tuple[tuple[int, ...], ...]  # trap orders of each group, in order, covering every trap
_MERGE_FACTOR = 1.2  # grouping must cut the trap count by this factor to be worth a solve


def _parent(name: str) -> str | None:
    """The parent path of a trap that may be grouped (None: a gap trap, a stack element, or a
    top-level name)."""
    parent, dot, last = name.rpartition(".")
    if not dot or not parent or last.isdigit() or name.startswith("gap:"):
        return None
    return parent


def _element(name: str) -> str | None:
    """The stack element a trap lies inside (`layers.3` for `layers.3.mlp.up`; None: a gap
    trap, a trap that is itself a stack element, or one outside every stack)."""
    parts = name.split(".")
    if name.startswith("gap:"):
        return None
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None


LEVELS = ("parent", "element")  # what `group_traps` may group by


def group_traps(problem: Problem, level: str = "parent") -> Groups | None:
    """Runs of consecutive traps with one parent (`level` "parent") or inside one stack element
    ("element"), gap traps between two members joining the run; None when that merges too
    little to matter."""
    if level not in LEVELS:
        raise ConfigError(f"unknown grouping level {level!r}; choose one of {', '.join(LEVELS)}")
    key = _element if level == "element" else _parent
    groups: list[list[int]] = []
    current: str | None = None
    pending: list[int] = []  # gap traps after the current run, joined if the run goes on
    for order, trap in enumerate(problem.traps):
        if trap.kind == "gap":
            pending.append(order)
            continue
        parent = key(trap.name)
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


def _common_path(names: list[str]) -> str:
    """The longest dotted path every name starts with (the members' ancestor)."""
    split = [n.split(".") for n in names]
    common = []
    for parts in zip(*split, strict=False):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return ".".join(common) or names[0]


def _kept(problem: Problem, members: tuple[int, ...]) -> list[tuple[int, int]]:
    """(member order, item index) of each item of a group that its merged trap can stream, in
    member order: a tensor under 1/`TINY_RATIO` of the group's largest stays resident, as it
    would in a trap recorded at that granularity (alone it would take a copy and a block)."""
    traps = problem.traps
    largest = max((it.bytes for o in members for it in traps[o].items), default=0)
    return [(o, k) for o in members for k, it in enumerate(traps[o].items)
            if it.bytes * TINY_RATIO >= largest]  # fmt: skip


def merged_problem(problem: Problem, groups: Groups) -> Problem:
    """One trap per group: summed compute, the members' items in member order (but tiny ones,
    `_kept`), summed pins."""
    traps = []
    for members in groups:
        first = problem.traps[members[0]]
        if len(members) == 1:
            traps.append(first)
            continue
        parts = [problem.traps[o] for o in members]
        items = tuple(problem.traps[o].items[k] for o, k in _kept(problem, members))
        streamable = sum(it.bytes for t in parts for it in t.items)
        traps.append(TrapSpec(
            _common_path([t.name for t in parts if t.kind != "gap"]), "module",
            sum(t.compute_ms for t in parts), items,
            sum(t.pinned_bytes for t in parts) + streamable - sum(it.bytes for it in items),
        ))  # fmt: skip
    return replace(problem, traps=tuple(traps))


def _owners(problem: Problem, groups: Groups) -> list[list[tuple[int, int]]]:
    """Per group, (member order, item index) of each item of its merged trap."""
    return [_kept(problem, m) if len(m) > 1 else [(m[0], k) for k in
            range(len(problem.traps[m[0]].items))] for m in groups]  # fmt: skip


def lift(problem: Problem, groups: Groups, selection: Selection) -> Selection:
    """A selection of `merged_problem(problem, groups)` as a selection of `problem`."""
    out: list[list[int]] = [[] for _ in problem.traps]
    for owners, chosen in zip(_owners(problem, groups), selection, strict=True):
        for j in chosen:
            order, k = owners[j]
            out[order].append(k)
    return tuple(tuple(sorted(ks)) for ks in out)


def lift_plan(problem: Problem, groups: Groups, coarse: Plan, cache: PlanCache) -> Plan:
    """`coarse` (a plan of `merged_problem(problem, groups)`) with its own blocks and issue
    points: each coarse copy's region is split, in member order, among the members that own its
    items, each member's part its own copy, issued at the entry of the issuing group's first
    member and released once that member has finished."""
    owners = _owners(problem, groups)
    slots = problem.item_slot_bytes
    bw = problem.bandwidth
    transfers = []
    for x in coarse.transfers:
        mine: dict[int, list[int]] = {}
        for j in x.items:
            order, k = owners[x.trap][j]
            mine.setdefault(order, []).append(k)
        offset = x.offset
        for order in sorted(mine):
            ks = tuple(sorted(mine[order]))
            size = sum(slots[order][k] for k in ks)
            transfers.append(PlannedTransfer(order, x.block, size, groups[x.issue_at][0], order,
                                             cache.copy_ms(bw, size), ks, offset))  # fmt: skip
            offset += size
        assert offset == x.offset + x.bytes  # the members' parts tile the coarse region
    selection = lift(problem, groups, coarse.selection)
    return plan_of_transfers(problem, selection, coarse.strategy, coarse.block_bytes,
                             tuple(transfers), cache)  # fmt: skip


def issued_early(problem: Problem, plan: Plan, cache: PlanCache) -> Plan:
    """`plan` with each copy issued as early as its bytes allow (`early_issue_points`)."""
    points = early_issue_points(plan.transfers, len(problem.traps))
    moved = tuple(replace(x, issue_at=at) for x, at in zip(plan.transfers, points, strict=True))
    return plan_of_transfers(problem, plan.selection, plan.strategy, plan.block_bytes, moved,
                             cache)  # fmt: skip


def early_issue_points(transfers: tuple[PlannedTransfer, ...], n: int) -> list[int]:
    """Per transfer, the earliest its bytes allow it to be issued: the entry of the trap after
    the last reader of the nearest earlier copy into overlapping bytes of its block (cyclically
    over `n` traps, at most one iteration ahead of its reader)."""
    by_block: dict[int, list[PlannedTransfer]] = {}
    for x in transfers:
        by_block.setdefault(x.block, []).append(x)
    for copies in by_block.values():
        copies.sort(key=lambda u: u.release_after)  # stable
    released = {b: [u.release_after for u in copies] for b, copies in by_block.items()}
    points = []
    for x in transfers:
        back = n  # trap positions before its reader the copy may be issued at: < this
        for u in _nearest_first(by_block[x.block], released[x.block], x.trap):
            if u is not x and u.offset < x.offset + x.bytes and x.offset < u.offset + u.bytes:
                back = (x.trap - u.release_after) % n  # the least: copies come nearest first
                break
        points.append((x.trap - (back - 1)) % n)
    return points


def _nearest_first(copies: list[PlannedTransfer], released: list[int], trap: int
                   ) -> Iterator[PlannedTransfer]:  # fmt: skip
    """`copies` (sorted by `release_after`, which `released` lists) whose last reader is not
    `trap`, the one released nearest before `trap` first (cyclically: those released before it
    in descending order, then those released after it, descending)."""
    below, above = bisect_left(released, trap), bisect_right(released, trap)
    for i in range(below - 1, -1, -1):
        yield copies[i]
    for i in range(len(copies) - 1, above - 1, -1):
        yield copies[i]


def grouped_plans(
    problem: Problem,
    solve_merged: Callable[[Problem], Plan | None],
    layouts: tuple[tuple[int, str, int], ...],
    cache: PlanCache,
) -> Iterator[Plan]:
    """For each level's groups, the merged problem's plan (`solve_merged`) lifted onto the
    traps: its selection built with every layout (the finer traps hold each weight for less
    time than their group did), and its own layout (`lift_plan`), as is and issued early (an
    early copy may queue ahead of one needed sooner: the simulation decides; not under strict
    round robin, whose transfers each take the next block); only plans within the budget and
    `min_blocks`."""
    seen: set[Groups] = set()
    for level in LEVELS:
        groups = group_traps(problem, level)
        if groups is None or groups in seen:
            continue
        seen.add(groups)
        coarse = solve_merged(merged_problem(problem, groups))
        if coarse is None:
            continue
        selection = lift(problem, groups, coarse.selection)
        plans = [build_plan(problem, selection, blocks, coarse.strategy, order, cache=cache)
                 for blocks, order, _headroom in layouts]  # fmt: skip
        if coarse.transfers and problem.assignment != "strict-round-robin":
            # (strict round robin gives each transfer a block of its own in turn)
            lifted = lift_plan(problem, groups, coarse, cache)
            plans += [lifted, issued_early(problem, lifted, cache)]
        for plan in plans:
            if plan is None or len(plan.block_bytes) < min(problem.min_blocks, len(plan.transfers)):
                continue
            if problem.budget_bytes is None or plan.peak_bytes <= problem.budget_bytes:
                yield plan
