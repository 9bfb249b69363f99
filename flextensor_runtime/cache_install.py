"""Install a cross-step cache on one module's forward, as a `caches` profile section asks.

Owns: `install_cache`, the removable `CacheInstallation` (the caller advances the step with
`set_step(step, total_steps)` or `with installation.step(...)`) and its `CacheReport`.
Each forward call inside a step is one *branch* (the first call is branch 0, a second call in
the same step, e.g. the unconditional pass of classifier-free guidance, is branch 1) and every
branch has its own cache, so branches never replay each other's outputs.
Must not know: the profile wire format, offloading, schedulers.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flextensor_runtime.cache_config import AdaptiveResidualPolicy, CacheSection
from flextensor_runtime.caches import AdaptiveResidualCache, FixedStepCache
from flextensor_runtime.errors import CacheUsageError, ConfigError, InstallError

__all__ = ["CacheInstallation", "CacheReport", "install_cache"]

_MARK = "__flextensor_cache__"


@dataclass(frozen=True)
class CacheReport:
    """Counts over the installation's lifetime: every forward call is a hit or a miss (dense),
    and each carries a reason (see `flextensor_runtime.cache_steps.REASONS`).
    `trajectories` counts started trajectories; `host_syncs` the hit decisions' device reads."""

    module: str
    policy: str
    hits: int
    misses: int
    reasons: Mapping[str, int] = field(default_factory=dict)
    trajectories: int = 0
    host_syncs: int = 0

    @property
    def calls(self) -> int:
        return self.hits + self.misses

    def summary(self) -> str:
        """One line, e.g. `transformer fixed-step: 8/20 calls replayed; dense-first 1, ...`."""
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        name = self.module or "<model>"
        return f"{name} {self.policy}: {self.hits}/{self.calls} calls replayed; {reasons}"


def _primary(out: Any) -> torch.Tensor:
    """The main tensor of a forward output: itself, the first item, or the first field."""
    first = out
    if isinstance(out, (tuple, list)) and out:
        first = out[0]
    elif isinstance(out, Mapping) and out:
        first = next(iter(out.values()))
    if not isinstance(first, torch.Tensor):
        raise CacheUsageError(
            f"adaptive-residual cannot find the output tensor in a {type(out).__name__}; "
            "cache a module returning a tensor, a tuple or an output object, or use fixed-step"
        )
    return first


def _with_primary(template: Any, tensor: torch.Tensor) -> Any:
    if isinstance(template, torch.Tensor):
        return tensor
    if isinstance(template, (tuple, list)):
        items = [tensor, *template[1:]]
        return type(template)(*items) if hasattr(template, "_fields") else type(template)(items)
    key = next(iter(template))
    container: Any = type(template)
    return container(**{**template, key: tensor})


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _named_signature(forward: Callable[..., Any]) -> inspect.Signature:
    """`inspect.signature(forward)`; where it names no argument (`forward(*args, **kwargs)`) and
    belongs to a module that passes its calls to a wrapped `.module` (a VRAM wrapper such as
    `AutoWrappedModule`, or `DataParallel`), the wrapped module's forward's, so a named signal
    passed positionally is found."""
    signature = inspect.signature(forward)
    for _ in range(8):  # wrappers of wrappers, a few deep
        inner = getattr(getattr(forward, "__self__", None), "module", None)
        named = any(p.kind not in _VARIADIC for p in signature.parameters.values())
        if named or not isinstance(inner, nn.Module):
            break
        forward = inner.forward
        signature = inspect.signature(forward)
    return signature


