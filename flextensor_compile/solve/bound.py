"""The staging bound: a provable lower bound on the predicted makespan of any plan for a problem.

Owns: the arithmetic of the bound (memory mode: what every plan must stream, given that a trap's
streamed tensors share the device with everything resident while it computes, and what the one
serial copy engine needs to move them, also while traps compute); the per-trap tables of
achievable streamed sizes it scans, kept small (rounded sizes, merged candidates), and the
ranges of staging sizes it values, in ways that only weaken the bound.
Must not know: strategies, blocks, schedules, the simulator, torch, files, the clock.

Argument (counted bytes throughout). A plan streams S bytes per iteration, s_i of them for trap
i (a subset sum of its items). While trap i computes its streamed tensors are on the device with
everything resident, so budget >= total - S + s_i + reserve: S >= D + m with D = total + reserve
- budget and m = max_i s_i; and S <= sum_i cap_i(m), cap_i(m) the largest subset sum of trap i
that is <= m. The copy engine is serial, every copy is at most one trap's packed bytes, and a
copy of x bytes takes at least x times the least per-byte copy time of any size up to the
largest copy, so the makespan is at least (D + m) times that. The bound is the least of this
over every m some plan could have, and at least the total compute.

The overlap term adds that copies overlap compute. Let R = S - D: blocks take at most R bytes
(peak = total - S + blocks + reserve <= budget), so no copy is larger. While trap i computes it
holds its s_i bytes, and every copy running then found its whole destination free when it
started and fills it for a later trap, so those copies move at most R - s_i bytes. Let q be the
least per-byte time of a copy up to R: each copy takes q x its bytes plus some e_k >= 0. Split
over the traps its time overlaps, the engine is busy at most q (R - s_i) + E_i during trap i
(sum E_i <= sum e_k) and idle the rest of it, so makespan >= q S + sum_i max(0, c_i - q (R -
s_i)), c_i the trap's compute. Least over real s_i in [0, min(total_i, R)] summing to S:
max(0, c_i - q R) is paid anyway, trap i streams u_i = max(0, R - c_i / q) bytes at no further
cost, and each byte beyond F = sum_i min(total_i, u_i) costs q. The term is the least of
q S + sum_i max(0, c_i - q R) + q max(0, S - F) over every R with sum_i min(total_i, R) >= S =
D + R; a range [a, b] of R is valued with q(b) (valid for every copy up to b bytes), S at R = a
and the rest at R = b (F grows with R, the idle paid anyway shrinks): at most every R's value.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from heapq import heapify, heappop, heappush
from itertools import accumulate, chain, compress, pairwise, repeat
from operator import add, floordiv, mod, mul, ne

from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.solve.bitsums import all_sums, set_bits
from flextensor_compile.solve.problem import Problem, TrapSpec
from flextensor_runtime.errors import ConfigError

__all__ = [
    "MAX_ALL_SUMS",
    "MAX_CANDIDATES",
    "MAX_OVERLAP_RANGES",
    "MAX_TABLE_SUMS",
    "StagingBound",
    "copies_are_subadditive",
    "staging_bound",
    "staging_bound_ms",
    "staging_trap_bytes",
]

MAX_TABLE_SUMS = 1 << 14  # a trap's table of sizes is rounded to a grid beyond this many sums
MAX_ALL_SUMS = 1 << 16  # all distinct traps' tables together (each keeps at least 256 sums)
MAX_CANDIDATES = 1 << 12  # beyond this many, neighbouring candidates for m are merged
MAX_OVERLAP_RANGES = 1 << 12  # ranges of R the overlap term values (fewer: a weaker bound)
_FIRST_RATIO = 1.01  # b / a of the first ranges of R the overlap term values
_SPLIT = 8  # the range of R with the least value is cut into this many
_GAP = 1e-5  # ... until the value at some R is within this fraction of the least
_ROUNDING = 1 + 1e-12  # float slack when comparing per-byte copy times
_BITSET_WORK = 1 << 28  # items x bits of the largest subset-sum bit set worth shifting


@dataclass(frozen=True)
class StagingBound:
    """The bound and its parts. `bound_ms` is `inf` when no plan can fit the budget."""

    bound_ms: float
    compute_ms: float
    simple_ms: float  # copy time of (total - budget); 0 when copies are not subadditive
    staging_ms: float  # min over feasible m of (D + m) x least per-byte copy time (0: D <= 0)
    overlap_ms: float  # min over feasible R of copy time plus idle forced by compute (0: D <= 0)
    deficit_bytes: int  # D = total + reserve - budget
    max_trap_bytes: int  # the m that attains `staging_ms` (lower end when rounded; 0: none)
    exact: bool  # staging term: False when a table was rounded or candidates were merged


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
    """Sorted distinct subset sums of `sizes`, or None when there are more than `limit`: on a
    bit set when there may be many and its shifts are cheap enough, else on a set."""
    unit = math.gcd(*sizes)
    few = math.prod(n + 1 for n in Counter(sizes).values()) <= limit
    if unit and not few and len(sizes) * (sum(sizes) // unit) <= _BITSET_WORK:
        reach = all_sums(s // unit for s in sizes)
        return None if reach.bit_count() > limit else list(set_bits(reach, unit))
    sums, fresh, last = {0}, {0}, -1  # `fresh`: the sums the item before reached first
    for b in sorted(sizes, reverse=True):  # equal sizes in a row: only `fresh` reaches new sums
        fresh = {s + b for s in (fresh if b == last else sums)} - sums
        sums |= fresh
        last = b
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


def _per_byte_within(bw: BandwidthModel) -> Callable[[int], float]:
    """`_per_byte_ms` with the knots' ratios and their running least computed once (the same
    ratios, so the same least)."""
    knots = [b for b, _ in bw.points]  # ascending
    least = list(accumulate((bw.copy_ms(b) / b for b in knots), min))

    def per_byte(largest_bytes: int) -> float:
        k = bisect_right(knots, largest_bytes)
        own = bw.copy_ms(largest_bytes) / largest_bytes
        return min(own, least[k - 1]) if k else own

    return per_byte


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
    scale = max((t.pad_bytes for t, _, _ in tables), default=0) + 1
    keys: list[int] = []  # lo x scale + (hi - lo): sorts as (lo, hi) does, but faster
    for t, _, _ in tables:  # each table's keys ascend: the sort merges runs
        keys.extend(map(add, map(mul, t.scaled, repeat(t.grid * scale)), repeat(t.pad_bytes)))
    keys.sort()
    ordered = list(compress(keys, map(ne, keys, chain((None,), keys))))  # distinct, ascending
    if ordered and not ordered[0]:
        del ordered[0]  # a trap that streams nothing
    if len(ordered) <= most:
        los = list(map(floordiv, ordered, repeat(scale)))
        his = list(map(add, los, map(mod, ordered, repeat(scale))))
        return list(zip(los, his, strict=True)), True
    step = -(-len(ordered) // most)
    his = list(map(add, map(floordiv, ordered, repeat(scale)), map(mod, ordered, repeat(scale))))
    los = list(map(floordiv, ordered[::step], repeat(scale)))  # only each merged range's first
    whole = len(his) // step  # merged ranges of `step` candidates: the largest hi of each
    tops = list(map(max, *[his[k : whole * step : step] for k in range(step)]))
    if whole < len(los):  # the last range, shorter
        tops.append(max(his[whole * step :]))
    return list(zip(los, tops, strict=True)), False


def _staging_ms(problem: Problem, deficit: int, limit: int, most: int) -> tuple[float, int, bool]:
    """(least (D + m) x per-byte time over every m a plan could have, that m, exact tables)."""
    tables = _trap_tables(problem.traps, limit)
    align_pad = max((pad for _, _, pad in tables), default=0)
    ranges, alone = _candidates(tables, most)
    bw = problem.bandwidth
    top = max((hi for _, hi in ranges), default=0) + align_pad
    floor_per_byte = _per_byte_ms(bw, top) if top else 0.0
    most_within, per_byte = _most_within(tables), _per_byte_within(bw)
    best, best_m = math.inf, 0
    for lo, hi in ranges:  # a plan's m in [lo, hi]: caps at most cap(hi), its value at least:
        if (deficit + lo) * floor_per_byte >= best:
            break  # every later candidate is at least this large
        if most_within(hi) < deficit + lo:
            continue  # not even every trap's largest sum within hi could fit the budget
        value = (deficit + lo) * per_byte(hi + align_pad)
        if value >= best:
            continue
        if sum(n * t.cap(hi) for t, n, _ in tables) < deficit + lo:
            continue  # no plan whose largest trap streams this much fits the budget
        best, best_m = value, lo
    return best, best_m, alone and all(t.grid == 1 for t, _, _ in tables)


def _most_within(tables: list[tuple[_Table, int, int]]) -> Callable[[int], int]:
    """m -> an upper bound on sum_i n_i cap_i(m) (each trap's cap is at most m and at most its
    table's largest value), in one binary search: a cheap test before the exact sum."""
    tops = sorted((t.grid * t.scaled[-1] + t.pad_bytes, n) for t, n, _ in tables)
    below = [0, *accumulate(top * n for top, n in tops)]  # traps whose top is under m: their top
    above = [*accumulate((n for _, n in reversed(tops)), initial=0)][::-1]  # the rest: m each
    keys = [top for top, _ in tops]

    def most(m: int) -> int:
        k = bisect_right(keys, m)
        return below[k] + m * above[k]

    return most


def _staging_range(totals: list[int], deficit: int) -> tuple[int, int] | None:
    """Least and greatest R with sum_i min(total_i, R) - R >= D (None: no R). The left side is
    concave (slope: traps with total_i > R, less 1), largest from the second-largest total on,
    and equals sum_i total_i - R beyond the largest, so the set is an interval."""
    top = sorted(totals, reverse=True)
    second = top[1] if len(top) > 1 else 0
    if sum(min(t, second) for t in totals) - second < deficit:
        return None
    lo, hi = 0, second  # the left side rises on [0, second]: bisect for its first R >= D
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(t, mid) for t in totals) - mid >= deficit:
            hi = mid
        else:
            lo = mid + 1
    return lo, sum(totals) - deficit


