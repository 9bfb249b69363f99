"""Test-only profiles with several transfers per trap and on-entry copies, for `TinyLM`.

`split_profile` places the tensors named by each `Copy` consecutively (256-byte aligned) from the
copy's offset in its block; every other tensor is resident. Blocks are sized to their furthest
byte. Three layouts: `two_blocks` (each streamed trap split over two blocks), `on_entry` (a
trap's second copy goes, at its own entry, into bytes the trap before it just released), and
`ring` (every streamed trap in one block, consecutive traps sharing it through offsets, the bytes
the previous trap still holds copied on entry). A tied alias is placed with its canonical tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from flextensor_runtime.model_tensors import model_tensor_entries
from flextensor_runtime.profile import (
    Block,
    DeviceSpec,
    Meta,
    PlanConfig,
    Predicted,
    Profile,
    TensorEntry,
    Transfer,
    Trap,
    fingerprint,
)

ALIGN = 256  # as the compiler lays blocks out (cuBLAS picks kernels by pointer alignment)


@dataclass(frozen=True)
class Copy:
    """One transfer of trap `trap` (an order): these canonical tensors at `offset` of `block`."""

    trap: int
    block: int
    offset: int
    issue_at: int
    release_after: int
    names: tuple[str, ...]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def trap_tensors(model: nn.Module, trap_name: str) -> list[TensorEntry]:
    """The streamable canonical tensors under `trap_name`, by name."""
    prefix = trap_name + "."
    return sorted(
        (e for e in model_tensor_entries(model) if e.name.startswith(prefix) and e.tie is None),
        key=lambda e: e.name,
    )


def halves(model: nn.Module, trap_name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = [e.name for e in trap_tensors(model, trap_name)]
    return tuple(names[: len(names) // 2]), tuple(names[len(names) // 2 :])


def split_profile(
    model: nn.Module, order: Sequence[str], copies: Sequence[Copy], mode: str
) -> Profile:
    entries = model_tensor_entries(model)
    by_name = {e.name: e for e in entries}
    placed: dict[str, TensorEntry] = {}
    schedule, ends = [], {}
    for c in copies:
        off = c.offset
        for name in c.names:
            e, off = by_name[name], _align(off)
            placed[name] = TensorEntry(e.name, e.bytes, e.dtype, e.shape, e.stride, "streamed",
                                       c.block, off, None, e.kind)  # fmt: skip
            off += e.bytes
        schedule.append(Transfer(c.trap, c.block, c.offset, off - c.offset, c.issue_at,
                                 c.release_after))  # fmt: skip
        ends[c.block] = max(ends.get(c.block, 0), _align(off))
    final = [placed.get(e.name, e) for e in entries]
    for j, e in enumerate(final):  # a tied alias takes its canonical tensor's place
        c = placed.get(e.tie or "")
        if c is not None:
            final[j] = TensorEntry(e.name, e.bytes, e.dtype, e.shape, e.stride, c.placement,
                                   c.block, c.offset, e.tie, e.kind)  # fmt: skip
    owner = {e.name: _owner(e.name, order) for e in final}
    traps = tuple(
        Trap(name, "module", 1.0, tuple(e for e in final if owner[e.name] == i))
        for i, name in enumerate(order)
    )
    blocks = tuple(Block(b, n) for b, n in sorted(ends.items()))
    resident = sum(e.bytes for e in final if e.placement == "resident" and e.tie is None)
    streamed = sum(e.bytes for e in final if e.placement != "resident" and e.tie is None)
    n = float(len(order))
    return Profile(
        meta=Meta("test-planner", torch.__version__, "tests/runtime/split_plans.py", "synthetic"),
        model=fingerprint(final),
        device=DeviceSpec("cpu", 1 << 36, 1e10, kind="cpu"),
        config=PlanConfig(transfer_mode=mode, num_blocks=len(blocks), strategy="nth-layer"),
        traps=traps,
        blocks=blocks,
        schedule=tuple(schedule),
        predicted=Predicted(n, n, 0.0, resident + sum(ends.values()), resident, streamed),
        untrapped=tuple(e for e in final if owner[e.name] is None),
    )


def _owner(name: str, order: Sequence[str]) -> int | None:
    best = [i for i, t in enumerate(order) if name.startswith(t + ".")]
    return max(best, key=lambda i: len(order[i])) if best else None


def two_blocks(model: nn.Module, streamed: Sequence[int], order: Sequence[str]) -> list[Copy]:
    """Trap `streamed[j]` split over blocks 2(j%2) and 2(j%2)+1, issued one trap ahead (the
    first one in the previous iteration)."""
    n = len(order)
    out = []
    for j, i in enumerate(streamed):
        a, b = halves(model, order[i])
        issue = (i - 1) % n if j else n - 1
        out += [Copy(i, 2 * (j % 2), 0, issue, i, a), Copy(i, 2 * (j % 2) + 1, 0, issue, i, b)]
    return out


def on_entry(model: nn.Module, streamed: Sequence[int], order: Sequence[str]) -> list[Copy]:
    """Three blocks used in turn. Trap j's first half is prefetched one trap ahead into block
    j % 3; its second half is copied on entry into the block trap j-1's first half held until
    trap j-1 finished (the first trap: both halves in the previous iteration)."""
    n = len(order)
    out = []
    for j, i in enumerate(streamed):
        a, b = halves(model, order[i])
        if j == 0:
            out += [Copy(i, 0, 0, n - 1, i, a), Copy(i, 2, 0, n - 1, i, b)]
        else:
            out += [Copy(i, j % 3, 0, i - 1, i, a), Copy(i, (j - 1) % 3, 0, i, i, b)]
    return out


def ring(model: nn.Module, streamed: Sequence[int], order: Sequence[str],
         ring_bytes: int) -> list[Copy]:  # fmt: skip
    """Every streamed trap in block 0, laid out one after another around a ring of
    `ring_bytes`; runs of a trap's tensors that overlap the previous trap's transfers are
    copied on entry, the others prefetched one trap ahead (the first trap: in the previous
    iteration)."""
    n = len(order)
    cursor, held, out = 0, [], []
    for j, i in enumerate(streamed):
        prefetch = i - 1 if j else n - 1
        groups: list[list] = []  # [start, end, issue_at, names]
        for e in trap_tensors(model, order[i]):
            at = _align(cursor)
            if at + e.bytes > ring_bytes:
                at = 0
            cursor = at + e.bytes
            busy = any(a < cursor and at < b for a, b in held)
            issue = i if busy else prefetch
            if groups and groups[-1][2] == issue and at >= groups[-1][0]:
                groups[-1][1] = cursor
                groups[-1][3].append(e.name)
            else:
                groups.append([at, cursor, issue, [e.name]])
        out += [Copy(i, 0, g[0], g[2], i, tuple(g[3])) for g in groups]
        held = [(g[0], g[1]) for g in groups]
    return out