class _Arguments:
    """Find a forward argument by name or position, however the caller passed it."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        try:
            self.signature: inspect.Signature | None = _named_signature(forward)
        except (TypeError, ValueError):
            self.signature = None

    def get(self, spec: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        value = self._find(spec, args, kwargs)
        if not isinstance(value, torch.Tensor):
            raise CacheUsageError(
                f"cached forward argument {spec!r} is {type(value).__name__}, not a tensor; "
                "set 'signal'/'residual_input' to a tensor argument's name or position"
            )
        return value

    def _find(self, spec: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound: dict[str, Any] = {}
        named: list[str] = []
        if self.signature is not None:
            named = [n for n, p in self.signature.parameters.items() if p.kind not in _VARIADIC]
            try:
                bound = dict(self.signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                bound = {}
        if spec.isdigit():
            index = int(spec)
            if index < len(named):
                return bound.get(named[index])
            return args[index] if index < len(args) else None  # forward(*args)
        return bound.get(spec) if spec in named else kwargs.get(spec)  # forward(**kwargs)


class CacheInstallation:
    """A cache serving one module's forward. Advance steps with `set_step` or `step`.

    Calls outside a step (before the first `set_step`, or after a `step` block ends) run the
    original forward and count as misses with reason "no-step". A `set_step` with a lower step
    than the previous one starts a new trajectory: every branch cache is reset. Call `reset()`
    yourself when a new trajectory starts at the same or a higher step index.
    """

    def __init__(self, model: nn.Module, section: CacheSection) -> None:
        if not isinstance(model, nn.Module) or not isinstance(section, CacheSection):
            raise ConfigError(
                f"install_cache got {type(model).__name__} and {type(section).__name__}; pass "
                "the model and a CacheSection (see parse_cache_section)"
            )
        self.section = section
        try:
            self.module = model.get_submodule(section.module)
        except AttributeError:
            raise InstallError(
                f"caches section names module {section.module!r}, which the model lacks; "
                "use a dotted path from model.named_modules() ('' for the model itself)"
            ) from None
        current = self.module.forward
        if getattr(current, _MARK, None) is not None:
            raise InstallError(
                f"module {section.module!r} already has a cache installed; call remove() first"
            )
        self._original = current
        self._saved = self.module.__dict__.get("forward", _MARK)
        self._arguments = _Arguments(current)
        self.caches: list[FixedStepCache | AdaptiveResidualCache] = []
        self._templates: list[Any] = []
        self._step: int | None = None  # None: outside a step, calls are not cached
        self._last_step: int | None = None
        self._total: int | None = None
        self._branch = 0
        self._counts: Counter[str] = Counter()
        self._hits = 0
        self._trajectories = 0
        self._fresh = True  # the next set_step starts a trajectory
        self._removed = False

        @functools.wraps(current)
        def cached_forward(*args: Any, **kwargs: Any) -> Any:
            return self._call(args, kwargs)

        setattr(cached_forward, _MARK, self)
        self._wrapper = cached_forward
        self.module.forward = cached_forward  # type: ignore[method-assign]

    @property
    def installed(self) -> bool:
        return self.module.__dict__.get("forward") is self._wrapper

    def set_step(self, step: int, total_steps: int | None = None) -> None:
        """Start denoising step `step` of `total_steps` (needed unless the section has it)."""
        total = self.section.policy.total_steps if total_steps is None else total_steps
        if total is None and self.section.policy.dense_last > 0:
            raise CacheUsageError(
                f"set_step({step}) needs total_steps to keep the last "
                f"{self.section.policy.dense_last} step(s) dense; pass set_step(step, total_steps)"
            )
        if self._last_step is not None and step < self._last_step:
            self.reset()
        if self._fresh:
            self._trajectories += 1
            self._fresh = False
        self._step, self._last_step, self._total, self._branch = step, step, total, 0

    @contextmanager
    def step(self, step: int, total_steps: int | None = None) -> Iterator[CacheInstallation]:
        """`with installation.step(i, n): model(...)`; calls after the block are not cached."""
        self.set_step(step, total_steps)
        try:
            yield self
        finally:
            self._step = None

    def reset(self) -> None:
        """Forget stored outputs of every branch; calls are uncached until the next `set_step`,
        which starts a new trajectory."""
        for cache in self.caches:
            cache.reset()
        self._templates = [None] * len(self._templates)
        self._step = self._last_step = None
        self._fresh = True

    def report(self) -> CacheReport:
        """Hits, misses and reasons since installation."""
        return CacheReport(
            module=self.section.module,
            policy=self.section.policy_name,
            hits=self._hits,
            misses=sum(self._counts.values()) - self._hits,
            reasons=dict(self._counts),
            trajectories=self._trajectories,
            host_syncs=sum(c.host_syncs for c in self.caches),
        )

    def remove(self) -> bool:
        """Restore the original forward exactly; False if already removed."""
        if self._removed:
            return False
        if not self.installed:
            raise InstallError(
                f"module {self.section.module!r} got another forward wrapper after the cache; "
                "remove that wrapper first, then the cache"
            )
        self._removed = True
        if self._saved is _MARK:
            del self.module.__dict__["forward"]
        else:
            self.module.forward = self._saved  # type: ignore[method-assign]
        return True

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._step is None:
            self._counts["no-step"] += 1
            return self._original(*args, **kwargs)
        branch, self._branch = self._branch, self._branch + 1
        while len(self.caches) <= branch:
            self.caches.append(self.section.policy.make_cache())
            self._templates.append(None)
        cache = self.caches[branch]
        if isinstance(cache, FixedStepCache):
            out = cache.run(self._step, lambda: self._original(*args, **kwargs), self._total)
        else:
            out = self._adaptive(branch, cache, args, kwargs)
        event = cache.events[-1]
        self._counts[event.reason] += 1
        self._hits += int(event.hit)
        return out

    def _adaptive(
        self,
        branch: int,
        cache: AdaptiveResidualCache,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        policy = self.section.policy
        assert isinstance(policy, AdaptiveResidualPolicy)
        signal = self._arguments.get(policy.signal, args, kwargs)
        base = None
        if policy.residual_input is not None:
            base = self._arguments.get(policy.residual_input, args, kwargs)

        def compute_residual() -> torch.Tensor:
            out = self._original(*args, **kwargs)
            self._templates[branch] = out
            main = _primary(out)
            return main if base is None else main - base

        residual = cache.run(self._step or 0, signal, compute_residual, self._total)
        if not cache.events[-1].hit:
            return self._templates[branch]
        value = residual if base is None else base + residual
        return _with_primary(self._templates[branch], value)


def install_cache(model: nn.Module, section: CacheSection) -> CacheInstallation:
    """Wrap `section.module`'s forward so the section's cache policy serves it.

    The wrapper is an instance attribute `forward` on that module; `remove()` deletes it again
    (or restores a previous instance attribute), so the original forward is back exactly.
    Install after any wrapper that should be skipped on hits (e.g. weight streaming on the
    module's children): a hit never runs the original forward.
    """
    return CacheInstallation(model, section)