def _overlap_value(
    traps: Counter[tuple[int, float]], bw: BandwidthModel, deficit: int, a: int, b: int
) -> float:
    """At most the makespan of any plan whose R is in [a, b]: every copy is at most b bytes, so
    q = q(b) holds for all; with q fixed, S = D + R is at least D + a, F only grows with R and
    the idle paid anyway only shrinks, so both are taken at R = b."""
    q = _per_byte_ms(bw, b)
    free, idle = 0.0, 0.0
    for (total, compute), n in traps.items():
        free += n * min(total, max(0.0, b - compute / q))
        idle += n * max(0.0, compute - q * b)
    streamed = deficit + a
    return q * streamed + idle + q * max(0.0, streamed - free)


def _first_ranges(
    value: Callable[[int, int], float], floor_ms: float, deficit: int, lo: int, hi: int, most: int
) -> list[tuple[float, int, int]]:
    """(value, a, b) of ranges covering [lo, hi], b / a near `_FIRST_RATIO`; once q(hi) x
    (D + a) is no less than the least value so far (or `most` ranges are reached), the rest is
    one range valued that: every plan with R in it has at least that copy time."""
    ratio = max(_FIRST_RATIO, (hi / lo) ** (1 / most))
    ranges: list[tuple[float, int, int]] = []
    best, a = math.inf, lo
    while True:
        if (deficit + a) * floor_ms >= best or len(ranges) == most - 1:
            ranges.append(((deficit + a) * floor_ms, a, hi))
            return ranges
        b = min(hi, max(a + 1, math.ceil(a * ratio)))
        ranges.append((value(a, b), a, b))
        best = min(best, ranges[-1][0])
        if b >= hi:
            return ranges
        a = b


