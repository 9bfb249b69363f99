"""Property: pruning then restoring with the input as compensation gives the input back."""

from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flextensor_runtime import prune_tokens, restore_tokens


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, int, int, int, float, str]:
    shape = draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    seq_dim = draw(st.integers(0, len(shape) - 1))
    length = shape[seq_dim]
    start = draw(st.integers(0, length - 1))
    end = draw(st.integers(start + 1, length))
    ratio = draw(st.floats(0.05, 1.0))
    method = draw(st.sampled_from(["feat_norm", "random", "velocity"]))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    return x, seq_dim, start, end, ratio, method


def _fewest_kept(ratio: float, seg_len: int) -> int:
    """The fewest tokens whose share of the segment reaches `ratio` (at least one): counted up
    one at a time, with a tolerance for the float product (0.28 * 25 is
    7.000000000000001: seven tokens keep 28 %)."""
    kept = 1
    while kept < seg_len and kept < ratio * seg_len - 1e-9:
        kept += 1
    return kept


@settings(max_examples=150, deadline=None)
@given(cases())
@example((torch.randn(25, 2), 0, 0, 25, 0.28, "feat_norm"))  # 0.28 * 25 rounds above 7
@example((torch.randn(7, 3), 0, 0, 7, 1.0, "velocity"))  # everything kept
@example((torch.randn(2, 8), 1, 1, 7, 0.05, "random"))  # less than one token: one kept
def test_round_trip_and_kept_count(case: tuple[torch.Tensor, int, int, int, float, str]) -> None:
    x, seq_dim, start, end, ratio, method = case
    compact, state = prune_tokens(x, ratio, method, seq_dim, start, end, previous_velocity=x * 2)
    seg_len = end - start
    assert state.count == _fewest_kept(ratio, seg_len)
    idx = state.indices.tolist()
    assert idx == sorted(set(idx)) and all(0 <= i < seg_len for i in idx)
    assert compact.shape[seq_dim] == state.compact_length
    torch.testing.assert_close(restore_tokens(compact, state, compensation=x), x, rtol=0, atol=0)
    zeros = restore_tokens(compact, state)
    dropped = sorted(set(range(seg_len)) - set(idx))
    if dropped:
        gone = zeros.narrow(seq_dim, start, seg_len).index_select(seq_dim, torch.tensor(dropped))
        assert torch.count_nonzero(gone) == 0
