"""Token pruning: the public home of the token pruning API and its stateful `TokenPruner`.

Owns: `TokenPruner`, which adds previous-step compensation to the stateless functions of
`token_select` (re-exported here): its first call per key records a dense segment, later calls
prune, and each restore fills dropped tokens from the previous step's full output.
Must not know: models, schedulers or caches; keys are opaque (one per branch, e.g. "cond").
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from flextensor_runtime.errors import ConfigError, TokenPruneError
from flextensor_runtime.token_select import (
    TokenPruneState,
    TokenScoreMethod,
    kept_count,
    parse_score_method,
    prune_tokens,
    restore_tokens,
    select_token_indices,
)

__all__ = [
    "TokenPruneState",
    "TokenPruner",
    "TokenScoreMethod",
    "prune_tokens",
    "restore_tokens",
    "select_token_indices",
]


class TokenPruner:
    """Stateful previous-step compensation for repeated denoising calls.

    Per key (one per branch, e.g. conditional and unconditional): the first `prune` returns the
    input unchanged with state None (a dense seed) and the paired `restore` records the output as
    compensation; later prunes keep `keep_ratio` of the segment and the paired restore fills the
    dropped tokens from the previous step's restored output. Every prune must be followed by a
    restore with the same key before the next prune of that key. A change of input shape, or
    `reset(key)`, makes the next call a dense seed again. With method "velocity" the previous
    velocity of a token is its last update by the pruned blocks (output minus input), which
    needs blocks whose output has the input's shape.
    """

    def __init__(self, keep_ratio: float, method: TokenScoreMethod | str = "feat_norm") -> None:
        kept_count(1, keep_ratio)  # validates the ratio
        self.keep_ratio = float(keep_ratio)
        self.method = parse_score_method(method)
        self._compensation: dict[Hashable, torch.Tensor] = {}
        self._velocity: dict[Hashable, torch.Tensor] = {}
        self._input: dict[Hashable, torch.Tensor] = {}  # method "velocity" only
        self._shape: dict[Hashable, torch.Size] = {}
        self._pending: dict[Hashable, TokenPruneState | None] = {}  # key -> state prune returned

    def prune(
        self,
        hidden_states: torch.Tensor,
        key: object = "default",
        seq_dim: int = 1,
        start: int = 0,
        end: int | None = None,
    ) -> tuple[torch.Tensor, TokenPruneState | None]:
        """Prune after a dense seed call; the first use per key only records compensation."""
        k = self._key(key)
        if k in self._pending:
            raise TokenPruneError(
                f"TokenPruner.prune(key={key!r}) called again before restore(); pair every "
                f"prune with restore(processed, state, key={key!r})"
            )
        compact, state = self._prune(k, hidden_states, seq_dim, start, end)
        self._pending[k] = state
        return compact, state

    def _prune(
        self, k: Hashable, hidden_states: torch.Tensor, seq_dim: int, start: int, end: int | None
    ) -> tuple[torch.Tensor, TokenPruneState | None]:
        if not isinstance(hidden_states, torch.Tensor):
            raise ConfigError(
                f"TokenPruner.prune got {type(hidden_states).__name__}; pass a torch.Tensor"
            )
        previous_shape = self._shape.get(k)
        self._shape[k] = hidden_states.shape
        if self.method is TokenScoreMethod.VELOCITY:
            self._input[k] = hidden_states.detach().clone()
        if previous_shape != hidden_states.shape or k not in self._compensation:
            self._drop(k)
            return hidden_states, None
        velocity = None
        if self.method is TokenScoreMethod.VELOCITY:
            velocity = self._velocity.get(k)
            if velocity is None:
                raise TokenPruneError(
                    f"TokenPruner(method='velocity') key={k!r}: the pruned blocks change the "
                    "tensor shape, so no velocity exists; use method 'feat_norm' or 'random'"
                )
        return prune_tokens(
            hidden_states, self.keep_ratio, self.method, seq_dim, start, end, velocity
        )

    def restore(
        self, processed: torch.Tensor, state: TokenPruneState | None, key: object = "default"
    ) -> torch.Tensor:
        """Scatter a pruned step, or snapshot the dense seed as the next compensation."""
        k = self._key(key)
        if k not in self._pending:
            raise TokenPruneError(
                f"TokenPruner.restore(key={key!r}) has no pending prune; call "
                f"prune(hidden_states, key={key!r}) first and pass its state here"
            )
        if state is not self._pending[k]:
            raise TokenPruneError(
                f"TokenPruner.restore(key={key!r}) got state {state!r:.60}, not the one "
                f"prune(key={key!r}) returned; pass that state unchanged"
            )
        if not isinstance(processed, torch.Tensor):
            raise TokenPruneError(
                f"TokenPruner.restore got processed of type {type(processed).__name__}; pass the "
                "blocks' output tensor"
            )
        if state is None:
            full = processed
        else:  # a failure here keeps the prune pending, so a corrected restore can follow
            full = restore_tokens(processed, state, self._compensation.get(k))
        del self._pending[k]
        self._compensation[k] = full.detach()
        if self.method is TokenScoreMethod.VELOCITY:
            inp = self._input[k]
            if inp.shape == full.shape:
                self._velocity[k] = full.detach() - inp.to(full.device, full.dtype)
            else:
                self._velocity.pop(k, None)
        return full

    def reset(self, key: object | None = None) -> None:
        """Drop compensation for one branch, or every branch when `key` is omitted."""
        if key is None:
            for store in (self._compensation, self._velocity, self._input, self._shape):
                store.clear()
            self._pending.clear()
            return
        k = self._key(key)
        self._drop(k)
        self._shape.pop(k, None)
        self._input.pop(k, None)
        self._pending.pop(k, None)

    def _drop(self, k: Hashable) -> None:
        self._compensation.pop(k, None)
        self._velocity.pop(k, None)

    @staticmethod
    def _key(key: object) -> Hashable:
        if not isinstance(key, Hashable):
            raise TokenPruneError(f"TokenPruner key {key!r} is not hashable; pass a str or int")
        return key
