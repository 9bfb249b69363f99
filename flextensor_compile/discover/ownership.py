"""Which trap owns each model tensor, and which tensors may stream (`offloadable`).

Owns the rules:
- a trap owns every tensor under its module path (parameters, buffers, inner tensor fields);
- a tied name no trap owns goes with its canonical tensor (the same object: a module repeated
  at several paths is one trap at its first path, and reads are recorded per object);
- a tensor no trap owns that exactly one trap reads (and nothing outside traps reads) moves with
  that trap (buffers only when a pattern names them); others stay untrapped, resident;
- a tensor may stream only if its trap selected it (module-level: all parameters and inner
  fields; parameter-level: the matching ones; buffers only when a pattern names them), no exclude
  pattern covers it, its trap runs in every iteration with back-to-back calls only, and no other
  trap (nor code outside traps) reads it;
- tie groups and inner fields with their parent move together: if the members of a group are in
  different traps, or any member must stay, all stay resident.
Must not know: torch, timing, the profile wire format.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from flextensor_compile.discover.patterns import Selection, is_excluded
from flextensor_compile.discover.slots import SlotPlan
from flextensor_compile.stats import TensorStat
from flextensor_runtime.profile import TensorEntry

__all__ = ["Assignment", "assign_tensors"]


@dataclass(frozen=True)
class Assignment:
    """Tensors per trap (in model order), untrapped tensors, and what was found along the way."""

    by_trap: dict[str, tuple[TensorStat, ...]]
    untrapped: tuple[TensorStat, ...]
    cross_reads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tensor -> readers
    moved: dict[str, str] = field(default_factory=dict)  # tensor -> trap it moved with
    split_ties: tuple[str, ...] = ()  # canonical names of tie groups spread over traps


def _owner(name: str, traps: set[str]) -> str | None:
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in traps:
            return prefix
    return None


def _stat(e: TensorEntry, offloadable: bool) -> TensorStat:
    return TensorStat(name=e.name, bytes=e.bytes, dtype=e.dtype, shape=e.shape, stride=e.stride,
                      kind=e.kind, tie=e.tie, offloadable=offloadable)  # fmt: skip


def _groups(entries: Iterable[TensorEntry]) -> dict[str, str]:
    """name -> group root, joining ties (alias ~ canonical) and inner fields (field ~ parent)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in entries:
        find(e.name)
        links = [e.tie] if e.tie else []
        if e.kind == "inner":
            links.append(e.name.rpartition(".")[0])
        for other in links:
            if other is not None:
                parent[find(e.name)] = find(other)
    return {name: find(name) for name in list(parent)}


def _selected(e: TensorEntry, trap: str, sel: Selection, plan: SlotPlan) -> bool:
    if e.kind == "buffer":
        return e.name in sel.buffers
    if plan.kinds.get(trap) != "module":
        return True
    only = sel.only.get(trap)
    base = e.name.rpartition(".")[0] if e.kind == "inner" else e.name
    return only is None or base in only or e.name in only


def _place(
    entries: list[TensorEntry], sel: Selection, plan: SlotPlan, reads: dict[str, set[str | None]]
) -> tuple[dict[str, str | None], dict[str, bool], dict[str, tuple[str, ...]], dict[str, str]]:
    """Each tensor's trap (None: untrapped) and whether it may stream, before group rules."""
    traps = set(plan.traps)
    module_traps = {t for t in traps if plan.kinds[t] == "module"}
    home: dict[str, str | None] = {}
    ok: dict[str, bool] = {}
    cross: dict[str, tuple[str, ...]] = {}
    moved: dict[str, str] = {}
    for e in entries:
        readers = reads.get(e.name, set())
        trap = _owner(e.name, module_traps)
        if trap is None and e.tie is not None:  # a name no trap owns for a tensor one may own
            trap = home.get(e.tie)  # (one module object at two paths: a trap at its first)
        if trap is None and len(readers) == 1 and None not in readers:
            (reader,) = readers
            if reader in traps and (e.kind != "buffer" or e.name in sel.buffers):
                trap = moved[e.name] = reader
        home[e.name] = trap
        if trap is None:
            ok[e.name] = False
            continue
        others = readers - {trap}
        if others:
            cross[e.name] = tuple(sorted("(outside traps)" if r is None else r for r in others))
        ok[e.name] = (
            _selected(e, trap, sel, plan)
            and not is_excluded(e.name, sel.exclude)
            and trap not in plan.conditional
            and (plan.calls.get(trap, 1) == 1 or trap in plan.contiguous)
            and not others
        )
    return home, ok, cross, moved


def _apply_groups(
    entries: list[TensorEntry], home: dict[str, str | None], ok: dict[str, bool]
) -> list[str]:
    """Pin every member of a group that is split over traps or has a pinned member; returns the
    roots of split groups."""
    members: dict[str, list[str]] = defaultdict(list)
    for name, root in _groups(entries).items():
        members[root].append(name)
    split: list[str] = []
    for root, names in members.items():
        spread = len({home[n] for n in names}) > 1
        if spread:
            split.append(root)
        if spread or not all(ok[n] for n in names):
            for n in names:
                ok[n] = False
    return split


def assign_tensors(
    entries: list[TensorEntry],
    sel: Selection,
    plan: SlotPlan,
    reads: dict[str, set[str | None]],
) -> Assignment:
    """Apply the ownership rules above to every tensor of the model."""
    home, ok, cross, moved = _place(entries, sel, plan, reads)
    split = _apply_groups(entries, home, ok)
    by_trap: dict[str, list[TensorStat]] = {t: [] for t in plan.traps}
    untrapped: list[TensorStat] = []
    for e in entries:
        trap = home[e.name]
        stat = _stat(e, ok[e.name])
        if trap is None:
            untrapped.append(replace(stat, offloadable=False))
        else:
            by_trap[trap].append(stat)
    return Assignment(
        by_trap={t: tuple(v) for t, v in by_trap.items()},
        untrapped=tuple(untrapped),
        cross_reads=cross,
        moved=moved,
        split_ties=tuple(sorted(split)),
    )