def _overlap_ms(problem: Problem, deficit: int, most: int) -> float:
    """Least over every R of the overlap argument's value, best first: the range of R with the
    least value is cut in `_SPLIT` (each part keeps the larger of its own and its range's value,
    both valid) until the value at some R (R = a = b) is within `_GAP` of it or `most` ranges
    were valued."""
    totals = [sum(it.bytes for it in t.items) for t in problem.traps]
    span = _staging_range(totals, deficit)
    if span is None:
        return math.inf
    lo, hi = span
    traps = Counter((total, t.compute_ms) for total, t in zip(totals, problem.traps, strict=True))
    bw = problem.bandwidth
    value = partial(_overlap_value, traps, bw, deficit)
    heap = _first_ranges(value, _per_byte_ms(bw, hi), deficit, lo, hi, most)
    heapify(heap)
    valued, attained = len(heap), math.inf
    while True:
        least, a, b = heap[0]  # every R lies in some range: none has a value below this
        attained = min(attained, value(a, a))  # the least is at most this
        if attained <= least * (1 + _GAP) or valued + _SPLIT > most:
            return least  # (a range of one R always stops here)
        heappop(heap)
        cuts = sorted({a + (b - a) * k // _SPLIT for k in range(_SPLIT + 1)})
        parts = [(a, a), (b, b)] if b - a == 1 else list(pairwise(cuts))
        for x, y in parts:
            heappush(heap, (max(least, value(x, y)), x, y))
        valued += len(parts) + 1


def staging_bound(
    problem: Problem,
    max_table_sums: int = MAX_TABLE_SUMS,
    max_candidates: int = MAX_CANDIDATES,
    max_overlap_ranges: int = MAX_OVERLAP_RANGES,
) -> StagingBound:
    """The bound with its parts; latency mode (no budget): the total compute. A trap with more
    than `max_table_sums` distinct streamed sizes (fewer when many traps differ: see
    `MAX_ALL_SUMS`) gets a rounded table, beyond `max_candidates` sizes neighbouring ones are
    merged, and the overlap term values at most `max_overlap_ranges` ranges of R: each gives a
    weaker, still valid bound."""
    limits = (("max_table_sums", max_table_sums), ("max_candidates", max_candidates),
              ("max_overlap_ranges", max_overlap_ranges))  # fmt: skip
    for name, value in limits:
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}; pass 1 or more")
    compute = problem.compute_ms
    if problem.budget_bytes is None:
        return StagingBound(compute, compute, 0.0, 0.0, 0.0, 0, 0, True)
    bw = problem.bandwidth
    simple = 0.0
    if copies_are_subadditive(bw):
        simple = bw.copy_ms(max(0, problem.total_bytes - problem.budget_bytes))
    deficit = problem.total_bytes + problem.reserve_bytes - problem.budget_bytes
    if deficit <= 0 or bw.latency_ms < 0:  # a negative latency breaks the per-byte argument
        return StagingBound(max(compute, simple), compute, simple, 0.0, 0.0, deficit, 0, True)
    staging, m, exact = _staging_ms(problem, deficit, max_table_sums, max_candidates)
    overlap = _overlap_ms(problem, deficit, max_overlap_ranges)
    bound = max(compute, simple, staging, overlap)
    return StagingBound(bound, compute, simple, staging, overlap, deficit, m, exact)


def staging_trap_bytes(problem: Problem) -> int:
    """The largest trap transfer m (counted bytes) at which the staging term is least: streaming
    the deficit plus m in copies of at most m costs least per byte there (0: nothing must
    stream, latency mode, or no plan fits)."""
    deficit = problem.total_bytes + problem.reserve_bytes - (problem.budget_bytes or 0)
    if problem.budget_bytes is None or deficit <= 0 or problem.bandwidth.latency_ms < 0:
        return 0
    return _staging_ms(problem, deficit, MAX_TABLE_SUMS, MAX_CANDIDATES)[1]


def staging_bound_ms(problem: Problem) -> float:
    """No plan for `problem` has a predicted makespan below this (`inf`: no plan fits)."""
    return staging_bound(problem).bound_ms
