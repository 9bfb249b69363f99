"""Subset sums of one trap's streamable items: the knapsack kernel every strategy uses.

Owns: the table of the achievable packed sizes of a trap's items (sorted, with one
deterministic subset per size, rebuilt on first use: a solve asks for few of them), and "the
largest subset whose packed size fits a cap" / "the smallest that reaches a need".
Because a copy's time grows with its bytes, "most bytes within a time window" is the same query
with the cap converted by the bandwidth model.

Exact (every distinct sum) while a trap has at most `MAX_SUMS` distinct sums (always for up to
12 items); the subset of a sum is then the one the first items reach it with (sum s gets the
subset of s - size_k plus item k, k the first item with which s is achievable). Beyond that the
table is thinned, with this guarantee: for every achievable sum y the table holds sums a <= y <= b
with y - a < step and b - a <= step, step <= total / `MAX_SUMS` bytes. So `best_within(cap)` is
less than total / `MAX_SUMS` below the largest achievable sum <= cap, and `best_at_least(need)`
at most that above the smallest achievable sum >= need (there is one: the total). A thinned
table keeps, per bucket of `step` bytes, its least achievable sum and its greatest (unless the
next unit is achievable), computed on bit sets (`bitsums`); traps whose sums need too many bits
for that (`MAX_BITS`) are thinned the same way item by item on a dict, slower but with the same
guarantee (bucket thinning keeps a <= y <= b, b - a <= step, for every y, so it never adds up).
Must not know: time, blocks, plans.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from flextensor_compile.solve.bitsums import Chunks, bits_needed, representatives, set_bits

__all__ = ["MAX_BITS", "MAX_SUMS", "SubsetTable", "union_of_sums"]

MAX_SUMS = 4096
MAX_BITS = 1 << 28  # bit sets (32 MiB) a thinned table may hold; beyond, it is thinned on a dict


@dataclass(frozen=True)
class SubsetTable:
    """Sorted achievable sums and, on demand, one subset (item indexes, ascending) for each."""

    sums: tuple[int, ...]
    exact: bool  # every achievable sum is in `sums`
    rebuild: Callable[[int], tuple[int, ...]] = field(repr=False, compare=False)  # sum -> subset
    bits: int = field(
        default=0, repr=False, compare=False
    )  # `sums` as a bit set in units (0: none)
    unit: int = field(default=1, repr=False, compare=False)  # bytes per bit of `bits`
    _subsets: dict[int, tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @staticmethod
    def build(
        sizes: tuple[int, ...], max_sums: int = MAX_SUMS, max_bits: int = MAX_BITS
    ) -> SubsetTable:
        """The table of `sizes`: exact up to `max_sums` distinct sums, else thinned to steps of
        at most total / `max_sums` (on bit sets while they take at most `max_bits` bits)."""
        unit = math.gcd(*sizes)
        if not unit:  # no items, or only empty ones
            return SubsetTable((0,), True, lambda _: ())
        if math.prod(n + 1 for n in Counter(sizes).values()) <= max_sums:
            return _exact(sizes, _first_items(sizes, max_sums))
        units = tuple(s // unit for s in sizes)
        top = sum(units)
        if bits_needed(len(units), top) <= max_bits:
            chunks = Chunks.build(units)
            if chunks.reach.bit_count() <= max_sums:
                return _exact(sizes, _first_items(sizes, max_sums))
            return _thinned_bits(chunks, unit, max(1, top // max_sums))
        first = _first_items(sizes, max_sums)
        if first is not None:
            return _exact(sizes, first)
        return _thinned_dict(sizes, max(1, sum(sizes) // max_sums), max_sums)

    def subset(self, k: int) -> tuple[int, ...]:
        """Item indexes (ascending) of one subset whose sizes sum to `sums[k]`."""
        got = self._subsets.get(k)
        if got is None:
            got = self._subsets[k] = self.rebuild(self.sums[k])
        return got

    def best_within(self, cap: float) -> int:
        """Index into `sums` of the largest sum <= cap (0 = the empty subset). Sums are integers,
        so a cap is searched as its integer part (a float's comparisons with ints cost more)."""
        sums = self.sums
        if not cap < sums[-1]:  # also NaN, as the search would
            return len(sums) - 1
        return 0 if cap < 0 else bisect_right(sums, int(cap)) - 1

    def best_at_least(self, need: float) -> int:
        """Index of the smallest sum >= need (the largest sum if none reaches it)."""
        k = bisect_right(self.sums, need - 1)
        return min(k, len(self.sums) - 1)


def union_of_sums(tables: Iterable[SubsetTable]) -> list[int]:
    """The sorted distinct sums of all `tables` (each distinct table once; thinned tables of one
    unit merged as bit sets, which is much faster than a set of thousands of sums each)."""
    merged: dict[int, int] = {}  # unit -> the union of those tables' bit sets
    loose: set[int] = set()
    for table in {id(t): t for t in tables}.values():
        if table.bits:
            merged[table.unit] = merged.get(table.unit, 0) | table.bits
        else:
            loose.update(table.sums)
    if not loose and len(merged) == 1:
        ((unit, bits),) = merged.items()
        return list(set_bits(bits, unit))
    return sorted(loose.union(*(set_bits(bits, unit) for unit, bits in merged.items())))


def _first_items(sizes: tuple[int, ...], most: int) -> dict[int, int] | None:
    """Achievable sum -> the first item k with which it is achievable (-1 for 0); None once
    there are more than `most` sums."""
    first = {0: -1}
    for k, size in enumerate(sizes):
        grown = {s + size: k for s in first}
        grown.update(first)  # sums reached before item k keep their first item
        first = grown
        if len(first) > most:
            return None
    return first


def _exact(sizes: tuple[int, ...], first: dict[int, int] | None) -> SubsetTable:
    assert first is not None  # the caller counted at most `max_sums` sums

    def rebuild(total: int) -> tuple[int, ...]:
        picked = []
        while total:
            k = first[total]
            picked.append(k)
            total -= sizes[k]
        return tuple(reversed(picked))

    return SubsetTable(tuple(sorted(first)), True, rebuild)


def _thinned_bits(chunks: Chunks, unit: int, step: int) -> SubsetTable:
    """The thinned table from the bit set of every sum (`step` in units)."""
    kept = representatives(chunks.reach, sum(chunks.units), step)
    rebuild = partial(_rebuild_units, chunks, unit)
    return SubsetTable(set_bits(kept, unit), step == 1, rebuild, kept, unit)


def _rebuild_units(chunks: Chunks, unit: int, total: int) -> tuple[int, ...]:
    return chunks.subset(total // unit)


def _thinned_dict(sizes: tuple[int, ...], step: int, most: int) -> SubsetTable:
    """The thinned table built item by item on a dict of sum -> subset (`step` in bytes),
    thinned whenever it holds more than `most` sums."""
    table: dict[int, tuple[int, ...]] = {0: ()}
    for k, size in enumerate(sizes):
        grown = {s + size: (*subset, k) for s, subset in table.items()}
        grown.update(table)
        table = _bucket_ends(grown, step) if len(grown) > most else grown
    sums = tuple(sorted(table))
    return SubsetTable(sums, step == 1, table.__getitem__)


def _bucket_ends(table: dict[int, tuple[int, ...]], step: int) -> dict[int, tuple[int, ...]]:
    """The least and the greatest sum of each bucket of `step` bytes."""
    ends: dict[int, list[int]] = {}
    for s in table:
        got = ends.setdefault(s // step, [s, s])
        got[0], got[1] = min(got[0], s), max(got[1], s)
    return {s: table[s] for lo, hi in ends.values() for s in (lo, hi)}
