"""The `caches` profile section as data: policies, parsing, writing and the CLI spec syntax.

Owns: `CacheSection` and its two policies (`FixedStepPolicy`, `AdaptiveResidualPolicy`), the
mapping to and from plain msgpack data (`parse_cache_section`, `cache_section_to_data`) and
the one-line spec syntax of `ftc profile --cache` (`parse_cache_spec`). Values are validated
by building the cache they describe, so the section and the cache classes cannot disagree.
Must not know: modules or forwards (see `cache_install`), the rest of the profile format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from flextensor_runtime.caches import AdaptiveResidualCache, FixedStepCache
from flextensor_runtime.errors import ConfigError

__all__ = [
    "POLICIES",
    "AdaptiveResidualPolicy",
    "CacheSection",
    "FixedStepPolicy",
    "cache_section_to_data",
    "parse_cache_section",
    "parse_cache_spec",
]

_WHERE = "profile section 'caches'"


@dataclass(frozen=True)
class FixedStepPolicy:
    """Options of `FixedStepCache` (policy name "fixed-step")."""

    skip_steps: tuple[int, ...] = ()
    delta_scale: float = 0.0
    dense_first: int = 1
    dense_last: int = 1
    total_steps: int | None = None

    def __post_init__(self) -> None:
        self.make_cache()  # validates
        object.__setattr__(self, "skip_steps", tuple(sorted(set(self.skip_steps))))

    def make_cache(self) -> FixedStepCache:
        """A fresh cache with these options."""
        return FixedStepCache(
            self.skip_steps, self.delta_scale, self.dense_first, self.dense_last, self.total_steps
        )


@dataclass(frozen=True)
class AdaptiveResidualPolicy:
    """Options of `AdaptiveResidualCache` (policy name "adaptive-residual") plus its wiring.

    `signal`: the forward argument used as the cheap signal, by name or position ("0" = first).
    `residual_input`: the argument subtracted from the output (the cached value is then
    `output - input` and a replay adds the current input back); None caches the output itself.
    """

    threshold: float
    warmup_steps: int = 1
    max_consecutive_hits: int = 3
    dense_last: int = 1
    total_steps: int | None = None
    subsample: int = 1
    eps: float = 1e-6
    signal: str = "0"
    residual_input: str | None = None

    def __post_init__(self) -> None:
        self.make_cache()  # validates
        for name in ("signal", "residual_input"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name}={value!r} is invalid; pass an argument name or index")

    def make_cache(self) -> AdaptiveResidualCache:
        """A fresh cache with these options."""
        return AdaptiveResidualCache(
            self.threshold,
            self.warmup_steps,
            self.max_consecutive_hits,
            self.dense_last,
            self.total_steps,
            self.subsample,
            self.eps,
        )


Policy = FixedStepPolicy | AdaptiveResidualPolicy
POLICIES: Mapping[str, type[FixedStepPolicy] | type[AdaptiveResidualPolicy]] = MappingProxyType(
    {
        "fixed-step": FixedStepPolicy,
        "adaptive-residual": AdaptiveResidualPolicy,
    }
)
_KINDS: Mapping[str, str] = MappingProxyType(
    {  # field -> value kind, for data and spec parsing
        "skip_steps": "steps",
        "delta_scale": "float",
        "dense_first": "int",
        "dense_last": "int",
        "total_steps": "int",
        "threshold": "float",
        "warmup_steps": "int",
        "max_consecutive_hits": "int",
        "subsample": "int",
        "eps": "float",
        "signal": "str",
        "residual_input": "str",
    }
)


@dataclass(frozen=True)
class CacheSection:
    """Which module's forward to cache (dotted path from the model root, "" = the model itself)
    and with which policy."""

    module: str
    policy: Policy

    @property
    def policy_name(self) -> str:
        return next(name for name, cls in POLICIES.items() if isinstance(self.policy, cls))


def _read_value(name: str, value: Any) -> Any:
    kind = _KINDS[name]
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    steps = isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
    if kind == "steps" and steps:
        return tuple(sorted(set(value)))
    expected = {"int": "an integer", "float": "a number", "str": "a string",
                "steps": "a list of integers"}[kind]  # fmt: skip
    raise ConfigError(f"{_WHERE} field {name!r}={value!r} is invalid; pass {expected}")


def parse_cache_section(data: Any) -> CacheSection:
    """Validate plain data (a map with "module", "policy" and policy fields) into a section.

    Keyword form: `parse_cache_section({"module": "transformer", "policy": "fixed-step",
    "skip_steps": [3, 5, 7]})`. Any problem raises a one-line ConfigError.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_WHERE} is a {type(data).__name__}; write a map with 'policy'")
    policy = data.get("policy")
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ConfigError(
            f"{_WHERE} policy {policy!r} is unknown; use one of {', '.join(map(repr, POLICIES))}"
        )
    cls = POLICIES[policy]
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(str(k) for k in data if k not in allowed | {"module", "policy"})
    if unknown:
        raise ConfigError(
            f"{_WHERE} has unknown field {unknown[0]!r} for policy {policy!r}; "
            f"use {', '.join(sorted(allowed))}"
        )
    module = data.get("module", "")
    if not isinstance(module, str):
        raise ConfigError(f"{_WHERE} module={module!r} is invalid; pass a dotted module path")
    params = {k: _read_value(k, v) for k, v in data.items() if k in allowed}
    if cls is AdaptiveResidualPolicy and "threshold" not in params:
        raise ConfigError(f"{_WHERE} policy 'adaptive-residual' lacks 'threshold'; add one")
    try:
        return CacheSection(module, cls(**params))
    except ConfigError as exc:
        raise ConfigError(f"{_WHERE}: {exc}") from None


