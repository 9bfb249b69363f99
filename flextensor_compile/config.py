"""`OffloadConfig`: every option of `ftc profile` / `compile_profile`, validated, with glossary names.

Owns: the option names and their defaults, the canonical `ftc plan` command a profile records, one-line validation errors (a misspelt option suggests
the right one), parsing sizes such as "6GiB" and rates such as "25GB/s", and the conversion to the
profile's `PlanConfig` (what the solver reads and the profile records).
Must not know: torch, models, the solver's algorithms, the CLI.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import PlanConfig

__all__ = [
    "ASSIGNMENTS",
    "STRATEGIES",
    "TRANSFER_MODES",
    "OffloadConfig",
    "plan_command",
]

STRATEGIES = (
    "adaptive",
    "knapsack",
    "greedy",
    "nth-layer",
    "adaptive-knapsack",
    "global-offload",
    "global-tensor-selection",
)
ASSIGNMENTS = ("optimized-round-robin", "strict-round-robin", "ring")  # as the solver names them
TRANSFER_MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")
_DEVICES = ("auto", "cpu", "cuda")
# traps: the selected modules, their leaves (`discover.leaf_traps`), or whichever plans better
GRANULARITIES = ("modules", "leaves", "auto")


@dataclass(frozen=True)
class OffloadConfig:
    """Options of one compilation. Field names follow the glossary's OffloadConfig.

    Memory mode: `max_gpu_mem_fraction` (fraction of the device memory that weights, resident plus
    blocks, may use) or `budget_bytes`. Latency mode: neither; `transfer_budget_scale` scales
    the transfer windows. Device: `target` (a built-in GPU name, see `ftc profile --help`) or
    `device_memory_bytes` / `h2d_bytes_per_s`; with none of them on a machine without CUDA, an
    emulated device whose memory equals the model's weight bytes.

    Profile sections (written next to the plan; `ftc plan` does not remake them): `cache_spec`
    (`ftc profile --cache`, the caches section's one-line spec), `vram_spec` (`--vram`), and with
    it `host_memory_bytes` (`--host-memory`: plan a disk tier) and `vram_checkpoint`
    (`--checkpoint`: the safetensors file the disk tier reads).
    """

    include_patterns: tuple[str, ...] = ()
    exclude_patterns: tuple[str, ...] = ()
    max_gpu_mem_fraction: float | None = None
    budget_bytes: int | None = None
    transfer_budget_scale: float = 1.0
    load_strategy: str = "adaptive"
    assignment_strategy: str = "optimized-round-robin"
    transfer_mode: str = "allocation_block_transfer"
    num_blocks: int | None = None
    min_blocks: int = 1
    pinned_memory: bool = True
    activation_reserve_bytes: int = 0
    profiling_iters: int = 5
    warmup_iters: int = 1
    target: str | None = None
    device_memory_bytes: int | None = None
    h2d_bytes_per_s: float | None = None
    device: str = "auto"
    seed: int = 0
    cache_spec: str | None = None
    vram_spec: str | None = None
    host_memory_bytes: int | None = None
    vram_checkpoint: str | None = None
    granularity: str = "auto"

    def __new__(cls, *args: Any, **kwargs: Any) -> OffloadConfig:
        _check_option_names(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name in ("include_patterns", "exclude_patterns"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            value = tuple(value)
            if not all(isinstance(p, str) and p.strip() for p in value):
                raise ConfigError(f"{name} {value!r} must be non-empty strings such as 'layers.*'")
            object.__setattr__(self, name, value)
        self._check_numbers()
        self._check_choices()
        self._check_sections()

    def _check_sections(self) -> None:
        for name in ("cache_spec", "vram_spec", "vram_checkpoint"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v.strip()):
                raise ConfigError(f"{name} {v!r} must be a non-empty string or None")
        _positive(self, "host_memory_bytes", allow_none=True)
        for name, flag in (
            ("host_memory_bytes", "--host-memory"),
            ("vram_checkpoint", "--checkpoint"),
        ):
            if getattr(self, name) is not None and self.vram_spec is None:
                raise ConfigError(
                    f"{name} ({flag}) is set without vram_spec: it plans the vram section's disk "
                    "tier, so also pass --vram SPEC"
                )

    def _check_numbers(self) -> None:
        f = self.max_gpu_mem_fraction
        if f is not None and not (isinstance(f, (int, float)) and 0.0 < f <= 1.0):
            raise ConfigError(
                f"max_gpu_mem_fraction {f!r} must be in (0, 1]; e.g. 0.6 (--mem-fraction)"
            )
        if f is not None and self.budget_bytes is not None:
            raise ConfigError(
                "max_gpu_mem_fraction and budget_bytes are both set; give only one of "
                "--mem-fraction or --budget"
            )
        _positive(self, "budget_bytes", allow_none=True)
        _positive(self, "device_memory_bytes", allow_none=True)
        _positive(self, "num_blocks", allow_none=True)
        _positive(self, "min_blocks")
        _positive(self, "profiling_iters")
        if not isinstance(self.warmup_iters, int) or self.warmup_iters < 0:
            raise ConfigError(
                f"warmup_iters {self.warmup_iters!r} must be an integer >= 0 (--warmup-iters)"
            )
        if not isinstance(self.activation_reserve_bytes, int) or self.activation_reserve_bytes < 0:
            raise ConfigError(
                f"activation_reserve_bytes {self.activation_reserve_bytes!r} must be >= 0"
            )
        for name in ("transfer_budget_scale", "h2d_bytes_per_s"):
            v = getattr(self, name)
            if v is None and name == "h2d_bytes_per_s":
                continue
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name} {v!r} must be a positive number")
        if self.num_blocks is not None and self.num_blocks < self.min_blocks:
            raise ConfigError(
                f"num_blocks {self.num_blocks} is below min_blocks {self.min_blocks}; "
                "raise --num-blocks or lower --min-blocks"
            )
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed {self.seed!r} must be an integer")

    def _check_choices(self) -> None:
        _choice("load_strategy", self.load_strategy, STRATEGIES)
        _choice("assignment_strategy", self.assignment_strategy, ASSIGNMENTS)
        _choice("transfer_mode", self.transfer_mode, TRANSFER_MODES)
        _choice("device", self.device, _DEVICES)
        _choice("granularity", self.granularity, GRANULARITIES)
        if self.target is not None:
            from flextensor_compile.measure.targets import get_target

            object.__setattr__(self, "target", get_target(str(self.target)).name)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> OffloadConfig:
        """Build from a mapping (e.g. parsed JSON); unknown keys suggest the closest option."""
        _check_option_names(options)
        return cls(**dict(options))

    def replace(self, **changes: Any) -> OffloadConfig:
        """A copy with some options changed (validated; misspelt names suggest the right one)."""
        return OffloadConfig.from_options({**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain JSON-ready mapping."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_plan_config(self) -> PlanConfig:
        """The solver's view of these options (what the profile records under `config`)."""
        return PlanConfig(
            include_patterns=self.include_patterns,
            exclude_patterns=self.exclude_patterns,
            budget_bytes=self.budget_bytes,
            mem_fraction=self.max_gpu_mem_fraction,
            transfer_budget_scale=self.transfer_budget_scale,
            strategy=self.load_strategy,
            assignment=self.assignment_strategy,
            transfer_mode=self.transfer_mode,
            num_blocks=self.num_blocks,
            min_blocks=self.min_blocks,
            pinned_memory=self.pinned_memory,
            activation_reserve_bytes=self.activation_reserve_bytes,
            seed=self.seed,
        )

    def with_patterns(self, include: tuple[str, ...], exclude: tuple[str, ...]) -> OffloadConfig:
        """Fill in patterns (e.g. a model file's INCLUDE/EXCLUDE) where none were given."""
        return replace(
            self,
            include_patterns=self.include_patterns or tuple(include),
            exclude_patterns=self.exclude_patterns or tuple(exclude),
        )


def _check_option_names(options: Mapping[str, Any]) -> None:
    known = [f.name for f in fields(OffloadConfig)]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}?" if close else f"options: {', '.join(known)}"
            raise ConfigError(f"OffloadConfig has no option {key!r}; {hint}")


