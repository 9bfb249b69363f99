"""The subset-sum table: exact tables against brute force and the first-items subset rule, the
accuracy guarantee of thinned tables (bit-set and dict paths), and determinism."""

from __future__ import annotations

import random
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import SubsetTable
from flextensor_compile.solve.bitsums import all_sums, set_bits
from flextensor_compile.solve.subset import union_of_sums

SIZES = st.lists(st.integers(0, 3000).map(lambda k: k * 256) | st.integers(0, 60), max_size=11)


def achievable(sizes: tuple[int, ...]) -> list[int]:
    return sorted({sum(c) for r in range(len(sizes) + 1) for c in combinations(sizes, r)})


def first_items_table(sizes: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """The reference rule for exact tables: sum s gets the subset of s - size_k plus item k, for
    the first item k with which s is achievable."""
    table: dict[int, tuple[int, ...]] = {0: ()}
    for k, size in enumerate(sizes):
        for s, subset in list(table.items()):
            table.setdefault(s + size, (*subset, k))
    return table


def check_subsets(table: SubsetTable, sizes: tuple[int, ...]) -> None:
    for k, total in enumerate(table.sums):
        subset = table.subset(k)
        assert list(subset) == sorted(set(subset))
        assert all(0 <= i < len(sizes) for i in subset)
        assert sum(sizes[i] for i in subset) == total


def check_thinned(table: SubsetTable, sizes: tuple[int, ...], sums: list[int], most: int) -> None:
    """Every achievable y has table sums a <= y <= b within total / most of it, so queries are
    that close to the optimum; the table is sorted, distinct, achievable, and holds 0 and the
    total."""
    total = sum(sizes)
    step = total / most
    assert list(table.sums) == sorted(set(table.sums))
    assert set(table.sums) <= set(sums)
    assert table.sums[0] == 0 and table.sums[-1] == total
    assert len(table.sums) <= 3 * most + 2
    for y in sums:
        below = table.sums[table.best_within(y)]
        above = table.sums[table.best_at_least(y)]
        assert below <= y <= above
        assert y - below <= step and above - y <= step


@settings(max_examples=300, deadline=None)
@given(SIZES)
def test_exact_tables_hold_every_sum_with_the_first_items_subset(sizes: list[int]) -> None:
    items = tuple(sizes)
    table = SubsetTable.build(items)
    reference = first_items_table(items)
    assert table.exact
    assert list(table.sums) == achievable(items) == sorted(reference)
    assert [table.subset(k) for k in range(len(table.sums))] == [reference[s] for s in table.sums]


@settings(max_examples=200, deadline=None)
@given(SIZES, st.integers(0, 800_000))
def test_queries_equal_brute_force_on_exact_tables(sizes: list[int], cap: int) -> None:
    items = tuple(sizes)
    table = SubsetTable.build(items)
    sums = achievable(items)
    assert table.sums[table.best_within(cap)] == max(s for s in sums if s <= cap)
    above = [s for s in sums if s >= cap]
    assert table.sums[table.best_at_least(cap)] == (min(above) if above else sums[-1])


@settings(max_examples=300, deadline=None)
@given(SIZES, st.integers(1, 64), st.booleans())
def test_thinned_tables_stay_within_total_over_max_sums(
    sizes: list[int], most: int, on_dict: bool
) -> None:
    items = tuple(sizes)
    table = SubsetTable.build(items, max_sums=most, max_bits=0 if on_dict else 1 << 28)
    sums = achievable(items)
    check_subsets(table, items)
    if len(sums) <= most:
        assert table.exact and list(table.sums) == sums
    else:
        check_thinned(table, items, sums, most)


def test_wide_traps_are_thinned_within_the_bound_on_both_paths() -> None:
    rng = random.Random(7)
    for n in (24, 100):
        items = tuple(rng.randint(1, 4000) * 4096 for _ in range(n))
        sums = list(set_bits(all_sums(s // 4096 for s in items), 4096))  # every achievable sum
        for max_bits in (1 << 28, 0):
            table = SubsetTable.build(items, max_bits=max_bits)
            assert not table.exact
            check_thinned(table, items, sums, 4096)
            for k in rng.sample(range(len(table.sums)), 50):
                assert sum(items[i] for i in table.subset(k)) == table.sums[k]


def test_tables_are_deterministic() -> None:
    rng = random.Random(3)
    for items in (tuple(rng.randint(1, 4000) * 256 for _ in range(30)),
                  tuple(rng.randint(1, 50) * 256 for _ in range(12))):  # fmt: skip
        first, second = SubsetTable.build(items), SubsetTable.build(items)
        assert first.sums == second.sums
        ks = range(0, len(first.sums), max(1, len(first.sums) // 200))
        assert [first.subset(k) for k in ks] == [second.subset(k) for k in ks]


def test_a_thinned_table_is_pinned() -> None:
    items = tuple(1000 + 37 * k * k for k in range(20))  # 111,390 in all
    table = SubsetTable.build(items, max_sums=16)  # buckets of 6,961
    assert not table.exact and len(table.sums) == 31
    assert table.sums[:5] == (0, 6959, 6997, 13919, 13952)
    assert table.sums[-3:] == (104431, 110390, 111390)
    assert table.subset(1) == (1, 5, 9)
    assert table.subset(29) == tuple(range(1, 20))


def test_empty_and_zero_sized_items() -> None:
    for items in ((), (0,), (0, 0, 0)):
        table = SubsetTable.build(items)
        assert table.exact and table.sums == (0,) and table.subset(0) == ()
    table = SubsetTable.build((0, 512, 0, 256))
    assert table.sums == (0, 256, 512, 768)
    assert [table.subset(k) for k in range(4)] == [(), (3,), (1,), (1, 3)]


def test_union_of_sums_equals_the_set_union() -> None:
    rng = random.Random(5)
    tables = [
        SubsetTable.build(tuple(rng.randint(1, 4000) * 4096 for _ in range(24))),  # thinned
        SubsetTable.build(tuple(rng.randint(1, 4000) * 4096 for _ in range(20))),
        SubsetTable.build(tuple(rng.randint(1, 4000) * 256 for _ in range(20))),  # another unit
        SubsetTable.build((4096, 8192, 12288)),  # exact
    ]
    for chosen in (tables[:1], tables[:2], tables, tables[3:], [tables[0], tables[0]]):
        assert union_of_sums(chosen) == sorted({s for t in chosen for s in t.sums})


def test_queries_by_sum_agree_with_the_listed_sums() -> None:
    """`within`, `at_least`, `after` and `subset_of` (what a solve asks; a table thinned on bit
    sets answers them from the bits) give what the listed `sums` and their indexes give."""
    rng = random.Random(11)
    for items, max_bits in (
        (tuple(rng.randint(1, 4000) * 4096 for _ in range(24)), 1 << 28),  # thinned, bits
        (tuple(rng.randint(1, 4000) * 4096 for _ in range(24)), 0),  # thinned, dict
        (tuple(rng.randint(1, 3000) * 256 for _ in range(9)), 1 << 28),  # exact
        ((7, 0, 3), 1 << 28),
    ):
        table = SubsetTable.build(items, max_bits=max_bits)
        sums, top = table.sums, sum(items)
        probes = [-1.5, -1, 0, 0.5, 1, top - 1, top, top + 1, float("nan")]
        probes += [rng.uniform(0, top) for _ in range(200)] + rng.sample(sums, min(50, len(sums)))
        for cap in probes:
            assert table.within(cap) == sums[table.best_within(cap)]
        for need in [int(x) for x in probes if x == x] + [s + 1 for s in sums[:50]]:
            assert table.at_least(need) == sums[table.best_at_least(need)]
        for k, s in enumerate(sums):
            assert table.after(s) == (sums[k + 1] if k + 1 < len(sums) else None)
            assert table.subset_of(s) == table.subset(k)
