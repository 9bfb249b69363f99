"""The solver's shortcuts agree with the full computations they stand in for (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.solve.assign import (
    ORDERS,
    _grow_any,
    _grow_two,
    assign_blocks,
    assigned_bytes,
)


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
