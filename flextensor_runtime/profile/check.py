"""Cross-reference checks of a decoded profile: what must hold for the runtime to trust it.

Owns: the invariants between sections (names unique, ties resolve, blocks exist, every streamed
tensor inside exactly one of its trap's transfers, a trap's transfers disjoint and none empty,
no two transfers holding the same block bytes at once, sizes consistent with shapes and dtypes,
predicted peak within the budget).
Must not know: msgpack, files, torch.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from math import prod

from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import BudgetError, ProfileFormatError
from flextensor_runtime.profile.fields import MAX_BYTES
from flextensor_runtime.profile.schema import (
    DTYPE_ITEMSIZE,
    Block,
    Profile,
    TensorEntry,
    Transfer,
    fingerprint,
)

__all__ = ["check_profile", "occupied_slots"]

_FIX = "the profile is inconsistent; recompile it with `ftc profile` or `ftc plan`"


def _bad(message: str) -> ProfileFormatError:
    return ProfileFormatError(f"{message}; {_FIX}")


def check_profile(profile: Profile) -> None:
    """Raise `ProfileFormatError` (or `BudgetError`) naming the first broken invariant."""
    owner = _check_tensors(profile)
    blocks = _check_blocks(profile.blocks)
    _check_schedule(profile, owner, blocks)
    _check_predicted(profile, blocks)
    fp = fingerprint(profile.all_tensors())
    if fp != profile.model:
        raise _bad(
            f"model fingerprint {profile.model.digest[:12]}… does not match the tensors the "
            f"profile lists ({fp.digest[:12]}…, {count_of(fp.tensor_count, 'tensor')})"
        )


def _check_entry(e: TensorEntry, where: str) -> None:
    itemsize = DTYPE_ITEMSIZE.get(e.dtype)
    if itemsize is None:
        raise _bad(f"tensor {e.name!r} in {where} has unknown dtype {e.dtype!r}")
    if len(e.stride) != len(e.shape):
        raise _bad(f"tensor {e.name!r} has {count_of(len(e.shape), 'dim')} but "
                   f"{count_of(len(e.stride), 'stride')}")  # fmt: skip
    if len(e.shape) > 64 or any(d > MAX_BYTES for d in e.shape):
        raise _bad(f"tensor {e.name!r} has an absurd shape {list(e.shape)[:8]}")
    if e.bytes != prod(e.shape) * itemsize:
        raise _bad(
            f"tensor {e.name!r} declares {e.bytes} bytes but shape {list(e.shape)} of "
            f"{e.dtype} holds {prod(e.shape) * itemsize}"
        )
    if e.placement == "resident" and (e.block is not None or e.offset is not None):
        raise _bad(f"resident tensor {e.name!r} names block {e.block}")
    if e.placement != "resident" and e.tie is None and (e.block is None or e.offset is None):
        raise _bad(f"{e.placement} tensor {e.name!r} has no block and offset")


def _check_tensors(profile: Profile) -> dict[str, tuple[int, TensorEntry]]:
    """Returns tensor name -> (owning trap order, or -1 for untrapped; entry)."""
    owner: dict[str, tuple[int, TensorEntry]] = {}
    names: set[str] = set()
    for order, trap in enumerate(profile.traps):
        if trap.name in names:
            raise _bad(f"trap name {trap.name!r} appears twice")
        names.add(trap.name)
        if trap.kind == "gap" and trap.tensors:
            raise _bad(f"gap trap {trap.name!r} owns {count_of(len(trap.tensors), 'tensor')}")
        for e in trap.tensors:
            _add_owner(owner, e, order, f"trap {trap.name!r}")
    for e in profile.untrapped:
        if e.placement != "resident":
            raise _bad(f"untrapped tensor {e.name!r} is {e.placement}; only resident is allowed")
        _add_owner(owner, e, -1, "untrapped")
    for name, (_, e) in owner.items():
        if e.tie is None:
            continue
        canon = owner.get(e.tie)
        if e.tie == name:
            raise _bad(f"tensor {name!r} is tied to itself")
        if canon is None:
            raise _bad(f"tensor {name!r} is tied to {e.tie!r}, which the profile does not list")
        if canon[1].tie is not None:
            raise _bad(f"tensor {name!r} is tied to {e.tie!r}, which is itself tied to "
                       f"{canon[1].tie!r} (a tie names an untied tensor)")  # fmt: skip
        c = canon[1]
        if (c.placement, c.block, c.offset) != (e.placement, e.block, e.offset):
            raise _bad(f"tied tensor {name!r} is placed apart from {e.tie!r}")
    return owner


def _add_owner(owner: dict, e: TensorEntry, order: int, where: str) -> None:
    if e.name in owner:
        raise _bad(f"tensor {e.name!r} is listed twice")
    _check_entry(e, where)
    owner[e.name] = (order, e)


def _check_blocks(blocks: tuple[Block, ...]) -> dict[int, Block]:
    by_id: dict[int, Block] = {}
    for b in blocks:
        if b.id in by_id:
            raise _bad(f"block id {b.id} appears twice")
        if b.bytes <= 0:
            raise _bad(f"block {b.id} has {b.bytes} bytes")
        by_id[b.id] = b
    return by_id


def occupied_slots(t: Transfer, n_traps: int) -> list[int]:
    """Trap orders during which a transfer holds its block region: from `issue_at` to
    `release_after` in one iteration when `issue_at <= trap` (an on-entry copy when equal),
    cyclically from the previous iteration's `issue_at` when `issue_at > trap`."""
    if t.issue_at <= t.trap:
        return list(range(t.issue_at, t.release_after + 1))
    return list(range(t.issue_at, n_traps)) + list(range(t.release_after + 1))