def cache_section_to_data(section: CacheSection) -> dict[str, Any]:
    """The section as plain msgpack data (None-valued fields omitted); inverse of parsing."""
    data: dict[str, Any] = {"module": section.module, "policy": section.policy_name}
    for f in fields(section.policy):
        value = getattr(section.policy, f.name)
        if value is not None:
            data[f.name] = list(value) if isinstance(value, tuple) else value
    return data


MAX_SPEC_STEPS = 100_000  # skip steps one spec may list; real trajectories have < 10k


def _parse_steps(text: str) -> list[int]:
    """'1,3,5' or ranges 'A-B' (inclusive) and strided 'A-B/K', mixed with commas."""
    steps: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        span, _, stride = part.partition("/")
        first, dash, last = span.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
            step = int(stride) if stride else 1
        except ValueError:
            raise ConfigError(
                f"cache spec skip value {part!r} is invalid; write steps like 1,3 or 2-10 or 2-18/2"
            ) from None
        if step < 1 or hi < lo:
            raise ConfigError(
                f"cache spec skip range {part!r} is empty; write A-B/K with A<=B, K>=1"
            )
        span_steps = range(lo, hi + 1, step)
        if len(steps) + len(span_steps) > MAX_SPEC_STEPS:  # bound the list before building it
            raise ConfigError(
                f"cache spec skip range {part!r} lists more than {MAX_SPEC_STEPS} steps; a "
                "denoising trajectory has far fewer: check the range"
            )
        steps.extend(span_steps)
    return steps


def _spec_value(name: str, text: str) -> Any:
    kind = _KINDS.get(name, "str")
    if kind == "steps":
        return _parse_steps(text)
    try:
        return {"int": int, "float": float, "str": str}[kind](text)
    except ValueError:
        raise ConfigError(f"cache spec {name}={text!r} is invalid; pass a {kind}") from None


def parse_cache_spec(spec: str) -> dict[str, Any]:
    """Parse `POLICY[:KEY=VALUE[;KEY=VALUE...]]` into section data (see `parse_cache_section`).

    Keys are the policy's fields (dashes allowed for underscores), `module`, and `skip` for
    `skip_steps`; each key is given once (`skip` and `skip_steps` are one key). Skip values are
    lists like `1,3`, ranges `2-10` and strided ranges `2-18/2`.
    Example: "fixed-step:module=transformer;skip=2-18/2;dense_last=2".
    """
    policy, _, rest = spec.strip().partition(":")
    data: dict[str, Any] = {"policy": policy.strip()}
    given: dict[str, str] = {}  # field name -> the item that set it
    for item in filter(None, (p.strip() for p in rest.split(";"))):
        key, eq, value = item.partition("=")
        name = key.strip().replace("-", "_")
        name = "skip_steps" if name == "skip" else name
        if not eq or not name:
            raise ConfigError(f"cache spec item {item!r} is invalid; write KEY=VALUE")
        if name == "policy":
            raise ConfigError(
                f"cache spec item {item!r} is invalid; the policy goes before ':' "
                f"(POLICY:KEY=VALUE;...), here {policy.strip()!r}"
            )
        if name in given:
            raise ConfigError(
                f"cache spec key {name!r} is given twice ({given[name]!r} and {item!r}); "
                "give each key once"
            )
        given[name] = item
        data[name] = _spec_value(name, value.strip())
    parse_cache_section(data)  # fail here, with the spec's words, rather than later
    return data
