"""Step bookkeeping shared by the cross-step caches: events, step checks, output trees.

Owns: `CacheEvent` (one record per cached step), the reason codes events carry, validation of
step indices and cache options, and the small tree walk that detaches, replays and
extrapolates nested outputs (tensors inside tuples, lists and dicts).
Must not know: which policy decides a hit (see `caches`), modules, profiles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from flextensor_runtime.errors import CacheUsageError, ConfigError

__all__ = [
    "REASONS",
    "CacheEvent",
    "StepLog",
    "check_count",
    "detach_tree",
    "extrapolate_tree",
    "map_tree",
    "same_layout",
]

# reason code -> what it means; every CacheEvent.reason is one of these keys
REASONS: Mapping[str, str] = MappingProxyType(
    {
        "dense-first": "one of the first `dense_first` steps: always computed",
        "dense-last": "one of the last `dense_last` steps: always computed",
        "warmup": "one of the first `warmup_steps` steps: always computed",
        "not-skipped": "step is not in `skip_steps`: computed",
        "no-seed": "no dense output stored yet (first call or after reset): computed",
        "autograd": "autograd is enabled: caches never replay under autograd, computed",
        "signal-shape": "the signal changed shape or device since the last step: computed, accumulator reset",
        "threshold": "accumulated change reached `threshold`: computed, accumulator reset",
        "hit-cap": "`max_consecutive_hits` replays in a row: computed, accumulator reset",
        "replayed": "hit: the last dense output was returned",
        "extrapolated": "hit: first-order extrapolation from the two latest dense outputs",
        "below-threshold": "hit: accumulated change is below `threshold`, last residual replayed",
        "no-step": "called outside a step (installation without set_step): computed, not cached",
    }
)


@dataclass(frozen=True)
class CacheEvent:
    """What a cache did at one step: `hit` (replayed) or not, and why (a key of `REASONS`).

    `accumulated` is the adaptive cache's accumulated normalised change after this step's
    decision (None for the fixed-step cache and for steps where no change was measured).
    """

    step: int
    hit: bool
    reason: str
    accumulated: float | None = None


def check_count(name: str, value: object, minimum: int = 0, *, optional: bool = False) -> None:
    """Raise ConfigError unless `value` is an int >= minimum (or None when optional)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} is invalid; pass an integer >= {minimum}")


class StepLog:
    """Events of one trajectory plus the step-order and total-steps checks both caches share."""

    def __init__(self, owner: str, total_steps: int | None) -> None:
        check_count("total_steps", total_steps, 1, optional=True)
        self.owner = owner
        self.total_steps = total_steps
        self.events: list[CacheEvent] = []
        self.last_step: int | None = None

    def begin(self, step: int, total_steps: int | None, dense_last: int) -> int | None:
        """Validate `step` against order and total; return the effective total (or None)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CacheUsageError(f"{self.owner}.run got step={step!r}; pass an integer >= 0")
        check_count("total_steps", total_steps, 1, optional=True)
        total = self.total_steps if total_steps is None else total_steps
        if total is not None and step >= total:
            raise CacheUsageError(
                f"{self.owner}.run got step={step} but total_steps={total}; "
                "pass the step index in range(total_steps)"
            )
        if self.last_step is not None and step < self.last_step:
            raise CacheUsageError(
                f"{self.owner}.run got step={step} after step={self.last_step}; call reset() "
                "between trajectories so stored outputs do not leak into the next one"
            )
        if total is None and dense_last > 0:
            raise CacheUsageError(
                f"{self.owner} needs total_steps to keep the last {dense_last} step(s) dense; "
                "pass total_steps= to the constructor or run(), or set dense_last=0"
            )
        self.last_step = step
        return total

    def add(self, step: int, hit: bool, reason: str, accumulated: float | None = None) -> None:
        assert reason in REASONS, reason
        self.events.append(CacheEvent(step, hit, reason, accumulated))

    def reset(self) -> None:
        self.events = []
        self.last_step = None


def map_tree(fn: Callable[..., Any], *trees: Any) -> Any:
    """Apply `fn` to matching tensor leaves of same-shaped trees; other leaves come from trees[0]."""
    first = trees[0]
    if isinstance(first, torch.Tensor):
        return fn(*trees)
    if isinstance(first, (tuple, list)):
        items = [map_tree(fn, *parts) for parts in zip(*trees, strict=True)]
        if hasattr(first, "_fields"):  # namedtuple
            return type(first)(*items)
        return type(first)(items)
    if isinstance(first, Mapping):
        mapped = {k: map_tree(fn, *(t[k] for t in trees)) for k in first}
        container: Any = type(first)
        try:
            return container(**mapped)  # dataclass-like output containers
        except TypeError:
            return container(mapped)
    return first


def same_layout(a: Any, b: Any) -> bool:
    """True when the two trees hold tensors of the same shapes and devices at the same places."""
    same: list[bool] = []

    def compare(x: torch.Tensor, y: Any) -> None:
        ok = isinstance(y, torch.Tensor) and x.shape == y.shape and x.device == y.device
        same.append(ok)

    try:
        map_tree(compare, a, b)
    except (ValueError, KeyError, TypeError):  # different lengths, keys or containers
        return False
    return all(same)


def detach_tree(tree: Any) -> Any:
    """The same tree with every tensor detached (no copy): stored outputs never hold a graph.
    A tensor outside any graph is kept as it is, so a replay returns the dense output's own
    tensor objects."""
    return map_tree(lambda t: t if t.grad_fn is None and not t.requires_grad else t.detach(), tree)


def extrapolate_tree(last: Any, previous: Any, factor: float) -> Any:
    """`last + factor * (last - previous)` on every floating (or complex) tensor leaf; integer
    and bool leaves (indices, masks) are `last`'s, unchanged: their dtype is kept and a
    fractional index has no meaning."""

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.is_floating_point() or a.is_complex():
            return a + (a - b) * factor
        return a

    return map_tree(step, last, previous)
