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
next unit is achievable), computed on bit sets (`bitsums`), and kept as the bit set: a solve's
queries by sum (`within`, `at_least`, `after`, `subset_of`) read the bits, and the sums are
listed only when asked for (`sums`, which indexes refer to); traps whose sums need too many bits
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
from functools import cached_property, partial

from flextensor_compile.solve.bitsums import Chunks, bits_needed, representatives, set_bits

__all__ = ["MAX_BITS", "MAX_SUMS", "SubsetTable", "union_of_sums"]

MAX_SUMS = 4096
MAX_BITS = 1 << 28  # bit sets (32 MiB) a thinned table may hold; beyond, it is thinned on a dict
_NONZERO = bytes([0] + [1] * 255)  # byte -> 1 where it is not zero


@dataclass(frozen=True)
class SubsetTable:
    """Sorted achievable sums and, on demand, one subset (item indexes, ascending) for each.
    A table thinned on bit sets keeps its sums as the bit set and lists them only when asked
    (`sums`): a solve's queries (`within`, `at_least`, `after`, `subset_of`) read the bits."""

    exact: bool  # every achievable sum is in `sums`
    rebuild: Callable[[int], tuple[int, ...]] = field(repr=False, compare=False)  # sum -> subset
    bits: int = field(default=0, repr=False)  # the sums as a bit set in units (0: `listed`)
    unit: int = field(default=1, repr=False)  # bytes per bit of `bits`
    listed: tuple[int, ...] = ()  # the sorted sums, where there is no bit set
    _subsets: dict[int, tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # sum -> its subset

    @staticmethod
    def build(
        sizes: tuple[int, ...], max_sums: int = MAX_SUMS, max_bits: int = MAX_BITS
    ) -> SubsetTable:
        """The table of `sizes`: exact up to `max_sums` distinct sums, else thinned to steps of
        at most total / `max_sums` (on bit sets while they take at most `max_bits` bits)."""
        unit = math.gcd(*sizes)
        if not unit:  # no items, or only empty ones
            return SubsetTable(True, lambda _: (), listed=(0,))
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

    @cached_property
    def sums(self) -> tuple[int, ...]:
        """Every sum the table holds, ascending (listed from the bit set on first use)."""
        return set_bits(self.bits, self.unit) if self.bits else self.listed

    @cached_property
    def top(self) -> int:
        """The largest sum (every item)."""
        return (self.bits.bit_length() - 1) * self.unit if self.bits else self.listed[-1]

    @cached_property
    def _bytes(self) -> tuple[bytes, bytes]:
        """`bits` as little-endian bytes, and per byte 1 where it is not zero (for `find`)."""
        raw = self.bits.to_bytes((self.bits.bit_length() + 7) // 8, "little")
        return raw, raw.translate(_NONZERO)

    def subset(self, k: int) -> tuple[int, ...]:
        """Item indexes (ascending) of one subset whose sizes sum to `sums[k]`."""
        return self.subset_of(self.sums[k])

    def subset_of(self, total: int) -> tuple[int, ...]:
        """Item indexes (ascending) of one subset whose sizes sum to `total`, a sum of the
        table."""
        got = self._subsets.get(total)
        if got is None:
            got = self._subsets[total] = self.rebuild(total)
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

    def within(self, cap: float) -> int:
        """The largest sum <= cap (0: the empty subset): `sums[best_within(cap)]`."""
        top = self.top
        if not cap < top:  # also NaN
            return top
        if cap < 0:
            return 0
        if not self.bits:
            listed = self.listed
            return listed[bisect_right(listed, int(cap)) - 1]
        c = int(cap) // self.unit  # the largest set bit at most c (bit 0, the empty subset, is)
        raw, nonzero = self._bytes
        i = c >> 3
        low = raw[i] & ((2 << (c & 7)) - 1)
        if not low:
            i = nonzero.rfind(1, 0, i)
            low = raw[i]
        return ((i << 3) + low.bit_length() - 1) * self.unit

    def at_least(self, need: int) -> int:
        """The smallest sum >= need (the largest if none reaches it): `sums[best_at_least(need)]`."""
        if not need <= self.top:  # none reaches it
            return self.top
        if not self.bits:
            return self.listed[self.best_at_least(need)]
        return self._first_from(max(0, -(-need // self.unit)))  # (the top reaches `need`)

    def after(self, total: int) -> int | None:
        """The smallest sum above `total` (None: none is)."""
        if not self.bits:
            k = bisect_right(self.listed, total)
            return self.listed[k] if k < len(self.listed) else None
        return self._first_from(total // self.unit + 1) if total < self.top else None

    def _first_from(self, c: int) -> int:
        """The smallest sum of at least `c` units (one is: c is at most the top's): the byte
        holding bit c, else the first nonzero byte above it."""
        raw, nonzero = self._bytes
        i = c >> 3
        high = raw[i] >> (c & 7) << (c & 7)
        if not high:
            i = nonzero.find(1, i + 1)
            high = raw[i]
        return ((i << 3) + (high & -high).bit_length() - 1) * self.unit


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
    fresh, last = [0], -1  # the sums item k - 1 reached first, and its size
    for k, size in enumerate(sizes):
        # after an item of the same size only the sums it reached first can reach new ones
        # (any other sum plus `size` was reached with that item already)
        fresh = [x for s in (fresh if size == last else first) if (x := s + size) not in first]
        first.update(dict.fromkeys(fresh, k))  # sums reached before item k keep their item
        last = size
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

    return SubsetTable(True, rebuild, listed=tuple(sorted(first)))


def _thinned_bits(chunks: Chunks, unit: int, step: int) -> SubsetTable:
    """The thinned table from the bit set of every sum (`step` in units)."""
    kept = representatives(chunks.reach, sum(chunks.units), step)
    rebuild = partial(_rebuild_units, chunks, unit)
    return SubsetTable(step == 1, rebuild, kept, unit)


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
    return SubsetTable(step == 1, table.__getitem__, listed=tuple(sorted(table)))


def _bucket_ends(table: dict[int, tuple[int, ...]], step: int) -> dict[int, tuple[int, ...]]:
    """The least and the greatest sum of each bucket of `step` bytes."""
    ends: dict[int, list[int]] = {}
    for s in table:
        got = ends.setdefault(s // step, [s, s])
        got[0], got[1] = min(got[0], s), max(got[1], s)
    return {s: table[s] for lo, hi in ends.values() for s in (lo, hi)}