def _positive(cfg: OffloadConfig, name: str, allow_none: bool = False) -> None:
    v = getattr(cfg, name)
    if v is None and allow_none:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{name} {v!r} must be a positive integer{_flag(name)}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value in allowed:
        return
    close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.4)
    hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(allowed)}"
    raise ConfigError(f"{name} {value!r} is not known; {hint}{_flag(name)}")


def _flag(name: str) -> str:
    """` (--num-blocks)`: the ftc option that sets config field `name`, or "" if none does."""
    flags = (("load_strategy", "--strategy"), ("num_blocks", "--num-blocks"),
             ("min_blocks", "--min-blocks"), ("profiling_iters", "--profiling-iters"),
             ("assignment_strategy", "--assignment"),
             ("device", "--device"), ("budget_bytes", "--budget"),
             ("device_memory_bytes", "--device-memory"), ("granularity", "--granularity"),
             ("activation_reserve_bytes", "--activation-reserve"))  # fmt: skip
    return next((f" ({flag})" for field, flag in flags if field == name), "")


def plan_command(config: PlanConfig) -> str:
    """The command a profile records: the `ftc plan` options that remake it from its stats.

    `ftc profile` and `ftc plan` both record this text, so equal options give equal bytes.
    """
    parts = ["ftc plan"]
    if config.budget_bytes is not None:
        parts.append(f"--budget {config.budget_bytes}")
    if config.mem_fraction is not None:
        short = f"{config.mem_fraction:g}"  # exact when 6 digits hold it, else every digit
        exact = short if float(short) == config.mem_fraction else repr(config.mem_fraction)
        parts.append(f"--mem-fraction {exact}")
    parts.append(f"--strategy {config.strategy}")
    if config.num_blocks is not None:
        parts.append(f"--num-blocks {config.num_blocks}")
    if config.min_blocks != 1:
        parts.append(f"--min-blocks {config.min_blocks}")
    if config.assignment != "optimized-round-robin":
        parts.append(f"--assignment {config.assignment}")
    if config.activation_reserve_bytes:
        parts.append(f"--activation-reserve {config.activation_reserve_bytes}")
    if config.seed:
        parts.append(f"--seed {config.seed}")
    return " ".join(parts)
