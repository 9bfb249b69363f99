"""Cross-step caches: reuse a denoiser's output (or residual) on some diffusion steps.

Owns: `FixedStepCache` (replay or extrapolate on an explicit set of steps) and
`AdaptiveResidualCache` (replay the last residual while the accumulated change of a cheap
signal stays under a threshold). Both trade compute for an approximation; every call appends a
`CacheEvent` saying whether it was a hit and why, so an integration can audit what was used.

Rules both follow:
- never replay while autograd is enabled (the step is computed, reason "autograd");
- steps of one trajectory must not go backwards: call `reset()` between trajectories, otherwise
  the previous trajectory's outputs would become state for the next one (a step lower than the
  previous raises CacheUsageError instead);
- boundary steps (`dense_first`/`warmup_steps` and `dense_last`) are always computed.
Host syncs per step: `FixedStepCache` decides on the host from step indices only (none);
`AdaptiveResidualCache` reads one scalar per non-boundary step (one sync when the signal lives on
an accelerator, none when it is a CPU tensor, e.g. the timestep or sigma schedule).
Must not know: modules, profiles or how the step loop is driven (see `cache_section`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from flextensor_runtime.cache_steps import (
    CacheEvent,
    StepLog,
    check_count,
    detach_tree,
    extrapolate_tree,
    same_layout,
)
from flextensor_runtime.errors import CacheUsageError, ConfigError

__all__ = ["AdaptiveResidualCache", "CacheEvent", "FixedStepCache"]

T = TypeVar("T")


def _check_float(
    name: str, value: object, minimum: float, *, strict: bool = False, finite: bool = False
) -> float:
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    x = float(value) if number else float("nan")  # type: ignore[arg-type]
    in_range = x > minimum if strict else x >= minimum  # False for NaN
    if not in_range or (finite and abs(x) == float("inf")):
        relation = ">" if strict else ">="
        bound = "" if minimum == float("-inf") else f" {relation} {minimum}"
        kind = "a finite number" if finite else "a number"
        raise ConfigError(f"{name}={value!r} is invalid; pass {kind}{bound}")
    return x


class _LoggedSteps:
    """What both caches expose from their `StepLog`: the trajectory length and the events."""

    _log: StepLog

    @property
    def total_steps(self) -> int | None:
        return self._log.total_steps

    @property
    def events(self) -> list[CacheEvent]:
        """One event per `run` since construction or the last `reset()`, in call order."""
        return self._log.events


class FixedStepCache(_LoggedSteps):
    """Reuse a previous denoiser output on an explicit set of steps.

    `delta_scale=0` replays the last dense output. A non-zero value extrapolates to first order
    from the two latest dense outputs `a` (at step s_a) and `b` (at s_b < s_a):
    `a + delta_scale * (step - s_a) / (s_a - s_b) * (a - b)`, so `delta_scale=1` continues the
    line through them. With one dense output so far, it is replayed. The first `dense_first` and
    the last `dense_last` steps are always computed; `dense_last > 0` needs `total_steps` (here
    or in `run`). Replayed outputs are the stored objects: do not modify them in place.
    """

    def __init__(
        self,
        skip_steps: Iterable[int] = (),
        delta_scale: float = 0.0,
        dense_first: int = 1,
        dense_last: int = 1,
        total_steps: int | None = None,
    ) -> None:
        if isinstance(skip_steps, (str, bytes)) or not isinstance(skip_steps, Iterable):
            raise ConfigError(
                f"skip_steps={skip_steps!r} is invalid; pass a collection of step indices, "
                "e.g. {1, 3}"
            )
        steps = frozenset(skip_steps)
        for s in steps:
            check_count("skip_steps entry", s, 0)
        check_count("dense_first", dense_first, 0)
        check_count("dense_last", dense_last, 0)
        self.skip_steps = steps
        self.delta_scale = _check_float("delta_scale", delta_scale, float("-inf"), finite=True)
        self.dense_first = dense_first
        self.dense_last = dense_last
        self._log = StepLog("FixedStepCache", total_steps)
        unreachable = sorted(s for s in steps if total_steps is not None and s >= total_steps)
        if unreachable:
            raise ConfigError(
                f"skip_steps {unreachable} are outside total_steps={total_steps}; pass step "
                "indices in range(total_steps)"
            )
        self._outputs: list[tuple[int, Any]] = []  # up to two (step, output), oldest first

    @property
    def host_syncs(self) -> int:
        """Device-to-host syncs spent on hit decisions: always 0 (decided from step indices)."""
        return 0

    def reset(self) -> None:
        """Drop stored outputs and events so the next `run` is a seed, not a stale hit."""
        self._outputs = []
        self._log.reset()

    def run(self, step: int, compute: Callable[[], T], total_steps: int | None = None) -> T:
        """Compute or replay one step's output; appends one event to `events`."""
        if not callable(compute):
            raise CacheUsageError(
                f"FixedStepCache.run got compute of type {type(compute).__name__}; pass a "
                "zero-argument callable that computes the output"
            )
        listed = isinstance(step, int) and step in self.skip_steps
        needs_total = self.dense_last if listed else 0
        total = self._log.begin(step, total_steps, needs_total)
        reason = self._dense_reason(step, total)
        if reason is not None:
            out = compute()
            # keep one output unless extrapolating; a repeated step replaces its own output
            kept = [o for o in self._outputs if o[0] != step][-1:] if self.delta_scale else []
            stored = detach_tree(out)
            if kept and not same_layout(kept[0][1], stored):  # e.g. a new resolution
                kept = []  # extrapolating across layouts is undefined: replay the new output
            self._outputs = [*kept, (step, stored)]
            self._log.add(step, False, reason)
            return out
        (last_step, last), *_ = self._outputs[-1:]
        if self.delta_scale == 0.0 or len(self._outputs) < 2:
            self._log.add(step, True, "replayed")
            return last  # type: ignore[no-any-return]
        prev_step, prev = self._outputs[0]
        factor = self.delta_scale * (step - last_step) / (last_step - prev_step)
        self._log.add(step, True, "extrapolated")
        return extrapolate_tree(last, prev, factor)  # type: ignore[no-any-return]

    def _dense_reason(self, step: int, total: int | None) -> str | None:
        if step < self.dense_first:
            return "dense-first"
        if total is not None and step >= total - self.dense_last:
            return "dense-last"
        if step not in self.skip_steps:
            return "not-skipped"
        if torch.is_grad_enabled():
            return "autograd"
        if not self._outputs:
            return "no-seed"
        return None


