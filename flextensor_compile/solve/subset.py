"""Exact subset sums of one trap's streamable items: the knapsack kernel every strategy uses.

Owns: the table of every distinct achievable packed size of a trap's items (with one
deterministic subset per size), and "the largest subset whose packed size fits a cap".
Because a copy's time grows with its bytes, "most bytes within a time window" is the same query
with the cap converted by the bandwidth model.
Exact while a trap has at most `MAX_SUMS` distinct sums (always for up to 12 items); beyond that
the table is thinned to sums at least `total / MAX_SUMS` apart (an FPTAS-style trim, so the
answer is within that many bytes of the optimum).
Must not know: time, blocks, plans.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["MAX_SUMS", "SubsetTable"]

MAX_SUMS = 4096


@dataclass(frozen=True)
class SubsetTable:
    """Sorted distinct achievable sums and, for each, one subset (item indexes, ascending)."""

    sums: tuple[int, ...]
    subsets: tuple[tuple[int, ...], ...]
    exact: bool

    @staticmethod
    def build(sizes: tuple[int, ...]) -> SubsetTable:
        table: dict[int, tuple[int, ...]] = {0: ()}
        exact = True
        total = sum(sizes)
        for k, size in enumerate(sizes):
            for s, subset in list(table.items()):
                table.setdefault(s + size, (*subset, k))
            if len(table) > MAX_SUMS:
                table = _thin(table, total)
                exact = False
        keys = sorted(table)
        return SubsetTable(tuple(keys), tuple(table[k] for k in keys), exact)

    def best_within(self, cap: float) -> int:
        """Index into `sums` of the largest sum <= cap (0 = the empty subset)."""
        return max(0, bisect_right(self.sums, cap) - 1)

    def best_at_least(self, need: float) -> int:
        """Index of the smallest sum >= need (the largest sum if none reaches it)."""
        k = bisect_right(self.sums, need - 1)
        return min(k, len(self.sums) - 1)


def _thin(table: dict[int, tuple[int, ...]], total: int) -> dict[int, tuple[int, ...]]:
    step = max(1, total // MAX_SUMS)
    kept: dict[int, tuple[int, ...]] = {}
    last = -step
    for s in sorted(table):
        if s - last >= step or s == 0:
            kept[s] = table[s]
            last = s
    top = max(table)
    kept[top] = table[top]
    return kept
