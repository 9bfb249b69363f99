"""The solver's input: traps in execution order, what each may stream, the copy model, the budget.

Owns: turning recorded `Stats` and a `PlanConfig` into a `Problem` (which tensors are streamable
units, what stays pinned resident and why, the resolved budget), and the slot-alignment rule for
tensors packed into a memory block.
Must not know: torch, files, how plans are searched or emitted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from flextensor_compile.solve.assign import ASSIGNMENTS
from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.stats import Stats, TensorStat
from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ConfigError, StatsFormatError
from flextensor_runtime.profile import PlanConfig

__all__ = [
    "ALIGN_BYTES",
    "TINY_RATIO",
    "Item",
    "Problem",
    "TrapSpec",
    "align_up",
    "discovery_pin",
    "not_offloadable",
    "over_device_memory",
    "problem_from_stats",
]

ALIGN_BYTES = 256  # every streamed tensor starts at a multiple of this inside its block
NOT_OFFLOADABLE = "marked not offloadable"  # the pin reason of `offloadable=False` tensors
TINY_RATIO = 64  # a tensor under 1/64 of its trap's largest stays resident (not worth a copy)


def align_up(nbytes: int, align: int = ALIGN_BYTES) -> int:
    return -(-nbytes // align) * align


@dataclass(frozen=True)
class Item:
    """A streamable unit: one canonical tensor (its same-trap aliases follow it)."""

    name: str
    bytes: int  # counted bytes (the canonical tensor's)
    slot_bytes: int  # bytes it occupies in a block (aligned)


@dataclass(frozen=True)
class TrapSpec:
    """One trap: its compute time, its streamable items, and why the rest is pinned."""

    name: str
    kind: str
    compute_ms: float
    items: tuple[Item, ...] = ()
    pinned_bytes: int = 0  # owned bytes that must stay resident (counted once)

    @cached_property
    def streamable_slot_bytes(self) -> int:  # read per trap by every solve's context
        return sum([it.slot_bytes for it in self.items])


@dataclass(frozen=True)
class Problem:
    """Everything a strategy needs. `budget_bytes=None` is latency mode (no cap)."""

    traps: tuple[TrapSpec, ...]
    bandwidth: BandwidthModel
    total_bytes: int  # every canonical tensor, trapped or not
    budget_bytes: int | None = None
    reserve_bytes: int = 0
    transfer_budget_scale: float = 1.0
    num_blocks: int | None = None
    min_blocks: int = 1
    assignment: str = "optimized-round-robin"
    pinned: tuple[tuple[str, str], ...] = ()  # (tensor, reason) for tensors kept resident
    pinned_sizes: tuple[int, ...] = ()  # bytes of each `pinned` tensor, in its order
    fraction_of_bytes: int | None = None  # device memory, when the budget is a --mem-fraction
    device_bytes: int | None = None  # device memory where it caps budgets (not emulated, recorded)

    @cached_property
    def compute_ms(self) -> float:  # read by every candidate's copy floor: summed once
        return sum(t.compute_ms for t in self.traps)

    @cached_property
    def trap_compute_ms(self) -> tuple[float, ...]:
        return tuple(t.compute_ms for t in self.traps)

    @cached_property
    def compute_bytes(self) -> tuple[int, ...]:
        """Per trap: the bytes one copy moves while the trap computes."""
        return tuple(self.bandwidth.bytes_within(t.compute_ms) for t in self.traps)

    @cached_property
    def item_slot_bytes(self) -> tuple[tuple[int, ...], ...]:
        """Per trap, per item: its slot bytes (what sums over selections index)."""
        return tuple(tuple(it.slot_bytes for it in t.items) for t in self.traps)

    @cached_property
    def item_bytes(self) -> tuple[tuple[int, ...], ...]:
        """Per trap, per item: its counted bytes."""
        return tuple(tuple(it.bytes for it in t.items) for t in self.traps)

    @property
    def streamable_bytes(self) -> int:
        return sum(it.bytes for t in self.traps for it in t.items)


def not_offloadable(detail: str | None) -> str:
    """The pin reason of an `offloadable=False` tensor: `NOT_OFFLOADABLE`, then discovery's
    reason when it recorded one (`"marked not offloadable: the exclude pattern 'x' matches it"`)."""
    return f"{NOT_OFFLOADABLE}: {detail}" if detail else NOT_OFFLOADABLE


def discovery_pin(reason: str) -> tuple[bool, str | None]:
    """Whether `reason` is one `not_offloadable` made, and its detail (None: the bare reason)."""
    prefix = f"{NOT_OFFLOADABLE}: "
    if reason == NOT_OFFLOADABLE or not reason.startswith(prefix):
        return reason == NOT_OFFLOADABLE, None
    return True, reason.removeprefix(prefix)


def _pin_reasons(stats: Stats) -> dict[str, str]:
    """Canonical tensor name -> why it must stay resident (absent: streamable)."""
    owner: dict[str, int] = {}
    for order, trap in enumerate(stats.traps):
        for t in trap.tensors:
            owner[t.name] = order
    reasons: dict[str, str] = {t.name: "untrapped" for t in stats.untrapped}
    for order, trap in enumerate(stats.traps):
        for t in trap.tensors:
            canon = t.tie or t.name
            if trap.calls > 1:
                reasons.setdefault(canon, f"its trap runs {trap.calls} times per iteration")
            if not t.offloadable:
                reasons.setdefault(canon, not_offloadable(t.pin_reason))
            if t.tie is not None and owner.get(t.tie) != order:
                reasons.setdefault(canon, "tied to a tensor of another trap")
    if len(stats.traps) < 2:
        for trap in stats.traps:
            for t in trap.tensors:
                reasons.setdefault(t.tie or t.name, "a single trap cannot prefetch")
    return reasons


def over_device_memory(stats: Stats, budget_bytes: int) -> bool:
    """Whether a budget is more than the device's memory (an emulated device has no limit:
    its memory is whatever the plan is for; measurements that record no memory, 0 bytes, set
    none either)."""
    memory = stats.device.memory_bytes
    return 0 < memory < budget_bytes and stats.device.kind != "emulated"


def _budget(stats: Stats, config: PlanConfig) -> int | None:
    """Bytes weights (resident + blocks + reserve) may use; `budget_bytes` wins over a fraction
    (an emitted profile records both)."""
    if config.budget_bytes is not None:
        if config.budget_bytes <= 0:
            raise ConfigError(f"budget must be positive, got {config.budget_bytes} bytes")
        memory = stats.device.memory_bytes
        if over_device_memory(stats, config.budget_bytes):
            raise ConfigError(
                f"budget of {config.budget_bytes} bytes is larger than {stats.device.name}'s "
                f"{memory} bytes of memory; pass --budget {memory} or less, or --mem-fraction"
            )
        return config.budget_bytes
    if config.mem_fraction is not None:
        if not 0.0 < config.mem_fraction <= 1.0:
            raise ConfigError(
                f"mem fraction must be in (0, 1], got {config.mem_fraction}; e.g. --mem-fraction 0.6"
            )
        if stats.device.memory_bytes <= 0:
            raise ConfigError(
                f"--mem-fraction is a fraction of the device's memory, and these measurements "
                f"do not record it ({stats.device.name}: {stats.device.memory_bytes} bytes); "
                "pass --budget instead, e.g. --budget 6GiB"
            )
        return int(config.mem_fraction * stats.device.memory_bytes)
    return None


def _check_config(config: PlanConfig) -> None:
    if config.assignment not in ASSIGNMENTS:
        raise ConfigError(
            f"unknown assignment {config.assignment!r}; choose one of {', '.join(ASSIGNMENTS)}"
        )
    if config.assignment == "ring" and ((config.num_blocks or 1) != 1 or config.min_blocks > 1):
        raise ConfigError(
            "the ring assignment uses one block; drop --num-blocks/--min-blocks or choose "
            "optimized-round-robin"
        )
    if config.release != "after-last-reader":
        raise ConfigError(f"unknown release strategy {config.release!r}; use after-last-reader")
    if config.num_blocks is not None and config.num_blocks < 1:
        raise ConfigError(
            f"num_blocks must be at least 1, got {config.num_blocks}; pass --num-blocks 1 or more"
        )
    if config.min_blocks < 1:
        raise ConfigError(
            f"min_blocks must be at least 1, got {config.min_blocks}; pass --min-blocks 1 or more"
        )
    if config.num_blocks is not None and config.min_blocks > config.num_blocks:
        raise ConfigError(
            f"min_blocks {config.min_blocks} exceeds num_blocks {config.num_blocks}; lower --min-blocks or "
            "raise --num-blocks"
        )
    if not config.transfer_budget_scale > 0:
        raise ConfigError(
            f"transfer_budget_scale must be positive, got {config.transfer_budget_scale}"
        )
    if config.activation_reserve_bytes < 0:
        raise ConfigError(
            f"activation reserve must be >= 0, got {config.activation_reserve_bytes} bytes"
        )


def problem_from_stats(stats: Stats, config: PlanConfig) -> Problem:
    """Resolve the budget, decide which tensors are streamable, and build the `Problem`."""
    _check_config(config)
    for trap in stats.traps:
        if trap.kind == "gap" and trap.tensors:
            raise StatsFormatError(
                f"gap trap {trap.name!r} owns {count_of(len(trap.tensors), 'tensor')}; mark it kind "
                "'module' or move its tensors to the trap that reads them"
            )
    reasons = _pin_reasons(stats)
    canon_bytes = {t.name: t.bytes for t in _all(stats) if t.tie is None}
    traps = _trap_specs(stats, reasons)
    d = stats.device
    curve = tuple((p.bytes, p.bytes_per_s) for p in d.bandwidth_curve)
    pinned = tuple(sorted((n, r) for n, r in reasons.items() if n in canon_bytes))
    return Problem(
        traps=traps,
        bandwidth=BandwidthModel.from_curve(curve, d.h2d_bytes_per_s, d.h2d_latency_ms),
        total_bytes=sum(canon_bytes.values()),
        budget_bytes=_budget(stats, config),
        reserve_bytes=config.activation_reserve_bytes,
        transfer_budget_scale=config.transfer_budget_scale,
        num_blocks=config.num_blocks,
        min_blocks=config.min_blocks,
        assignment=config.assignment,
        pinned=pinned,
        pinned_sizes=tuple(canon_bytes[n] for n, _ in pinned),
        fraction_of_bytes=d.memory_bytes if config.mem_fraction is not None else None,
        device_bytes=d.memory_bytes if d.memory_bytes > 0 and d.kind != "emulated" else None,
    )


def _trap_specs(stats: Stats, reasons: dict[str, str]) -> tuple[TrapSpec, ...]:
    """Each trap's streamable items (canonical, not pinned, not under 1/`TINY_RATIO` of its
    largest, which join `reasons`) and the bytes it keeps resident."""
    pinned_by_trap: dict[int, int] = defaultdict(int)
    traps = []
    for order, trap in enumerate(stats.traps):
        items = []
        for t in trap.tensors:
            if t.tie is not None:
                continue
            if t.name in reasons:
                pinned_by_trap[order] += t.bytes
            elif t.bytes > 0:
                items.append(Item(t.name, t.bytes, align_up(t.bytes)))
        largest = max((it.bytes for it in items), default=0)
        for it in [it for it in items if it.bytes * TINY_RATIO < largest]:
            items.remove(it)
            pinned_by_trap[order] += it.bytes
            reasons[it.name] = f"under 1/{TINY_RATIO} of its trap's largest tensor"
        items.sort(key=lambda it: it.name)
        traps.append(TrapSpec(trap.name, trap.kind, trap.compute_ms, tuple(items),
                              pinned_by_trap[order]))  # fmt: skip
    return tuple(traps)


def _all(stats: Stats) -> list[TensorStat]:
    return [t for trap in stats.traps for t in trap.tensors] + list(stats.untrapped)
