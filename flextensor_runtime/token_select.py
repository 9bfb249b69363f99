"""Stateless token pruning: score tokens, keep the top share of a segment, scatter them back.

Owns: `TokenScoreMethod`, `select_token_indices`, `prune_tokens`, `restore_tokens` and
`TokenPruneState` (re-exported by `tokens`, their public home). Nothing here keeps state
between calls and nothing reads a tensor back to the host, so selection costs no sync.
Must not know: denoising steps or previous-step compensation (see `tokens.TokenPruner`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from enum import Enum

import torch

from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ConfigError, TokenPruneError

__all__ = [
    "TokenPruneState",
    "TokenScoreMethod",
    "kept_count",
    "parse_score_method",
    "prune_tokens",
    "restore_tokens",
    "select_token_indices",
]


class TokenScoreMethod(str, Enum):
    """How tokens are ranked; higher-scoring tokens are kept.

    FEAT_NORM: L2 norm of each token's features (over batch and feature dims together).
    RANDOM: a uniformly random subset drawn from a CPU generator seeded with `random_seed`.
    VELOCITY: L2 norm of each token in `previous_velocity` (how fast the token moved last step).
    """

    FEAT_NORM = "feat_norm"
    RANDOM = "random"
    VELOCITY = "velocity"


@dataclass(frozen=True)
class TokenPruneState:
    """Metadata needed to reconstruct a pruned token segment.

    `indices` (ascending, int64, 1-D) are positions inside the segment `[start, end)` of a
    sequence of `full_length` tokens along `seq_dim`.
    """

    indices: torch.Tensor
    start: int
    end: int
    full_length: int
    seq_dim: int

    def __post_init__(self) -> None:
        seg_len = self.end - self.start
        ok = isinstance(self.indices, torch.Tensor) and self.indices.dim() == 1
        ok = ok and not self.indices.is_floating_point() and not self.indices.is_complex()
        ok = ok and 0 <= self.start < self.end <= self.full_length and self.seq_dim >= 0
        if ok and self.indices.numel() and self.indices.device.type == "cpu":  # no host sync
            ok = int(self.indices.min()) >= 0 and int(self.indices.max()) < seg_len
        if not ok or self.indices.numel() > seg_len:
            raise TokenPruneError(
                f"TokenPruneState(start={self.start}, end={self.end}, full_length="
                f"{self.full_length}, seq_dim={self.seq_dim}) with indices {_describe(self.indices)}"
                " is inconsistent; pass the state prune_tokens returned"
            )

    @property
    def count(self) -> int:
        """Number of retained tokens; used to slice the compacted sequence."""
        return int(self.indices.numel())

    @property
    def compact_length(self) -> int:
        """Sequence length of the compacted tensor: tokens outside the segment plus kept ones."""
        return self.full_length - (self.end - self.start) + self.count


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"of shape {tuple(value.shape)}" if value.numel() > 8 else repr(value.tolist())
    return f"of type {type(value).__name__}"


def parse_score_method(method: TokenScoreMethod | str) -> TokenScoreMethod:
    try:
        return TokenScoreMethod(method)
    except ValueError:
        names = ", ".join(repr(m.value) for m in TokenScoreMethod)
        raise ConfigError(f"token score method {method!r} is unknown; use one of {names}") from None


def kept_count(length: int, keep_ratio: float) -> int:
    """Tokens kept out of `length`: ceil(keep_ratio * length), at least one."""
    bad = isinstance(keep_ratio, bool) or not isinstance(keep_ratio, (int, float))
    if bad or not 0.0 < keep_ratio <= 1.0:
        raise ConfigError(f"keep_ratio={keep_ratio!r} is invalid; pass a number in (0, 1]")
    return max(1, min(length, math.ceil(keep_ratio * length - 1e-9)))


def _is_index(value: object) -> bool:
    """An int (numpy and 0-d integer tensors included), not a bool or a float."""
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return not isinstance(value, bool)


def _seq_dim(tensor: torch.Tensor, seq_dim: int) -> int:
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(
            f"hidden_states must be a torch.Tensor, got {type(tensor).__name__}; pass the tokens"
        )
    if not _is_index(seq_dim):
        raise ConfigError(f"seq_dim={seq_dim!r} is invalid; pass the token dimension as an int")
    if not -tensor.dim() <= seq_dim < tensor.dim():
        raise ConfigError(
            f"seq_dim={seq_dim} is out of range for a tensor of shape {tuple(tensor.shape)}; "
            "pass the index of the token dimension"
        )
    return seq_dim % tensor.dim()


def _token_norms(tensor: torch.Tensor, seq_dim: int) -> torch.Tensor:
    length = tensor.shape[seq_dim]
    flat = tensor.detach().movedim(seq_dim, 0).reshape(length, -1)  # [L, rest]
    if flat.is_complex():  # .float() would drop the imaginary part
        flat = flat.abs()
    return flat.float().norm(dim=1)  # [L]


def _checked_velocity(
    velocity: object, hidden_states: torch.Tensor, dim: int, length: int
) -> torch.Tensor:
    """`previous_velocity` for the 'velocity' method: a real tensor with `length` tokens."""
    if (
        not isinstance(velocity, torch.Tensor)
        or velocity.dim() <= dim
        or velocity.shape[dim] != length
    ):
        got = (
            tuple(velocity.shape) if isinstance(velocity, torch.Tensor) else type(velocity).__name__
        )
        raise ConfigError(
            f"method 'velocity' needs previous_velocity with {count_of(length, 'token')} on dim {dim}, "
            f"got {got}; pass the previous step's velocity for the same tokens"
        )
    if velocity.is_meta and not hidden_states.is_meta:
        raise ConfigError(
            "method 'velocity' got previous_velocity on the meta device, which holds no "
            "values; pass the previous step's real velocity"
        )
    return velocity


def select_token_indices(
    hidden_states: torch.Tensor,
    keep_ratio: float,
    method: TokenScoreMethod | str = "feat_norm",
    seq_dim: int = 1,
    previous_velocity: torch.Tensor | None = None,
    random_seed: int = 42,
) -> torch.Tensor:
    """Return ascending indices (int64, on the input's device) of the tokens a policy keeps.

    The same indices apply to every batch element. Ties in score keep the earlier token.
    """
    kind = parse_score_method(method)
    dim = _seq_dim(hidden_states, seq_dim)
    length = hidden_states.shape[dim]
    if length == 0:
        raise ConfigError(
            f"hidden_states of shape {tuple(hidden_states.shape)} has no tokens on dim {dim}; "
            "pass at least one token (or skip pruning for an empty sequence)"
        )
    k = kept_count(length, keep_ratio)
    device = hidden_states.device
    if k == length:
        return torch.arange(length, device=device)
    if kind is TokenScoreMethod.RANDOM:
        if not _is_index(random_seed) or not -(2**63) <= random_seed < 2**63:
            raise ConfigError(
                f"random_seed={random_seed!r} is invalid; pass an int that fits in 64 bits"
            )
        generator = torch.Generator().manual_seed(random_seed)
        chosen = torch.randperm(length, generator=generator, device="cpu")[:k].sort().values
        if device.type == "cuda":  # pinned, so the copy does not wait for the queued GPU work
            return chosen.pin_memory().to(device, non_blocking=True)
        return chosen.to(device)
    if kind is TokenScoreMethod.VELOCITY:
        velocity = _checked_velocity(previous_velocity, hidden_states, dim, length)
        scores = _token_norms(velocity.to(device), dim)
    else:
        scores = _token_norms(hidden_states, dim)
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    return order.sort().values


def _segment(length: int, start: int, end: int | None) -> int:
    stop = length if end is None else end
    ints = _is_index(start) and _is_index(stop)
    if not ints or not 0 <= start < stop <= length:
        raise ConfigError(
            f"token segment [start={start}, end={end}) is invalid for {count_of(length, 'token')}; "
            "pass 0 <= start < end <= sequence length"
        )
    return stop


def prune_tokens(
    hidden_states: torch.Tensor,
    keep_ratio: float,
    method: TokenScoreMethod | str = "feat_norm",
    seq_dim: int = 1,
    start: int = 0,
    end: int | None = None,
    previous_velocity: torch.Tensor | None = None,
) -> tuple[torch.Tensor, TokenPruneState]:
    """Gather the selected part of the segment `[start, end)` before expensive blocks.

    Returns the compacted tensor (tokens before the segment, the kept segment tokens in order,
    tokens after the segment) and the state `restore_tokens` needs. `previous_velocity` may
    cover the whole sequence or only the segment.
    """
    dim = _seq_dim(hidden_states, seq_dim)
    length = hidden_states.shape[dim]
    stop = _segment(length, start, end)
    segment = hidden_states.narrow(dim, start, stop - start)
    velocity = previous_velocity
    whole = isinstance(velocity, torch.Tensor) and velocity.dim() > dim
    if whole and velocity.shape[dim] == length and stop - start != length:  # type: ignore[union-attr]
        velocity = velocity.narrow(dim, start, stop - start)  # type: ignore[union-attr]
    indices = select_token_indices(segment, keep_ratio, method, dim, velocity)
    pieces = [
        hidden_states.narrow(dim, 0, start),
        segment.index_select(dim, indices),
        hidden_states.narrow(dim, stop, length - stop),
    ]
    compact = torch.cat([p for p in pieces if p.shape[dim] > 0], dim=dim)
    return compact, TokenPruneState(indices, start, stop, length, dim)


def _base_segment(
    processed: torch.Tensor, state: TokenPruneState, compensation: torch.Tensor | None
) -> torch.Tensor:
    dim, seg_len = state.seq_dim, state.end - state.start
    shape = list(processed.shape)
    shape[dim] = seg_len
    if compensation is None:
        return processed.new_zeros(shape)
    comp = compensation
    if comp.dim() == processed.dim() and comp.shape[dim] == state.full_length:
        comp = comp.narrow(dim, state.start, seg_len)
    if list(comp.shape) != shape:
        raise TokenPruneError(
            f"compensation of shape {tuple(compensation.shape)} does not fit segment shape "
            f"{tuple(shape)}; pass the previous full sequence or segment in the original layout"
        )
    if comp.is_meta and not processed.is_meta:
        raise TokenPruneError(
            "compensation is on the meta device, which holds no values; pass the previous "
            "step's real sequence or None to zero-fill"
        )
    return comp.to(device=processed.device, dtype=processed.dtype)


def restore_tokens(
    processed: torch.Tensor,
    state: TokenPruneState,
    compensation: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scatter processed tokens back to full length; dropped ones come from `compensation`.

    `compensation` is the previous full sequence (or only its segment) in the original tensor
    layout; without it, dropped tokens are zero-filled. Differentiable in `processed`.
    """
    if not isinstance(state, TokenPruneState):
        raise TokenPruneError(
            f"restore_tokens got state {_describe(state)}; pass the TokenPruneState that "
            "prune_tokens returned"
        )
    for name, value in (("processed", processed), ("compensation", compensation)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TokenPruneError(
                f"restore_tokens got {name} of type {type(value).__name__}; pass a torch.Tensor"
            )
    dim = state.seq_dim
    if processed.dim() <= dim or processed.shape[dim] != state.compact_length:
        raise TokenPruneError(
            f"processed tensor of shape {tuple(processed.shape)} does not have "
            f"{count_of(state.compact_length, 'token')} on dim {dim}; pass the output for the pruned input"
        )
    kept = processed.narrow(dim, state.start, state.count)
    segment = _base_segment(processed, state, compensation).index_copy(
        dim, state.indices.to(processed.device), kept
    )
    tail = state.full_length - state.end
    pieces = [
        processed.narrow(dim, 0, state.start),
        segment,
        processed.narrow(dim, state.start + state.count, tail),
    ]
    return torch.cat([p for p in pieces if p.shape[dim] > 0], dim=dim)
