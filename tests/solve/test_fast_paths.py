"""The solver's shortcuts agree with the full computations they stand in for (hypothesis)."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.solve.assign import (
    ORDERS,
    _grow_any,
    _grow_two,
    assign_blocks,
    assigned_bytes,
)
from flextensor_compile.solve.bound import _subset_sums
from flextensor_compile.solve.families import Context, make_context
from flextensor_compile.solve.grouping import early_issue_points
from flextensor_compile.solve.plan import Pick, PlannedTransfer, Selection, pick_of
from flextensor_compile.solve.problem import problem_from_stats
from flextensor_compile.solve.ring_split import _beside, _beside_many
from flextensor_compile.solve.search import _trim
from flextensor_compile.solve.subset import _first_items
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, tensor


@st.composite
def _transfers(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    n_traps = draw(st.integers(1, 14))
    traps = tuple(sorted(draw(st.sets(st.integers(0, n_traps - 1), max_size=n_traps))))
    sizes = tuple(draw(st.integers(1, 64)) * 256 for _ in traps)
    return traps, sizes, n_traps


@settings(max_examples=400, deadline=None)
@given(_transfers(), st.integers(0, 5), st.sampled_from(ORDERS))
def test_assigned_bytes_is_the_total_of_assign_blocks(
    transfers: tuple[tuple[int, ...], tuple[int, ...], int], num_blocks: int, mode: str
) -> None:
    traps, sizes, n_traps = transfers
    full = assign_blocks(traps, sizes, n_traps, num_blocks, mode)
    total = assigned_bytes(traps, sizes, n_traps, num_blocks, mode)
    assert total == (None if full is None else sum(full.block_bytes))


@settings(max_examples=400, deadline=None)
@given(_transfers())
def test_two_block_growth_matches_the_general_loop(
    transfers: tuple[tuple[int, ...], tuple[int, ...], int],
) -> None:
    traps, sizes, n_traps = transfers
    assert _grow_two(traps, sizes, n_traps) == _grow_any(traps, sizes, n_traps, 2)


def _trim_one_by_one(ctx: Context, pick: Pick, slack: int) -> Selection:
    """`search._trim`'s rule, one tensor at a time: every streamed tensor within the slack,
    largest first (spread order, then selection order, on ties), goes resident while the slack
    pays for it and its trap keeps one."""
    sel = pick.selection
    options = [(ctx.problem.item_bytes[o][k], o, k) for o in ctx.spread
               if ctx.smallest[o] <= slack and len(sel[o]) > 1 for k in sel[o]]  # fmt: skip
    options.sort(key=lambda x: x[0], reverse=True)  # stable
    gone: dict[int, set[int]] = {}
    for nbytes, o, k in options:
        if nbytes <= slack and len(sel[o]) - len(gone.get(o, ())) > 1:
            gone.setdefault(o, set()).add(k)
            slack -= nbytes
    return tuple(tuple(k for k in ch if k not in gone.get(o, ())) for o, ch in enumerate(sel))


@st.composite
def _trim_cases(draw: st.DrawFn) -> tuple[Context, Pick, int]:
    """Traps of tensors drawn from a few sizes (runs of equal tensors, as experts make), some
    of them not aligned (slot bytes above counted bytes), each streaming a drawn subset."""
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    traps = []
    for i in range(draw(st.integers(1, 6))):
        elems = draw(st.lists(st.sampled_from(sizes), max_size=9))
        traps.append(TrapStat(f"t{i}", 1.0, tuple(
            tensor(f"t{i}.{k}", e * 100 + draw(st.sampled_from([0, 3]))) for k, e in enumerate(elems)
        )))  # fmt: skip
    problem = problem_from_stats(Stats("trim", device(), tuple(traps)), PlanConfig(budget_bytes=1))
    ctx = make_context(problem)
    sel = tuple(
        tuple(k for k in range(len(t.items)) if draw(st.booleans())) for t in problem.traps
    )
    slack = draw(st.integers(0, sum(map(sum, problem.item_bytes)) + 1))
    return ctx, pick_of(problem, sel), slack


@settings(max_examples=400, deadline=None)
@given(_trim_cases())
def test_trim_by_runs_of_equal_tensors_matches_one_tensor_at_a_time(
    case: tuple[Context, Pick, int],
) -> None:
    ctx, pick, slack = case
    trimmed = _trim(ctx, pick, slack)
    assert trimmed.selection == _trim_one_by_one(ctx, pick, slack)
    assert trimmed.slot_bytes == pick_of(ctx.problem, trimmed.selection).slot_bytes
    assert trimmed.trap_streamed == pick_of(ctx.problem, trimmed.selection).trap_streamed
    freed = pick.streamed_bytes - trimmed.streamed_bytes
    assert 0 <= freed <= max(slack, 0)


_REPEATING = st.lists(st.sampled_from([0, 3, 5, 64, 96, 1000]), max_size=14)  # runs of equal sizes


@settings(max_examples=400, deadline=None)
@given(_REPEATING, st.integers(1, 300))
def test_first_items_after_equal_sizes_matches_growing_every_sum(
    sizes: list[int], most: int
) -> None:
    first: dict[int, int] | None = {0: -1}
    for k, size in enumerate(sizes):  # every sum grows by every item
        assert first is not None
        first = {**{s + size: k for s in first}, **first}
        if len(first) > most:
            first = None
            break
    assert _first_items(tuple(sizes), most) == first


@settings(max_examples=400, deadline=None)
@given(_REPEATING, st.integers(1, 300))
def test_bound_subset_sums_after_equal_sizes_match_every_subset(
    sizes: list[int], limit: int
) -> None:
    every = {sum(c) for r in range(len(sizes) + 1) for c in combinations(sizes, r)}
    expected = sorted(every) if len(every) <= limit else None
    assert _subset_sums(sizes, limit) == expected


@st.composite
def _stretches(draw: st.DrawFn) -> list[list[int]]:
    """Stretches as `ring_split._beside` keeps them: [start, end, low, high, painted start, painted
    end], 0 <= low <= start <= end <= high, free extents that may overlap their neighbours'."""
    runs = []
    for _ in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, 400))
        end = start + draw(st.integers(0, 60))
        low, high = max(0, start - draw(st.integers(0, 200))), end + draw(st.integers(0, 200))
        runs.append([start, end, low, high, start, end])
    return runs


