"""Token pruning: selection policies, prune/restore round trips, TokenPruner's seed and pairing."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime import (
    TokenPruner,
    TokenPruneState,
    TokenScoreMethod,
    prune_tokens,
    restore_tokens,
    select_token_indices,
)
from flextensor_runtime.errors import ConfigError, TokenPruneError


def _tokens_with_norms(norms: list[float], batch: int = 2, dim: int = 4) -> torch.Tensor:
    x = torch.zeros(batch, len(norms), dim)
    x[:, :, 0] = torch.tensor(norms)
    return x  # [B, L, D]


def test_feat_norm_keeps_highest_norm_tokens_in_ascending_order() -> None:
    x = _tokens_with_norms([1.0, 9.0, 3.0, 7.0, 5.0])
    idx = select_token_indices(x, keep_ratio=0.6)
    assert idx.tolist() == [1, 3, 4]
    assert idx.dtype == torch.int64


def test_kept_count_rounds_up_and_keeps_at_least_one() -> None:
    x = torch.randn(1, 10, 3)
    assert select_token_indices(x, 0.25).numel() == 3
    assert select_token_indices(x, 0.01).numel() == 1
    assert select_token_indices(x, 1.0).tolist() == list(range(10))


def test_ties_keep_the_earlier_token() -> None:
    x = _tokens_with_norms([2.0, 2.0, 2.0, 2.0])
    assert select_token_indices(x, 0.5).tolist() == [0, 1]


def test_random_is_seeded() -> None:
    x = torch.randn(1, 50, 2)
    a = select_token_indices(x, 0.3, method="random", random_seed=7)
    b = select_token_indices(x * 100, 0.3, method=TokenScoreMethod.RANDOM, random_seed=7)
    c = select_token_indices(x, 0.3, method="random", random_seed=8)
    assert a.tolist() == b.tolist() != c.tolist()
    assert a.tolist() == sorted(a.tolist()) and len(set(a.tolist())) == 15


def test_velocity_ranks_by_previous_velocity() -> None:
    x = _tokens_with_norms([9.0, 9.0, 1.0, 1.0])
    velocity = _tokens_with_norms([0.0, 0.1, 5.0, 4.0], dim=7)
    assert select_token_indices(x, 0.5, "velocity", previous_velocity=velocity).tolist() == [2, 3]
    with pytest.raises(ConfigError, match="needs previous_velocity"):
        select_token_indices(x, 0.5, "velocity")


def test_other_sequence_dims() -> None:
    x = _tokens_with_norms([1.0, 9.0, 3.0, 7.0]).transpose(0, 1)  # [L, B, D]
    assert select_token_indices(x, 0.5, seq_dim=0).tolist() == [1, 3]
    assert select_token_indices(x, 0.5, seq_dim=-3).tolist() == [1, 3]


@pytest.mark.parametrize("ratio", [0.0, 1.5, -1, True])
def test_bad_keep_ratio(ratio: float) -> None:
    with pytest.raises(ConfigError, match="keep_ratio"):
        select_token_indices(torch.ones(1, 4, 2), ratio)


def test_unknown_method_and_bad_seq_dim() -> None:
    with pytest.raises(ConfigError, match="'l1' is unknown"):
        select_token_indices(torch.ones(1, 4, 2), 0.5, method="l1")
    with pytest.raises(ConfigError, match="seq_dim=3"):
        select_token_indices(torch.ones(1, 4, 2), 0.5, seq_dim=3)


def test_prune_keeps_tokens_outside_the_segment() -> None:
    text = torch.full((2, 3, 4), -1.0)
    video = _tokens_with_norms([1.0, 8.0, 2.0, 9.0, 3.0, 4.0])
    x = torch.cat([text, video, text[:, :1]], dim=1)  # [2, 10, 4]
    compact, state = prune_tokens(x, 0.5, start=3, end=9)
    assert state == TokenPruneState(state.indices, 3, 9, 10, 1)
    assert state.indices.tolist() == [1, 3, 5] and state.count == 3
    assert compact.shape == (2, 7, 4)
    torch.testing.assert_close(compact[:, :3], text)
    torch.testing.assert_close(compact[:, 3:6], video[:, [1, 3, 5]])
    torch.testing.assert_close(compact[:, 6:], text[:, :1])


def test_restore_fills_dropped_tokens_with_zeros() -> None:
    x = torch.randn(2, 8, 3) + 5.0
    compact, state = prune_tokens(x, 0.5)
    full = restore_tokens(compact * 2, state)
    kept = state.indices
    dropped = [i for i in range(8) if i not in kept.tolist()]
    torch.testing.assert_close(full[:, kept], x[:, kept] * 2)
    assert torch.count_nonzero(full[:, dropped]) == 0


@pytest.mark.parametrize("segment_only", [False, True])
def test_restore_fills_dropped_tokens_from_compensation(segment_only: bool) -> None:
    x = torch.randn(2, 12, 3)
    compact, state = prune_tokens(x, 0.25, start=2, end=10)
    previous = torch.randn(2, 12, 3)
    compensation = previous[:, 2:10] if segment_only else previous
    full = restore_tokens(compact, state, compensation=compensation)
    expected = previous.clone()
    expected[:, :2], expected[:, 10:] = x[:, :2], x[:, 10:]
    expected[:, 2 + state.indices] = x[:, 2 + state.indices]
    torch.testing.assert_close(full, expected)
    # with the input itself as compensation the round trip is exact
    torch.testing.assert_close(restore_tokens(compact, state, x), x)


def test_restore_checks_shapes_and_is_differentiable() -> None:
    x = torch.randn(1, 6, 2, requires_grad=True)
    compact, state = prune_tokens(x, 0.5)
    with pytest.raises(TokenPruneError, match="does not have 3 tokens"):
        restore_tokens(compact[:, :2], state)
    with pytest.raises(TokenPruneError, match="does not fit segment"):
        restore_tokens(compact, state, compensation=torch.zeros(1, 5, 2))
    restore_tokens(compact, state).sum().backward()
    assert x.grad is not None
    assert x.grad[0, state.indices].eq(1).all() and x.grad.sum() == 3 * 2


def _tokenwise_block() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))


def test_token_pruner_seeds_densely_then_compensates_from_the_previous_step() -> None:
    block = _tokenwise_block()
    pruner = TokenPruner(keep_ratio=0.5)
    steps = [torch.randn(2, 10, 4) for _ in range(3)]
    with torch.no_grad():
        seed_in, seed_state = pruner.prune(steps[0])
        assert seed_state is None and seed_in is steps[0]
        previous = pruner.restore(block(seed_in), seed_state)
        torch.testing.assert_close(previous, block(steps[0]))
        for x in steps[1:]:
            compact, state = pruner.prune(x)
            assert state is not None and compact.shape == (2, 5, 4)
            full = pruner.restore(block(compact), state)
            kept = state.indices
            dropped = [i for i in range(10) if i not in kept.tolist()]
            torch.testing.assert_close(full[:, kept], block(x)[:, kept])  # token-wise: exact
            torch.testing.assert_close(full[:, dropped], previous[:, dropped])
            previous = full


def test_token_pruner_pairing_rule() -> None:
    pruner = TokenPruner(0.5)
    x = torch.randn(1, 4, 2)
    with pytest.raises(TokenPruneError, match="no pending prune"):
        pruner.restore(x, None)
    _, state = pruner.prune(x)
    with pytest.raises(TokenPruneError, match=r"called again before restore\(\)"):
        pruner.prune(x)
    pruner.restore(x, state)
    _, state = pruner.prune(x, key="uncond")  # keys are independent: a fresh dense seed
    assert state is None
    compact, state = pruner.prune(x)  # 'default' was restored, so this prune is allowed
    assert state is not None and compact.shape[1] == 2


def test_token_pruner_reset_and_shape_change_reseed() -> None:
    pruner = TokenPruner(0.5)
    for key in ("a", "b"):
        _, s = pruner.prune(torch.randn(1, 4, 2), key=key)
        pruner.restore(torch.randn(1, 4, 2), s, key=key)
    pruner.reset("a")
    assert pruner.prune(torch.randn(1, 4, 2), key="a")[1] is None
    _, s = pruner.prune(torch.randn(1, 6, 2), key="b")  # new resolution
    assert s is None
    pruner.reset()
    assert pruner.prune(torch.randn(1, 6, 2), key="b")[1] is None


def test_token_pruner_velocity_uses_the_last_update_of_each_token() -> None:
    pruner = TokenPruner(0.5, method="velocity")
    x = torch.zeros(1, 4, 2)
    _, s = pruner.prune(x)
    update = _tokens_with_norms([0.0, 3.0, 0.0, 2.0], batch=1, dim=2)
    pruner.restore(x + update, s)
    _, s = pruner.prune(torch.zeros(1, 4, 2))
    assert s is not None and s.indices.tolist() == [1, 3]


def test_token_pruner_validates_options() -> None:
    with pytest.raises(ConfigError, match="keep_ratio"):
        TokenPruner(0.0)
    with pytest.raises(ConfigError, match="unknown"):
        TokenPruner(0.5, method="bogus")


def test_empty_sequence_and_non_tensor_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="has no tokens on dim 1"):
        select_token_indices(torch.randn(2, 0, 4), 0.5)
    with pytest.raises(ConfigError, match=r"must be a torch\.Tensor, got list"):
        select_token_indices([[1.0, 2.0]], 0.5)  # type: ignore[arg-type]


def test_restore_rejects_a_missing_or_inconsistent_state() -> None:
    compact, _ = prune_tokens(torch.randn(2, 8, 4), 0.5)
    with pytest.raises(TokenPruneError, match="got state of type NoneType"):
        restore_tokens(compact, None)  # type: ignore[arg-type]
    for indices, start, end in (([0, 7, 9], 0, 8), ([0, 1], 5, 3), ([0, 1, 2], 0, 2)):
        with pytest.raises(TokenPruneError, match="is inconsistent"):
            TokenPruneState(torch.tensor(indices), start, end, 8, 1)


def test_pruner_restore_needs_the_state_its_prune_returned() -> None:
    pruner, hidden = TokenPruner(0.5), torch.randn(2, 8, 4)
    pruner.restore(*pruner.prune(hidden))  # dense seed
    compact, state = pruner.prune(hidden)
    with pytest.raises(TokenPruneError, match="got state None, not the one"):
        pruner.restore(compact, None)
    assert pruner.restore(compact, state).shape == hidden.shape


def test_pruner_failed_prune_leaves_no_pending_restore() -> None:
    pruner, hidden = TokenPruner(0.5), torch.randn(2, 8, 4)
    pruner.restore(*pruner.prune(hidden))
    with pytest.raises(ConfigError, match="seq_dim=9"):
        pruner.prune(hidden, seq_dim=9)
    compact, state = pruner.prune(hidden)  # not "called again before restore()"
    assert compact.shape == (2, 4, 4) and state is not None


def test_non_int_positions_and_seed_are_config_errors() -> None:
    hidden = torch.randn(2, 8, 4)
    with pytest.raises(ConfigError, match=r"seq_dim=1\.0 is invalid"):
        select_token_indices(hidden, 0.5, seq_dim=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"start=1\.5"):
        prune_tokens(hidden, 0.5, start=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="random_seed='a' is invalid"):
        select_token_indices(hidden, 0.5, "random", random_seed="a")  # type: ignore[arg-type]


def test_pruner_failed_restore_can_be_retried() -> None:
    pruner, hidden = TokenPruner(0.5), torch.randn(2, 8, 4)
    pruner.restore(*pruner.prune(hidden))
    compact, state = pruner.prune(hidden)
    with pytest.raises(TokenPruneError, match="does not have 4 tokens"):
        pruner.restore(compact[:, :2], state)
    assert pruner.restore(compact, state).shape == hidden.shape


def test_non_tensor_velocity_processed_or_compensation_are_clear_errors() -> None:
    hidden = torch.randn(2, 8, 4)
    with pytest.raises(
        ConfigError, match="needs previous_velocity with 4 tokens on dim 1, got list"
    ):
        prune_tokens(hidden, 0.5, "velocity", 1, 2, 6, [1.0])  # type: ignore[arg-type]
    compact, state = prune_tokens(hidden, 0.5)
    with pytest.raises(TokenPruneError, match="got processed of type list"):
        restore_tokens([1.0], state)  # type: ignore[arg-type]
    with pytest.raises(TokenPruneError, match="got compensation of type list"):
        restore_tokens(compact, state, [1.0])  # type: ignore[arg-type]
    pruner = TokenPruner(0.5)
    _, seed = pruner.prune(hidden)
    with pytest.raises(TokenPruneError, match="restore got processed of type list"):
        pruner.restore([1.0], seed)  # type: ignore[arg-type]


def test_host_buffers_stay_on_the_host_under_a_default_device() -> None:
    # scripts that set torch.set_default_device("cuda"): the runtime's host-side tensors say
    # device="cpu" ("meta" stands in for the GPU default here)
    from flextensor_runtime.backend import CpuBackend

    hidden = torch.randn(1, 10, 4)
    expected = select_token_indices(hidden, 0.5, "random", random_seed=3)
    with torch.device("meta"):
        assert CpuBackend().alloc_host(8).device.type == "cpu"
        got = select_token_indices(hidden, 0.5, "random", random_seed=3)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_complex_tokens_rank_by_their_magnitude() -> None:
    """The score of a complex token dropped its imaginary part (torch's `.float()`)."""
    real = torch.ones(1, 4, 2)
    imag = torch.tensor([0.0, 3.0, 0.0, 2.0]).view(1, 4, 1).expand(1, 4, 2)
    hidden = torch.complex(real, imag)
    assert select_token_indices(hidden, 0.5).tolist() == [1, 3]
    velocity = torch.complex(torch.zeros(1, 4, 2), imag)
    kept = select_token_indices(real, 0.5, method="velocity", previous_velocity=velocity)
    assert kept.tolist() == [1, 3]
