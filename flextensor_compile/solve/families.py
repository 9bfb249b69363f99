"""Per-trap caps and selections: the building blocks the strategies are made of.

Owns: the transfer window of each trap (compute time of the traps since the previous module
trap, so gap traps widen it), the cap families (time window, uniform bytes, bytes in proportion
to what a trap can stream, and blends), turning caps into a pick exactly (subset-sum table) or
greedily (largest items first), and mixing two picks trap by trap in a spread-out order.
Must not know: blocks, schedules, budgets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Protocol

from flextensor_compile.solve.cover import cover_selections, cover_sizes
from flextensor_compile.solve.plan import Pick, PlanCache, Selection
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.subset import SubsetTable

__all__ = ["MIN_WINDOW_MS", "CapFamily", "Context", "make_context", "window_ms"]

CapFamily = Callable[[float], tuple[float, ...]]  # level x -> per-trap cap in slot bytes
_GOLDEN = 0.6180339887498949
MIN_WINDOW_MS = 1e-6  # shorter windows hide no copy


@dataclass(frozen=True)
class Context:
    """What every strategy reuses: subset tables, windows, per-trap streamable bytes, and
    per-solve caches (counted bytes of table entries; greedy picks per trap signature and cap)."""

    problem: Problem
    tables: tuple[SubsetTable, ...]
    window_ms: tuple[float, ...]
    streamable: tuple[int, ...]  # slot bytes if everything a trap can stream streams
    spread: tuple[int, ...]  # trap orders in a low-discrepancy order (for mixing)
    counted: tuple[dict[int, int], ...]
    largest_first: tuple[tuple[int, ...], ...]  # per trap: item indexes, largest first
    kind: tuple[int, ...]  # per trap: index of its items' (slot, counted) bytes signature
    smallest: tuple[int, ...]  # per trap: its smallest item's counted bytes (0: no items)
    greedy_cache: dict[tuple[int, float], tuple[tuple[int, ...], int, int]]
    # (per-trap slot bytes, blocks, order) -> peak + streamed bytes (None: unschedulable)
    memory_cache: dict[tuple[tuple[int, ...], int, str], int | None]
    pick_cache: dict[tuple[object, ...], Pick]  # (family tag, exact, level) -> its pick
    plans: PlanCache  # simulations and copy times, shared by the solve's plans

    @cached_property
    def time_hi(self) -> float:
        """A level of the time-window family at which every trap streams all it can."""
        bw = self.problem.bandwidth
        ratios = [bw.copy_ms(s) / w for s, w in zip(self.streamable, self.window_ms, strict=True)
                  if s and w > MIN_WINDOW_MS]  # fmt: skip
        return max(ratios, default=1.0) * 1.001 + 1e-9

    @cached_property
    def spread_rank(self) -> dict[int, int]:
        """Trap order -> its position in the spread order."""
        return {o: r for r, o in enumerate(self.spread)}

    @cached_property
    def cover_sizes(self) -> tuple[int, ...]:
        """The largest transfers cover selections try (`cover.cover_sizes`)."""
        return cover_sizes(self)

    @cached_property
    def _within(self) -> dict[int, tuple[tuple[int, int, int], ...]]:
        return {}  # m -> `largest_within(m)`

    @cached_property
    def _covers(self) -> dict[tuple[int, int], tuple[Selection, ...]]:
        return {}  # (m, staging bytes) -> `cover_selections`

    def cover_selections(self, m: int, staging_bytes: int) -> tuple[Selection, ...]:
        """`cover.cover_selections`, kept per solve (layouts that stage alike share them)."""
        got = self._covers.get((m, staging_bytes))
        if got is None:
            got = self._covers[(m, staging_bytes)] = cover_selections(self, m, staging_bytes)
        return got

    def largest_within(self, m: int) -> tuple[tuple[int, int, int], ...]:
        """(slot bytes, trap order, subset key: its sum) of each trap's largest subset within
        `m` slot bytes (traps with none left out), largest first, the spread order on ties."""
        got = self._within.get(m)
        if got is None:
            rank = self.spread_rank
            caps = [(k, o, k) for o, t in enumerate(self.tables) if (k := t.within(m))]
            caps.sort(key=lambda c: (-c[0], rank[c[1]]))
            got = self._within[m] = tuple(caps)
        return got

    @cached_property
    def repeating(self) -> tuple[bool, ...]:
        """Per trap: some of its tensors have the same counted bytes (`size_runs` pays)."""
        return tuple(len(set(b)) < len(b) for b in self.problem.item_bytes)

    @cached_property
    def _runs(self) -> dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], ...]]:
        return {}  # (trap kind, chosen) -> `size_runs`

    def size_runs(self, order: int, chosen: tuple[int, ...]
                  ) -> tuple[tuple[int, tuple[int, ...]], ...]:  # fmt: skip
        """(counted bytes, the tensors of `chosen` of that size, in `chosen`'s order) for each
        distinct size among them, kept per solve (traps alike share them)."""
        key = (self.kind[order], chosen)
        got = self._runs.get(key)
        if got is None:
            counted = self.problem.item_bytes[order]
            runs: dict[int, list[int]] = {}
            for k in chosen:
                runs.setdefault(counted[k], []).append(k)
            got = self._runs[key] = tuple([(size, tuple(ks)) for size, ks in runs.items()])
        return got

    @cached_property
    def _slot_is_counted(self) -> tuple[bool, ...]:
        """Per trap: every item's slot bytes are its counted bytes (no alignment padding)."""
        return tuple(all(it.slot_bytes == it.bytes for it in t.items) for t in self.problem.traps)

    def counted_bytes(self, order: int, k: int) -> int:
        """Counted bytes of trap `order`'s subset-table entry of sum `k` (its sum, with no
        padding: then no subset is rebuilt)."""
        cache = self.counted[order]
        if k not in cache:
            if self._slot_is_counted[order]:
                return k
            counted = self.problem.item_bytes[order]
            cache[k] = sum([counted[j] for j in self.tables[order].subset_of(k)])
        return cache[k]

    @cached_property
    def _all_counted(self) -> bool:
        """Every trap's table entries are their counted bytes (`counted_bytes` is the sum)."""
        return all(self._slot_is_counted)

    def exact(self, caps: tuple[float, ...]) -> Pick:
        """Each trap's largest table entry within its cap; the subsets are rebuilt only when
        the pick's selection is asked for (most picks are only checked for memory)."""
        if not caps:
            return Pick((), (), ())
        if len(self._first_of_kind) < len(caps):  # identical traps under one cap pick the same
            return self._exact_shared(caps)
        entries = tuple(map(SubsetTable.within, self.tables, caps))  # per trap: the entry's sum
        streamed = entries if self._all_counted else tuple(map(self.counted_bytes, self._orders,
                                                               entries))  # fmt: skip
        return _exact_pick(self.tables, entries, streamed)

    @cached_property
    def _first_of_kind(self) -> dict[int, int]:
        """Items signature (`kind`) -> the first trap of that signature."""
        first: dict[int, int] = {}
        for order, kind in enumerate(self.kind):
            first.setdefault(kind, order)
        return first

    def _exact_shared(self, caps: tuple[float, ...]) -> Pick:
        """`exact` where traps repeat: each (signature, cap) looked up once."""
        picked = []  # per trap: (table entry: its sum, counted bytes)
        seen: dict[tuple[int, float], tuple[int, int]] = {}
        for order, (kind, cap) in enumerate(zip(self.kind, caps, strict=True)):
            key = (kind, cap)
            got = seen.get(key)
            if got is None:
                k = self.tables[order].within(cap)
                got = seen[key] = (k, self.counted_bytes(order, k))
            picked.append(got)
        entries, streamed = zip(*picked, strict=True)
        return _exact_pick(self.tables, entries, streamed)

    def greedy(self, caps: tuple[float, ...]) -> Pick:
        picked = []  # per trap: (subset, slot bytes, counted bytes)
        cache, kind = self.greedy_cache, self.kind
        for order, cap in enumerate(caps):
            key = (kind[order], cap)  # identical traps under one cap pick the same
            got = cache.get(key)
            if got is None:
                got = cache[key] = self._greedy_one(order, cap)
            picked.append(got)
        return _pick(picked)

    @cached_property
    def _orders(self) -> range:
        return range(len(self.tables))

    def _greedy_one(self, order: int, cap: float) -> tuple[tuple[int, ...], int, int]:
        items = self.problem.traps[order].items
        largest = self.largest_first[order]
        least = items[largest[-1]].slot_bytes if largest else 0  # no item fits a smaller room
        chosen, used, counted = [], 0, 0
        for k in largest:
            if used + items[k].slot_bytes <= cap:
                chosen.append(k)
                used += items[k].slot_bytes
                counted += items[k].bytes
                if cap - used < least:
                    break
        chosen.sort()
        return tuple(chosen), used, counted

    def mix(self, low: Pick, high: Pick, count: int, order: tuple[int, ...] = ()) -> Pick:
        """`high`'s choice for the first `count` traps of `order` (default: the spread order; a
        permutation of the traps), `low`'s elsewhere."""
        order = order or self.spread
        if count > len(order) - count:  # fewer to copy the other way round
            low, high, changed = high, low, order[count:]
        else:
            changed = order[:count]
        slots, streamed = list(low.slot_bytes), list(low.trap_streamed)
        up_slots, up_streamed = high.slot_bytes, high.trap_streamed
        for o in changed:
            slots[o], streamed[o] = up_slots[o], up_streamed[o]
        if _is_exact(low) and _is_exact(high):  # so is the mix: its slot bytes are its entries
            return _exact_pick(self.tables, tuple(slots), tuple(streamed))
        # the tensors of each trap only when asked for: most mixes are only checked for memory
        part = partial(_mixed_part, low, high, frozenset(changed))
        return Pick(partial(_parts, part, len(slots)), tuple(slots), tuple(streamed), part)

    def time_caps(self) -> CapFamily:
        bw, windows = self.problem.bandwidth, self.window_ms
        return lambda x: _per_window(windows, lambda w: float(bw.bytes_within(x * w)))

    def uniform_caps(self) -> CapFamily:
        n = len(self.streamable)
        return lambda x: (x,) * n

    def proportional_caps(self) -> CapFamily:
        top = max(self.streamable, default=0) or 1
        return lambda x: tuple(x * s / top for s in self.streamable)

    def window_plus_caps(self) -> CapFamily:
        """Up to level 1: the window scaled by x; beyond: the whole window plus (x - 1) mean
        windows for every trap (copies longer than windows keep the copy engine busy)."""
        bw, windows = self.problem.bandwidth, self.window_ms
        mean_ms = sum(windows) / max(1, len(windows))
        return lambda x: _per_window(
            windows, lambda w: float(bw.bytes_within(min(x, 1.0) * w + max(0.0, x - 1.0) * mean_ms))
        )

    def class_caps(self, classes: tuple[int, ...], fixed: int, fixed_cap: float) -> CapFamily:
        """Traps of class `fixed` capped at `fixed_cap`, the other class at the level (bytes);
        traps of neither class (-1) stream nothing."""
        return lambda x: tuple(fixed_cap if c == fixed else (x if c >= 0 else 0.0) for c in classes)

    def blended_caps(self, alpha: float) -> CapFamily:
        """alpha of the time-window cap plus (1 - alpha) of a uniform cap, at one level (ms)."""
        bw, windows = self.problem.bandwidth, self.window_ms
        mean_ms = sum(windows) / max(1, len(windows)) or 1.0
        return lambda x: _per_window(
            windows,
            lambda w: alpha * bw.bytes_within(x * w / mean_ms) + (1 - alpha) * bw.bytes_within(x),
        )


def _pick(picked: list[tuple[tuple[int, ...], int, int]]) -> Pick:
    """The pick of per-trap (subset, slot bytes, counted bytes)."""
    if not picked:
        return Pick((), (), ())
    sel, slots, streamed = zip(*picked, strict=True)
    return Pick(sel, slots, streamed)


def _exact_pick(tables: tuple[SubsetTable, ...], entries: tuple[int, ...],
                streamed: tuple[int, ...]) -> Pick:  # fmt: skip
    """The pick of one table entry (by its sum, also its slot bytes) per trap, streaming
    `streamed` counted bytes per trap; its subsets are rebuilt when first asked for."""
    return Pick(partial(_subsets, tables, entries), entries, streamed,
                partial(_subset_of, tables, entries))  # fmt: skip


def _is_exact(pick: Pick) -> bool:
    """Whether `pick` is an `_exact_pick` (its slot bytes are its table entries)."""
    part = pick.part
    return isinstance(part, partial) and part.func is _subset_of


def _subsets(tables: tuple[SubsetTable, ...], entries: tuple[int, ...]) -> Selection:
    """The selection of one table entry (by its sum) per trap."""
    return tuple([table.subset_of(k) for table, k in zip(tables, entries, strict=True)])


def _subset_of(tables: tuple[SubsetTable, ...], entries: tuple[int, ...], order: int
               ) -> tuple[int, ...]:  # fmt: skip
    """Trap `order`'s share of `_subsets`."""
    return tables[order].subset_of(entries[order])


def _mixed_part(low: Pick, high: Pick, changed: frozenset[int], order: int) -> tuple[int, ...]:
    """Trap `order`'s items in the mix of `low` with `high`'s choice for the `changed` traps."""
    return (high if order in changed else low).chosen(order)


def _parts(part: Callable[[int], tuple[int, ...]], count: int) -> Selection:
    """The selection of `count` traps, each trap's items from `part`."""
    return tuple(map(part, range(count)))


def _per_window(windows: tuple[float, ...], cap: Callable[[float], float]) -> tuple[float, ...]:
    """`cap` of each window, evaluated once per distinct window (identical traps repeat)."""
    caps: dict[float, float] = {}
    for w in windows:
        if w not in caps:
            caps[w] = cap(w)
    return tuple([caps[w] for w in windows])


class _Timed(Protocol):
    @property
    def compute_ms(self) -> float: ...

    @property
    def kind(self) -> str: ...


def window_ms(traps: Sequence[_Timed], order: int) -> float:
    """Trap `order`'s transfer window: the compute of the traps before it, back to and
    including the first module trap (gap traps widen it), cyclic over the iteration."""
    n = len(traps)
    total, k = 0.0, order - 1
    for _ in range(n - 1):
        total += traps[k % n].compute_ms
        if traps[k % n].kind != "gap":
            break
        k -= 1
    return total


def _windows(problem: Problem) -> tuple[float, ...]:
    return tuple(window_ms(problem.traps, i) for i in range(len(problem.traps)))


def _largest_first(signature: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """Item indexes by slot bytes, largest first (by index on ties)."""
    return tuple(sorted(range(len(signature)), key=lambda k: (-signature[k][0], k)))


def make_context(problem: Problem) -> Context:
    built: dict[tuple[int, ...], SubsetTable] = {}  # identical traps share one table
    tables = []
    for t in problem.traps:
        sizes = tuple(it.slot_bytes for it in t.items)
        if sizes not in built:
            built[sizes] = SubsetTable.build(sizes)
        tables.append(built[sizes])
    n = len(problem.traps)
    spread = tuple(sorted(range(n), key=lambda i: ((i * _GOLDEN) % 1.0, i)))
    signatures: dict[tuple[tuple[int, int], ...], int] = {}
    kind = tuple(
        signatures.setdefault(tuple(zip(slots, counted, strict=True)), len(signatures))
        for slots, counted in zip(problem.item_slot_bytes, problem.item_bytes, strict=True)
    )
    ranked = [_largest_first(sig) for sig in signatures]  # per kind (traps alike share one)
    largest = tuple(ranked[k] for k in kind)
    smallest = tuple(min(b, default=0) for b in problem.item_bytes)
    return Context(problem, tuple(tables), _windows(problem),
                   tuple(t.streamable_slot_bytes for t in problem.traps), spread,
                   tuple({} for _ in range(n)), largest, kind, smallest, {}, {}, {},
                   PlanCache())  # fmt: skip