@settings(max_examples=500, deadline=None)
@given(_stretches(), st.integers(1, 40), st.integers(1, 12))
def test_beside_many_places_as_beside_does_one_by_one(
    runs: list[list[int]], size: int, count: int
) -> None:
    one_by_one = [list(r) for r in runs]
    expected = []
    for _ in range(count):
        at = _beside(one_by_one, size)
        if at < 0:
            break
        expected.append(at)
    got = _beside_many(runs, size, count)
    assert list(got) == expected
    assert runs == one_by_one


@st.composite
def _block_copies(draw: st.DrawFn) -> tuple[tuple[PlannedTransfer, ...], int]:
    """Copies into two blocks at overlapping or disjoint offsets, readers spread over n traps."""
    n = draw(st.integers(1, 9))
    copies = []
    for _ in range(draw(st.integers(0, 10))):
        trap = draw(st.integers(0, n - 1))
        copies.append(PlannedTransfer(trap, draw(st.integers(0, 1)), draw(st.integers(1, 5)), trap,
                                      draw(st.integers(0, n - 1)), 1.0, (0,),
                                      draw(st.integers(0, 6))))  # fmt: skip
    return tuple(copies), n


@settings(max_examples=500, deadline=None)
@given(_block_copies())
def test_early_issue_points_match_every_pair(case: tuple[tuple[PlannedTransfer, ...], int]) -> None:
    copies, n = case
    expected = []
    for x in copies:  # every other copy into overlapping bytes of the block bounds it
        back = n
        for u in copies:
            if (u is not x and u.block == x.block and u.offset < x.offset + x.bytes
                    and x.offset < u.offset + u.bytes):  # fmt: skip
                back = min(back, (x.trap - u.release_after) % n or n)
        expected.append((x.trap - (back - 1)) % n)
    assert early_issue_points(copies, n) == expected
