"""Subset sums as bit sets: how a trap with too many distinct sums gets its thinned table fast.

Owns: the set of every achievable sum as one integer (bit s set: sum s achievable, sizes in
units of their greatest common divisor), built with one shift-and-or per item; the thinned
representatives of that set (per bucket of `width` units its least sum, and its greatest unless
the next unit is achievable too); and rebuilding one subset for a given sum on demand, from the
sums reachable before each chunk of about sqrt(n) items and each chunk's own prefix sums (so
memory is about 2 sqrt(n) bit sets, not n).
Every step is a whole-integer operation, so the cost per item does not grow with the number of
sums in Python-level work.
Must not know: caps, traps, time, plans.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate, compress

__all__ = ["Chunks", "all_sums", "bits_needed", "representatives", "set_bits"]

_DENSE = 5  # `set_bits` masks every position once more than 1 in this many bits is set
_ZERO_ONE = bytes.maketrans(b"01", b"\x00\x01")  # "0"/"1" digits -> bytes 0/1


def all_sums(units: Iterable[int]) -> int:
    """The bit set of every subset sum of `units`."""
    reach = 1
    for u in units:
        reach |= reach << u
    return reach


def bits_needed(items: int, total_units: int) -> int:
    """Bits `Chunks.build` holds for `items` items summing to `total_units` units."""
    size = math.isqrt(max(0, items - 1)) + 1
    return (-(-items // size) + size + 2) * (total_units + 1)


@dataclass(frozen=True)
class Chunks:
    """Achievable sums of some items (in units), kept so one subset per sum can be rebuilt.

    Items are cut into consecutive chunks of about sqrt(n); for each chunk: the bit set of sums
    of the items before it, and its own prefix bit sets (sums of its first i items, i = 0..len;
    the last is every sum of the chunk)."""

    units: tuple[int, ...]
    starts: tuple[int, ...]  # first item of each chunk
    before: tuple[int, ...]  # per chunk: sums of the items before it
    prefixes: tuple[tuple[int, ...], ...]  # per chunk: sums of its first i items
    reach: int  # every achievable sum

    @staticmethod
    def build(units: tuple[int, ...]) -> Chunks:
        size = math.isqrt(max(0, len(units) - 1)) + 1
        starts = tuple(range(0, len(units), size))
        reach, before, prefixes = 1, [], []
        for start in starts:
            before.append(reach)
            local = [1]
            for u in units[start : start + size]:
                local.append(local[-1] | local[-1] << u)
                reach |= reach << u
            prefixes.append(tuple(local))
        return Chunks(units, starts, tuple(before), tuple(prefixes), reach)

    def subset(self, total: int) -> tuple[int, ...]:
        """Item indexes (ascending) of one subset summing to `total`, an achievable sum:
        per chunk from the last, its least share whose rest is reachable before it."""
        picked: list[int] = []  # descending
        units, starts, befores, chunks = self.units, self.starts, self.before, self.prefixes
        for j in range(len(starts) - 1, -1, -1):
            prefixes = chunks[j]
            own = prefixes[-1]  # every sum of the chunk
            width = own.bit_length() - 1
            # bit p: the rest, total - (width - p), is reachable before the chunk and the chunk
            # sums p, so also width - p (subset sums are symmetric: take the complement)
            lo = total - width
            fits = (befores[j] >> lo if lo >= 0 else befores[j] << -lo) & own
            assert fits, "the sum is not achievable"
            share = width + 1 - fits.bit_length()
            if not share:  # the chunk takes nothing
                continue
            total -= share
            start = starts[j]
            for i in range(len(prefixes) - 2, -1, -1):  # back through the chunk's own items
                if not prefixes[i] >> share & 1:  # item i is needed
                    picked.append(start + i)
                    share -= units[start + i]
                    if not share:
                        break
            assert share == 0
        picked.reverse()
        return tuple(picked)


def representatives(reach: int, top: int, width: int) -> int:
    """The thinned set (a bit set) of `reach`, whose sums lie in [0, top]: in each bucket of
    `width` units (starting at 0) its least sum, and its greatest unless the unit after it is
    achievable (then that is the next bucket's least). Every achievable y then has kept sums
    a <= y <= b with y - a < width and b - a <= width."""
    buckets = top // width + 1
    starts = _every(width, buckets)  # bit jw for each bucket j
    ends = starts << (width - 1)  # the top bit of each bucket
    least = reach & ~((reach | ends) - starts)  # no borrow crosses a bucket: each is >= 1
    below = reach  # each bucket's bits from its greatest set bit down (shifts within buckets)
    shift = 1
    while shift < width:  # the low width - shift bits of each bucket take the bits above them
        below |= (below >> shift) & ((starts << (width - shift)) - starts)
        shift *= 2
    greatest = below & ~((below >> 1) & ~ends)
    return least | (greatest & ~(reach >> 1))


def _every(width: int, count: int) -> int:
    """Bits 0, width, 2 width, ... (`count` of them), by doubling."""
    bits, have = 1, 1
    while have < count:
        bits |= bits << (have * width)
        have *= 2
    return bits & ((1 << (count * width)) - 1)


def set_bits(bits: int, scale: int = 1) -> tuple[int, ...]:
    """Positions of the set bits of `bits` (>= 0), ascending, times `scale`, with no Python step
    per bit: where few are set, one per set bit (from the run of zeros below it); else none (a
    mask over every position, which costs less once many are set)."""
    low_first = format(bits, "b")[::-1]
    if bits.bit_count() * _DENSE > len(low_first):
        mask = low_first.encode().translate(_ZERO_ONE)  # byte p: 1 where bit p is set
        return tuple(compress(range(0, len(mask) * scale, scale), mask))
    gaps = low_first.split("1")  # the zeros below each set bit (the last: above the top one)
    gaps.pop()
    return tuple(accumulate([(len(gap) + 1) * scale for gap in gaps], initial=-scale))[1:]