class AdaptiveResidualCache(_LoggedSteps):
    """Reuse a model residual while accumulated input change stays small.

    Warm up densely, estimate the normalised change of a cheap `signal` between consecutive
    steps (`mean|s - s_prev| / (mean|s_prev| + eps)` over every `subsample`-th element),
    accumulate it across steps, and replay the last dense residual until the accumulated value
    reaches `threshold` or `max_consecutive_hits` replays happened in a row; a dense step resets
    the accumulator. `compute_residual` returns what to reuse (e.g. `block_out - block_in`); the
    caller adds it back. One host sync per decided step when `signal` is on an accelerator
    (see `host_syncs`); pass a CPU signal for a sync-free decision.
    """

    def __init__(
        self,
        threshold: float,
        warmup_steps: int = 1,
        max_consecutive_hits: int = 3,
        dense_last: int = 1,
        total_steps: int | None = None,
        subsample: int = 1,
        eps: float = 1e-06,
    ) -> None:
        # threshold=0 would make every step dense: a cache that never hits
        self.threshold = _check_float("threshold", threshold, 0.0, strict=True)
        check_count("warmup_steps", warmup_steps, 0)
        check_count("max_consecutive_hits", max_consecutive_hits, 0)
        check_count("dense_last", dense_last, 0)
        check_count("subsample", subsample, 1)
        self.eps = _check_float("eps", eps, 0.0, strict=True, finite=True)
        self.warmup_steps = warmup_steps
        self.max_consecutive_hits = max_consecutive_hits
        self.dense_last = dense_last
        self.subsample = subsample
        self._log = StepLog("AdaptiveResidualCache", total_steps)
        self._host_syncs = 0
        self._clear()

    def _clear(self) -> None:
        self._residual: torch.Tensor | None = None
        self._signal: torch.Tensor | None = None
        self._accumulated = 0.0
        self._consecutive_hits = 0

    @property
    def host_syncs(self) -> int:
        """Device-to-host syncs spent on hit decisions since construction (not cleared by reset)."""
        return self._host_syncs

    def reset(self) -> None:
        """Clear residual, signal, accumulator and events so a new clip cannot reuse the last one."""
        self._clear()
        self._log.reset()

    def run(
        self,
        step: int,
        signal: torch.Tensor,
        compute_residual: Callable[[], torch.Tensor],
        total_steps: int | None = None,
    ) -> torch.Tensor:
        """Return a dense or cached residual for one denoising step; appends one event."""
        if not callable(compute_residual) or not isinstance(signal, (torch.Tensor, int, float)):
            raise CacheUsageError(
                f"AdaptiveResidualCache.run got signal of type {type(signal).__name__} and "
                f"compute_residual of type {type(compute_residual).__name__}; pass a tensor "
                "signal and a zero-argument callable returning the residual tensor"
            )
        if isinstance(signal, torch.Tensor) and (signal.is_meta or signal.is_complex()):
            what = "on the meta device, which holds no values" if signal.is_meta else "complex"
            raise CacheUsageError(
                f"AdaptiveResidualCache.run got a signal {what}; pass a real-valued tensor "
                "(e.g. the timestep or the block input)"
            )
        total = self._log.begin(step, total_steps, self.dense_last)
        current = torch.as_tensor(signal).detach().reshape(-1)[:: self.subsample].clone()
        previous, self._signal = self._signal, current
        reason = self._boundary_reason(step, total)
        accumulated: float | None = None
        if reason is None:
            reason, accumulated = self._decide(current, previous)
        if reason is None and self._residual is not None:
            self._accumulated = accumulated or 0.0
            self._consecutive_hits += 1
            self._log.add(step, True, "below-threshold", accumulated)
            return self._residual
        residual = compute_residual()
        if not isinstance(residual, torch.Tensor):
            raise CacheUsageError(
                f"AdaptiveResidualCache compute_residual returned {type(residual).__name__}; "
                "return the residual as a tensor (e.g. block_out - block_in)"
            )
        self._residual = residual.detach()
        self._accumulated = 0.0
        self._consecutive_hits = 0
        self._log.add(step, False, reason or "no-seed", accumulated)
        return residual

    def _boundary_reason(self, step: int, total: int | None) -> str | None:
        if step < self.warmup_steps:
            return "warmup"
        if total is not None and step >= total - self.dense_last:
            return "dense-last"
        if torch.is_grad_enabled():
            return "autograd"
        return None

    def _decide(
        self, current: torch.Tensor, previous: torch.Tensor | None
    ) -> tuple[str | None, float | None]:
        """(reason to compute or None for a hit, accumulated change after this step)."""
        if previous is None or self._residual is None:
            return "no-seed", None
        if previous.shape != current.shape or previous.device != current.device:
            return "signal-shape", None
        accumulated = self._accumulated + self._change(current, previous)
        if not accumulated < self.threshold:  # NaN (a non-finite signal) computes too
            return "threshold", accumulated
        if self._consecutive_hits >= self.max_consecutive_hits:
            return "hit-cap", accumulated
        return None, accumulated

    def _change(self, current: torch.Tensor, previous: torch.Tensor) -> float:
        cur, prev = current.float(), previous.float()
        ratio = (cur - prev).abs().mean() / (prev.abs().mean() + self.eps)
        if ratio.device.type != "cpu":
            self._host_syncs += 1
        return float(ratio.item())
