"""The sections of an offload profile as frozen dataclasses, their constants, and the fingerprint.

Owns: what a profile says (fields, units, allowed values) and the model fingerprint definition.
Must not know: msgpack or files (see `wire`), torch, how profiles are compiled or installed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

FORMAT = "flextensor-profile"
VERSION = 2
PLACEMENTS = ("resident", "streamed", "disk")
TRAP_KINDS = ("module", "gap", "manual")
TENSOR_KINDS = ("parameter", "buffer", "inner")
# where compute times came from (`meta.timing_source`; a stats file's `timing_source`)
TIMING_SOURCES = ("measured-cuda", "measured-cpu", "roofline", "stats", "synthetic", "replan")

# Bytes per element of every dtype a profile may name (torch's names without the "torch." prefix).
DTYPE_ITEMSIZE: Mapping[str, int] = MappingProxyType({
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
})  # fmt: skip


def _normalize(obj: Any) -> None:
    """Coerce numbers declared float to float and sequences declared tuple to tuple.

    Equal profiles then compare equal and encode to identical bytes, whether a caller passed
    `1` or `1.0`, a list or a tuple.
    """
    for f in fields(obj):
        value = getattr(obj, f.name)
        ann = str(f.type)
        if value is None:
            continue
        if ann.startswith("float") and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
        elif ann.startswith("tuple[float"):
            object.__setattr__(obj, f.name, tuple(float(v) for v in value))
        elif ann.startswith("tuple") and not isinstance(value, tuple):
            object.__setattr__(obj, f.name, tuple(value))


class _Normalized:
    def __post_init__(self) -> None:
        _normalize(self)


@dataclass(frozen=True)
class Meta:
    """Who made the profile. No timestamps: equal inputs give byte-identical files."""

    tool_version: str
    torch_version: str
    command: str
    timing_source: str = "measured"  # one of TIMING_SOURCES when `ftc` or the runtime wrote it


@dataclass(frozen=True)
class ModelFingerprint:
    """sha256 over the sorted (name, shape, dtype) of every model tensor, plus counts."""

    digest: str
    tensor_count: int
    total_bytes: int


@dataclass(frozen=True)
class BandwidthPoint(_Normalized):
    """One measured host-to-device copy size and the rate it achieved."""

    bytes: int
    bytes_per_s: float


@dataclass(frozen=True)
class DeviceSpec(_Normalized):
    """The device the plan was made for: memory, and the host-to-device bandwidth model."""

    name: str
    memory_bytes: int
    h2d_bytes_per_s: float
    h2d_latency_ms: float = 0.0
    bandwidth_curve: tuple[BandwidthPoint, ...] = ()
    kind: str = "cuda"  # cuda | cpu | target | emulated


@dataclass(frozen=True)
class PlanConfig(_Normalized):
    """The options the plan was compiled with (names follow the glossary's OffloadConfig)."""

    include_patterns: tuple[str, ...] = ()
    exclude_patterns: tuple[str, ...] = ()
    budget_bytes: int | None = None
    mem_fraction: float | None = None
    transfer_budget_scale: float = 1.0
    strategy: str = "adaptive"
    assignment: str = "optimized-round-robin"
    release: str = "after-last-reader"
    transfer_mode: str = "allocation_block_transfer"
    num_blocks: int | None = None
    min_blocks: int = 1
    pinned_memory: bool = True
    activation_reserve_bytes: int = 0
    seed: int = 0


@dataclass(frozen=True)
class TensorEntry:
    """One model tensor and where the plan puts it.

    `offset` is the byte offset inside `block` (streamed/disk only). `tie` names the canonical
    tensor this one shares storage with (counted once, placed with it). `kind` is parameter,
    buffer, or inner (an inner tensor field such as `weight.scale`, moved with its parent).
    """

    name: str
    bytes: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    placement: str = "resident"
    block: int | None = None
    offset: int | None = None
    tie: str | None = None
    kind: str = "parameter"

    def __post_init__(self) -> None:
        """`_normalize` of the only fields it can change here (shape and stride to tuples),
        without its walk over the fields: a large model's profile holds tens of thousands."""
        if self.shape is not None and not isinstance(self.shape, tuple):
            object.__setattr__(self, "shape", tuple(self.shape))
        if self.stride is not None and not isinstance(self.stride, tuple):
            object.__setattr__(self, "stride", tuple(self.stride))


@dataclass(frozen=True)
class Trap(_Normalized):
    """One trap in execution order: a module (or gap, or manual block) and the tensors it owns."""

    name: str
    kind: str
    compute_ms: float
    tensors: tuple[TensorEntry, ...] = ()
    calls: int = 1

    def __post_init__(self) -> None:
        _normalize(self)  # canonical order: tensors by name
        object.__setattr__(self, "tensors", tuple(sorted(self.tensors, key=lambda t: t.name)))


@dataclass(frozen=True)
class Block:
    """A device buffer allocated once at install; streamed tensors become views into it."""

    id: int
    bytes: int


@dataclass(frozen=True)
class Transfer:
    """One packed copy of some of a trap's streamed tensors (a trap may have several).

    `trap` is the order of the trap whose tensors are copied into `block[offset:offset+bytes]`.
    `issue_at` is the order of the trap at whose entry the copy is issued:
    `issue_at < trap`: earlier in the same iteration; `issue_at == trap`: at the entry of the
    trap itself (an on-entry copy: issued as the trap is entered, after the copies issued before
    it, and waited for by the trap); `issue_at > trap`: in the previous iteration (cyclic
    prefetch). The block region is held from `issue_at` until `release_after` has finished.
    """

    trap: int
    block: int
    offset: int
    bytes: int
    issue_at: int
    release_after: int


@dataclass(frozen=True)
class Predicted(_Normalized):
    """What the simulator predicts for one iteration under this plan."""

    compute_ms: float
    makespan_ms: float
    stall_ms: float
    peak_bytes: int
    resident_bytes: int
    streamed_bytes: int
    trap_stall_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class Profile(_Normalized):
    """A compiled offload profile. `extensions` holds optional and unknown top-level sections."""

    meta: Meta
    model: ModelFingerprint
    device: DeviceSpec
    config: PlanConfig
    traps: tuple[Trap, ...]
    blocks: tuple[Block, ...]
    schedule: tuple[Transfer, ...]
    predicted: Predicted
    untrapped: tuple[TensorEntry, ...] = ()
    extensions: Mapping[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def __post_init__(self) -> None:
        _normalize(self)  # canonical order, so equal plans compare equal
        object.__setattr__(self, "untrapped", tuple(sorted(self.untrapped, key=lambda t: t.name)))
        object.__setattr__(self, "blocks", tuple(sorted(self.blocks, key=lambda b: b.id)))
        object.__setattr__(
            self,
            "schedule",
            tuple(sorted(self.schedule, key=lambda s: (s.trap, s.block, s.offset))),
        )

    def all_tensors(self) -> Iterable[TensorEntry]:
        """Every tensor entry: those owned by traps (in order), then untrapped ones."""
        for trap in self.traps:
            yield from trap.tensors
        yield from self.untrapped

    def transfers_for(self, trap_order: int) -> tuple[Transfer, ...]:
        """The transfers of trap `trap_order`'s streamed tensors, in issue order: cyclic ones
        (previous iteration) first, then by issuing trap, on-entry ones last; ties by block and
        offset."""
        n = len(self.traps)
        own = [t for t in self.schedule if t.trap == trap_order]
        return tuple(sorted(own, key=lambda t: (issue_time(t, n), t.block, t.offset)))

    def transfer_for(self, trap_order: int) -> Transfer | None:
        """The first transfer (in issue order) of trap `trap_order`'s streamed tensors, if any."""
        own = self.transfers_for(trap_order)
        return own[0] if own else None


def issue_time(t: Transfer, n_traps: int) -> int:
    """When `t` is issued, as a trap order relative to the start of its reader's iteration
    (negative: in the previous iteration)."""
    return t.issue_at - n_traps if t.issue_at > t.trap else t.issue_at


def fingerprint(entries: Iterable[TensorEntry]) -> ModelFingerprint:
    """Fingerprint a model from its tensor entries (order-independent; tied bytes counted once)."""
    items = sorted(entries, key=lambda e: e.name)
    h = hashlib.sha256()
    for e in items:
        h.update(f"{e.name}|{','.join(map(str, e.shape))}|{e.dtype}\n".encode())
    total = sum(e.bytes for e in items if e.tie is None)
    return ModelFingerprint(digest=h.hexdigest(), tensor_count=len(items), total_bytes=total)
