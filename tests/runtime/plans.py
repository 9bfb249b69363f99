"""A test-only planner: builds valid offload profiles directly for a model.

Each chosen module is a trap (in the given execution order), or a manual trap owning the
tensors under the module paths given for it; chosen traps are streamed into N
round-robin blocks, each copy issued `prefetch` traps ahead (cyclically into the previous
iteration where needed); the rest is resident. Tied tensors read from two traps, and non-dense
tensors, stay resident. Gap traps (`gap:<n>`) can be inserted after any trap.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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
    check_profile,
    fingerprint,
)
from flextensor_runtime.views import is_dense


def record_order(
    model: nn.Module, names: Sequence[str], *args, **kwargs
) -> tuple[list[str], dict[str, int]]:
    """Run one forward and return the trap names in first-call order and their call counts."""
    modules = dict(model.named_modules())
    order: list[str] = []
    calls: dict[str, int] = {}
    handles = []
    for name in names:

        def pre(_m, _a, name=name):
            calls[name] = calls.get(name, 0) + 1
            if name not in order:
                order.append(name)

        handles.append(modules[name].register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return order, calls


def _owner(e: TensorEntry) -> str:
    parts = e.name.split(".")
    cut = 2 if e.kind == "inner" else 1
    return ".".join(parts[:-cut])


def _trap_of(owner: str, traps: Sequence[Sequence[str]]) -> int | None:
    best, best_len = None, -1
    for i, prefixes in enumerate(traps):
        for t in prefixes:
            if (t == "" or owner == t or owner.startswith(t + ".")) and len(t) > best_len:
                best, best_len = i, len(t)
    return best


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class _Options:
    num_blocks: int
    prefetch: int
    align: int


def _trap_list(traps: Sequence[str], gaps_after: Collection[str], manual: dict[str, Sequence[str]]):
    names: list[str] = []
    kinds: list[str] = []
    for t in traps:
        names.append(t)
        kinds.append("manual" if t in manual else "module")
        if t in gaps_after:
            names.append(f"gap:{len(names)}")
            kinds.append("gap")
    prefixes = [manual.get(n, [n]) if k != "gap" else [] for n, k in zip(names, kinds, strict=True)]
    return names, kinds, prefixes


def _layout(entries, owner, stream_ok, n: int, align: int) -> tuple[dict, dict]:
    """trap order -> {tensor name: offset}, trap order -> transfer bytes."""
    layout: dict[int, dict[str, int]] = {}
    sizes: dict[int, int] = {}
    for i in range(n):
        off = 0
        for e in entries:
            if owner[e.name] == i and e.name in stream_ok:
                off = _align(off, align)
                layout.setdefault(i, {})[e.name] = off
                off += e.bytes
        if i in layout:
            sizes[i] = off
    return layout, sizes


def _schedule(sizes: dict[int, int], release: dict[int, int], n: int, opt: _Options):
    """Round-robin blocks, copies `prefetch` traps ahead of their reader (cyclically)."""
    order = sorted(sizes)
    nb = max(1, min(opt.num_blocks, len(order)))
    block_of = {o: s % nb for s, o in enumerate(order)}

    def prev_pos(o: int) -> int:  # where the previous holder of o's block releases it
        same = [q for q in order if block_of[q] == block_of[o]]
        j = same.index(o)
        return release[same[j - 1]] if j > 0 else release[same[-1]] - n

    for o in order:  # a trap whose block is busy until the trap before it gets its own block
        if prev_pos(o) >= o - 1 or release[o] > o:
            block_of[o] = max(block_of.values()) + 1
    n_blocks = max(block_of.values(), default=-1) + 1
    blocks = tuple(
        Block(b, _align(max(sizes[o] for o in order if block_of[o] == b), opt.align))
        for b in range(n_blocks)
    )
    schedule = []
    for o in order:
        pos = min(o - 1, max(o - opt.prefetch, prev_pos(o) + 1))
        schedule.append(Transfer(o, block_of[o], 0, sizes[o], pos % n, release[o]))
    return block_of, blocks, tuple(schedule)


def build_profile(
    model: nn.Module,
    traps: Sequence[str],
    *,
    streamed: Collection[str] | None = None,
    num_blocks: int = 2,
    prefetch: int = 1,
    mode: str = "allocation_block_transfer",
    gaps_after: Collection[str] = (),
    calls: dict[str, int] | None = None,
    manual: dict[str, Sequence[str]] | None = None,
    stream_shared: bool = False,
    align: int = 256,  # as the compiler lays blocks out (cuBLAS picks kernels by alignment)
) -> Profile:
    names, kinds, prefixes = _trap_list(traps, gaps_after, manual or {})
    n = len(names)
    entries = model_tensor_entries(model)
    owner = {e.name: _trap_of(_owner(e), prefixes) for e in entries}
    want = set(names) if streamed is None else set(streamed)
    # canonical tensors read from another trap stay resident, unless `stream_shared`: then
    # their transfer is held until the last trap reading them, in a block of its own
    shared = {e.tie for e in entries if e.tie is not None and owner[e.name] != owner[e.tie]}
    pinned = set() if stream_shared else shared
    stream_ok = {
        e.name for e in entries
        if e.tie is None and e.name not in pinned and owner[e.name] is not None
        and names[owner[e.name]] in want and is_dense(e.shape, e.stride) and e.bytes > 0
    }  # fmt: skip
    layout, sizes = _layout(entries, owner, stream_ok, n, align)
    # a trap called more than once per iteration keeps its bytes until the iteration ends
    release = {o: n - 1 if (calls or {}).get(names[o], 1) > 1 else o for o in sizes}
    for e in entries:
        if e.tie in shared and e.tie in stream_ok:
            o = owner[e.tie]
            assert o is not None and owner[e.name] is not None and owner[e.name] > o
            release[o] = max(release[o], owner[e.name])
    block_of, blocks, schedule = _schedule(sizes, release, n, _Options(num_blocks, prefetch, align))
    placed = {}
    for e in entries:
        canon = e.tie or e.name
        i = owner[canon]
        placed[e.name] = e if canon not in stream_ok else TensorEntry(
            e.name, e.bytes, e.dtype, e.shape, e.stride, "streamed", block_of[i], layout[i][canon],
            e.tie, e.kind)  # fmt: skip
    trap_objs = tuple(
        Trap(names[i], kinds[i], 1.0,
             tuple(placed[e.name] for e in entries if owner[e.name] == i) if kinds[i] != "gap" else (),
             (calls or {}).get(names[i], 1))
        for i in range(n)
    )  # fmt: skip
    return _assemble(trap_objs, placed, entries, owner, blocks, schedule, mode)


def _assemble(trap_objs, placed, entries, owner, blocks, schedule, mode: str) -> Profile:
    all_e = list(placed.values())
    resident = sum(e.bytes for e in all_e if e.placement == "resident" and e.tie is None)
    streamed_b = sum(e.bytes for e in all_e if e.placement != "resident" and e.tie is None)
    peak = resident + sum(b.bytes for b in blocks)
    n = float(len(trap_objs))
    profile = Profile(
        meta=Meta("test-planner", torch.__version__, "tests/runtime/plans.py", "synthetic"),
        model=fingerprint(all_e),
        device=DeviceSpec("cpu", 1 << 36, 1e10, kind="cpu"),
        config=PlanConfig(transfer_mode=mode, num_blocks=len(blocks), strategy="nth-layer"),
        traps=trap_objs,
        blocks=blocks,
        schedule=schedule,
        predicted=Predicted(n, n, 0.0, peak, resident, streamed_b),
        untrapped=tuple(placed[e.name] for e in entries if owner[e.name] is None),
    )
    check_profile(profile)
    return profile