def _labels(schedule: tuple[Transfer, ...]) -> list[str]:
    """Per schedule index: 'transfer K of trap T' (K counts from 1 in canonical order)."""
    seen: dict[int, int] = defaultdict(int)
    out = []
    for t in schedule:
        seen[t.trap] += 1
        out.append(f"transfer {seen[t.trap]} of trap {t.trap}")
    return out


def _check_schedule(
    profile: Profile, owner: dict[str, tuple[int, TensorEntry]], blocks: dict[int, Block]
) -> None:
    n = len(profile.traps)
    labels = _labels(profile.schedule)
    by_trap: dict[int, list[int]] = defaultdict(list)  # trap order -> schedule indices
    for k, t in enumerate(profile.schedule):
        label = labels[k]
        if t.trap >= n or t.issue_at >= n or t.release_after >= n:
            raise _bad(f"{label} names a trap order beyond the {count_of(n, 'trap')}")
        block = blocks.get(t.block)
        if block is None:
            raise _bad(f"{label} names block {t.block}, which does not exist")
        if t.bytes <= 0:
            raise _bad(f"{label} copies {t.bytes} bytes; every transfer carries a tensor")
        if t.offset + t.bytes > block.bytes:
            raise _bad(f"{label} ends at byte {t.offset + t.bytes}, past block {t.block}'s end")
        if t.release_after < t.trap:
            raise _bad(f"{label} is released after trap {t.release_after}, before its reader")
        if t.issue_at > t.trap and not t.release_after < t.issue_at:
            raise _bad(f"{label} is held for more than one iteration")
        for j in by_trap[t.trap]:  # canonical order: earlier ones start at or before t
            u = profile.schedule[j]
            if u.block == t.block and u.offset + u.bytes > t.offset:
                raise _bad(f"{labels[j]} and {label} overlap in block {t.block}")
        by_trap[t.trap].append(k)
    _check_streamed_inside(profile, owner, by_trap, labels)
    _check_block_overlaps(profile, n, labels)


def _check_streamed_inside(
    profile: Profile,
    owner: dict[str, tuple[int, TensorEntry]],
    by_trap: dict[int, list[int]],
    labels: list[str],
) -> None:
    carried: set[int] = set()
    spans: dict[tuple[int, int | None], list[tuple[int, int, str]]] = defaultdict(list)
    for name, (order, e) in owner.items():
        if e.placement == "resident" or e.tie is not None:
            continue
        assert e.offset is not None  # checked in _check_entry
        if not by_trap.get(order):
            raise _bad(f"{e.placement} tensor {name!r} has no transfer for its trap {order}")
        inside = [k for k in by_trap[order] if _holds(profile.schedule[k], e)]
        if not inside:
            raise _bad(
                f"{e.placement} tensor {name!r} (block {e.block}, bytes {e.offset}.."
                f"{e.offset + e.bytes}) lies outside every transfer of its trap {order}"
            )
        carried.add(inside[0])  # one at most: a trap's transfers are disjoint
        spans[(order, e.block)].append((e.offset, e.offset + e.bytes, name))
    for indices in by_trap.values():
        for k in indices:
            if k not in carried:
                raise _bad(f"{labels[k]} carries no streamed tensor")
    for items in spans.values():
        items.sort()
        for (_, end, a), (start, _, b) in pairwise(items):
            if start < end:
                raise _bad(f"streamed tensors {a!r} and {b!r} overlap in their block")


def _holds(t: Transfer, e: TensorEntry) -> bool:
    assert e.offset is not None
    return e.block == t.block and t.offset <= e.offset and e.offset + e.bytes <= t.offset + t.bytes


def _check_block_overlaps(profile: Profile, n: int, labels: list[str]) -> None:
    active: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for k, t in enumerate(profile.schedule):
        for slot in occupied_slots(t, n):
            active[(t.block, slot)].append((t.offset, t.offset + t.bytes, k))
    for (block, slot), items in active.items():
        items.sort()
        for (_, end, a), (start, _, b) in pairwise(items):
            if start < end:
                raise _bad(
                    f"{labels[a]} and {labels[b]} hold the same bytes of block {block} "
                    f"during trap {slot}"
                )


def _check_predicted(profile: Profile, blocks: dict[int, Block]) -> None:
    p = profile.predicted
    resident = sum(
        e.bytes for e in profile.all_tensors() if e.placement == "resident" and not e.tie
    )
    streamed = sum(
        e.bytes for e in profile.all_tensors() if e.placement != "resident" and not e.tie
    )
    if p.resident_bytes != resident or p.streamed_bytes != streamed:
        raise _bad(
            f"predicted resident/streamed bytes {p.resident_bytes}/{p.streamed_bytes} differ from "
            f"the tensors' {resident}/{streamed}"
        )
    floor = resident + sum(b.bytes for b in blocks.values())
    if p.peak_bytes < floor:
        raise _bad(f"predicted peak {p.peak_bytes} bytes is below resident + blocks ({floor})")
    if p.trap_stall_ms and len(p.trap_stall_ms) != len(profile.traps):
        raise _bad(f"{count_of(len(p.trap_stall_ms), 'per-trap stall')} for "
                   f"{count_of(len(profile.traps), 'trap')}")  # fmt: skip
    budget = profile.config.budget_bytes
    if budget is not None and p.peak_bytes > budget:
        raise BudgetError(
            f"the plan's predicted peak of {p.peak_bytes} bytes exceeds its budget of {budget} "
            "bytes; recompile it with a larger --budget or --mem-fraction"
        )
