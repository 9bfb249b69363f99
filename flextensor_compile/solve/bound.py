"""The staging bound: a provable lower bound on the predicted makespan of any plan for a problem.

Owns: the arithmetic of the bound (memory mode: what every plan must stream, given that a trap's
streamed tensors share the device with everything resident while it computes, and what the one
serial copy engine needs to move them); the per-trap tables of achievable streamed sizes it
scans, kept small (rounded sizes, merged candidates) in ways that only weaken the bound.
Must not know: strategies, blocks, schedules, the simulator, torch, files, the clock.

Argument (counted bytes throughout). A plan streams S bytes per iteration, s_i of them for trap
i (a subset sum of its items). While trap i computes its streamed tensors are on the device with
everything resident, so budget >= total - S + s_i + reserve: S >= D + m with D = total + reserve
- budget and m = max_i s_i; and S <= sum_i cap_i(m), cap_i(m) the largest subset sum of trap i
that is <= m. The copy engine is serial, every copy is at most one trap's packed bytes, and a
copy of x bytes takes at least x times the least per-byte copy time of any size up to the
largest copy, so the makespan is at least (D + m) times that. The bound is the least of this
over every m some plan could have, and at least the total compute.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.solve.problem import Problem, TrapSpec
from flextensor_runtime.errors import ConfigError

__all__ = [
    "MAX_ALL_SUMS",
    "MAX_CANDIDATES",
    "MAX_TABLE_SUMS",
    "StagingBound",
    "copies_are_subadditive",
    "staging_bound",
    "staging_bound_ms",
]

MAX_TABLE_SUMS = 1 << 14  # a trap's table of sizes is rounded to a grid beyond this many sums
MAX_ALL_SUMS = 1 << 16  # all distinct traps' tables together (each keeps at least 256 sums)
MAX_CANDIDATES = 1 << 12  # beyond this many, neighbouring candidates for m are merged
_ROUNDING = 1 + 1e-12  # float slack when comparing per-byte copy times


@dataclass(frozen=True)
class StagingBound:
    """The bound and its parts. `bound_ms` is `inf` when no plan can fit the budget."""

    bound_ms: float
    compute_ms: float
    simple_ms: float  # copy time of (total - budget); 0 when copies are not subadditive
    staging_ms: float  # min over feasible m of (D + m) x least per-byte copy time (0: D <= 0)
    deficit_bytes: int  # D = total + reserve - budget
    max_trap_bytes: int  # the m that attains `staging_ms` (lower end when rounded; 0: none)
    exact: bool  # False when a trap's table was rounded to a grid or candidates were merged


@dataclass(frozen=True)
class _Table:
    """Achievable streamed sizes of one trap, scaled: a subset with counted bytes x has
    `grid * y <= x <= grid * y + pad_bytes` for the entry y of its scaled sum."""

    scaled: tuple[int, ...]  # sorted distinct sums of floor(bytes / grid)
    grid: int
    pad_bytes: int  # the most rounding can lose: (grid - 1) x the trap's item count

    def cap(self, m: int) -> int:
        """At least the largest subset sum <= m (exact when `grid == 1`)."""
        k = bisect_right(self.scaled, m // self.grid) - 1
        return min(m, self.grid * self.scaled[k] + self.pad_bytes)


def _subset_sums(sizes: list[int], limit: int) -> list[int] | None:
    sums = {0}
    for b in sorted(sizes, reverse=True):
        sums |= {s + b for s in sums}
        if len(sums) > limit:
            return None
    return sorted(sums)


def _table(sizes: tuple[int, ...], limit: int) -> _Table:
    exact = _subset_sums(list(sizes), limit)
    if exact is not None:
        return _Table(tuple(exact), 1, 0)
    grid = -(-sum(sizes) // limit)
    scaled = _subset_sums([b // grid for b in sizes], limit + len(sizes) + 1)
    assert scaled is not None  # every scaled sum is an integer in [0, sum / grid]
    return _Table(tuple(scaled), grid, (grid - 1) * len(sizes))


def _per_byte_ms(bw: BandwidthModel, largest_bytes: int) -> float:
    """Least ms per byte of one copy of at most `largest_bytes`. Copy time is the latency (>= 0)
    plus a curve linear between knots, so on each piece time/bytes is monotone: its least value
    is at a knot or at `largest_bytes` (at 0 the ratio is largest)."""
    sizes = [largest_bytes] + [b for b, _ in bw.points if b <= largest_bytes]
    return min(bw.copy_ms(x) / x for x in sizes)


def copies_are_subadditive(bw: BandwidthModel) -> bool:
    """Whether time per byte never rises with copy size, so one copy of a + b bytes is no slower
    than two of a and b (then the copy time of all streamed bytes bounds the plan too)."""
    if bw.latency_ms < 0:
        return False
    if not bw.points:
        return True
    ratios = [bw.copy_ms(b) / b for b, _ in bw.points]
    falling = all(x * _ROUNDING >= y for x, y in pairwise(ratios))
    last_b = bw.points[-1][0]  # beyond the last knot the ratio falls iff the line's intercept >= 0
    return falling and bw.copy_ms(last_b) * bw.tail_bytes_per_ms * _ROUNDING >= last_b


def _trap_tables(traps: tuple[TrapSpec, ...], limit: int) -> list[tuple[_Table, int, int]]:
    """(table, how many traps share it, the trap's alignment padding), identical traps once."""
    counts = Counter(tuple(sorted(it.bytes for it in t.items)) for t in traps if t.items)
    pads = {
        tuple(sorted(it.bytes for it in t.items)): sum(it.slot_bytes - it.bytes for it in t.items)
        for t in traps
    }
    limit = min(limit, max(256, MAX_ALL_SUMS // max(1, len(counts))))
    return [(_table(sizes, limit), n, pads[sizes]) for sizes, n in sorted(counts.items())]


def _candidates(
    tables: list[tuple[_Table, int, int]], most: int
) -> tuple[list[tuple[int, int]], bool]:
    """Ranges [lo, hi] that together hold every m a plan could have (one per achievable size
    of each trap; neighbours merged beyond `most`), sorted by lo; and whether none was merged."""
    ranges = sorted({(t.grid * y, t.grid * y + t.pad_bytes)
                     for t, _, _ in tables for y in t.scaled
                     if t.grid * y + t.pad_bytes > 0})  # fmt: skip
    if len(ranges) <= most:
        return ranges, True
    step = -(-len(ranges) // most)
    chunks = (ranges[k : k + step] for k in range(0, len(ranges), step))
    return [(chunk[0][0], max(hi for _, hi in chunk)) for chunk in chunks], False


def _staging_ms(problem: Problem, deficit: int, limit: int, most: int) -> tuple[float, int, bool]:
    """(least (D + m) x per-byte time over every m a plan could have, that m, exact tables)."""
    tables = _trap_tables(problem.traps, limit)
    align_pad = max((pad for _, _, pad in tables), default=0)
    ranges, alone = _candidates(tables, most)
    bw = problem.bandwidth
    top = max((hi for _, hi in ranges), default=0) + align_pad
    floor_per_byte = _per_byte_ms(bw, top) if top else 0.0
    best, best_m = math.inf, 0
    for lo, hi in ranges:  # a plan's m in [lo, hi]: caps at most cap(hi), its value at least:
        if (deficit + lo) * floor_per_byte >= best:
            break  # every later candidate is at least this large
        if sum(n * t.cap(hi) for t, n, _ in tables) < deficit + lo:
            continue  # no plan whose largest trap streams this much fits the budget
        value = (deficit + lo) * _per_byte_ms(bw, hi + align_pad)
        if value < best:
            best, best_m = value, lo
    return best, best_m, alone and all(t.grid == 1 for t, _, _ in tables)


def staging_bound(
    problem: Problem, max_table_sums: int = MAX_TABLE_SUMS, max_candidates: int = MAX_CANDIDATES
) -> StagingBound:
    """The staging bound with its parts; latency mode (no budget): the total compute. A trap
    with more than `max_table_sums` distinct streamed sizes (fewer when many traps differ: see
    `MAX_ALL_SUMS`) gets a rounded table, and beyond `max_candidates` sizes neighbouring ones
    are merged: each gives a weaker, still valid bound."""
    for name, value in (("max_table_sums", max_table_sums), ("max_candidates", max_candidates)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}; pass 1 or more")
    compute = problem.compute_ms
    if problem.budget_bytes is None:
        return StagingBound(compute, compute, 0.0, 0.0, 0, 0, True)
    bw = problem.bandwidth
    simple = 0.0
    if copies_are_subadditive(bw):
        simple = bw.copy_ms(max(0, problem.total_bytes - problem.budget_bytes))
    deficit = problem.total_bytes + problem.reserve_bytes - problem.budget_bytes
    if deficit <= 0 or bw.latency_ms < 0:  # a negative latency breaks the per-byte argument
        return StagingBound(max(compute, simple), compute, simple, 0.0, deficit, 0, True)
    staging, m, exact = _staging_ms(problem, deficit, max_table_sums, max_candidates)
    return StagingBound(max(compute, simple, staging), compute, simple, staging, deficit, m, exact)


def staging_bound_ms(problem: Problem) -> float:
    """No plan for `problem` has a predicted makespan below this (`inf`: no plan fits)."""
    return staging_bound(problem).bound_ms
