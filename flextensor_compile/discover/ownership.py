"""Which trap owns each model tensor, and which tensors may stream (`offloadable`).

Owns the rules:
- a trap owns every tensor under its module path (parameters, buffers, inner tensor fields);
- a tied name no trap owns goes with its canonical tensor (the same object: a module repeated
  at several paths is one trap at its first path, and reads are recorded per object);
- a tensor no trap owns that exactly one trap reads (and nothing outside traps reads) moves with
  that trap (buffers only when a pattern names them); others stay untrapped, resident;
- a tensor may stream only if its trap selected it (module-level: all parameters and inner
  fields; parameter-level: the matching ones; buffers only when a pattern names them), no exclude
  pattern covers it (a glob matching its path or an ancestor's, or a `class:` pattern matching
  the class of a module its path runs through), its trap runs in every iteration with
  back-to-back calls only, and no other trap (nor code outside traps) reads it;
- tie groups and inner fields with their parent move together: if the members of a group are in
  different traps, or any member must stay, all stay resident;
- a tensor that may not stream carries the first rule that pins it (`TensorStat.pin_reason`,
  e.g. the exclude pattern that matches it, and for a `class:` one the module it matched), so
  `ftc inspect --explain` can say which.
Must not know: torch, timing, the profile wire format.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from flextensor_compile.discover.patterns import Selection, exclusion
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


def _stat(e: TensorEntry, offloadable: bool, why: str | None = None) -> TensorStat:
    return TensorStat(name=e.name, bytes=e.bytes, dtype=e.dtype, shape=e.shape, stride=e.stride,
                      kind=e.kind, tie=e.tie, offloadable=offloadable,
                      pin_reason=None if offloadable else why)  # fmt: skip


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


def _pin_reason(e: TensorEntry, trap: str, sel: Selection, plan: SlotPlan,
                others: tuple[str, ...]) -> str | None:  # fmt: skip
    """Why a trapped tensor may not stream, by the first rule that pins it (None: it may)."""
    if not _selected(e, trap, sel, plan):
        if e.kind == "buffer":
            return (f"it is a buffer, and buffers stay resident unless an include pattern names "
                    f"them (add --include {e.name!r} to the include patterns)")  # fmt: skip
        return f"the parameter-level pattern that selects trap {trap!r} does not name it"
    excluded = exclusion(e.name, sel.exclude, sel.excluded_classes)
    if excluded is not None:
        pattern, module = excluded
        if pattern.startswith("class:"):
            return f"the exclude pattern {pattern!r} matches the module {module!r} it is in"
        return f"the exclude pattern {pattern!r} matches it"
    if trap in plan.conditional:
        return f"its trap {trap!r} does not run in every iteration"
    calls = plan.calls.get(trap, 1)
    if calls != 1 and trap not in plan.contiguous:
        return f"its trap {trap!r} runs {calls} times per iteration with other work between"
    if others:
        more = " ..." if len(others) > 2 else ""
        return f"it is read outside its trap {trap!r} too (by {', '.join(others[:2])}{more})"
    return None


def _place(
    entries: list[TensorEntry], sel: Selection, plan: SlotPlan, reads: dict[str, set[str | None]]
) -> tuple[dict[str, str | None], dict[str, str | None], dict[str, tuple[str, ...]],
           dict[str, str]]:  # fmt: skip
    """Each tensor's trap (None: untrapped) and, before group rules, why it may not stream
    (None: it may; "" for an untrapped one)."""
    traps = set(plan.traps)
    module_traps = {t for t in traps if plan.kinds[t] == "module"}
    home: dict[str, str | None] = {}
    why: dict[str, str | None] = {}
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
            why[e.name] = ""
            continue
        others = tuple(sorted("(outside traps)" if r is None else r for r in readers - {trap}))
        if others:
            cross[e.name] = others
        why[e.name] = _pin_reason(e, trap, sel, plan, others)
    return home, why, cross, moved


def _apply_groups(
    entries: list[TensorEntry], home: dict[str, str | None], why: dict[str, str | None]
) -> list[str]:
    """Pin every member of a group that is split over traps or has a pinned member (with the
    reason); returns the roots of split groups."""
    members: dict[str, list[str]] = defaultdict(list)
    for name, root in _groups(entries).items():
        members[root].append(name)
    split: list[str] = []
    for root, names in members.items():
        spread = len({home[n] for n in names}) > 1
        if spread:
            split.append(root)
        pinned = [n for n in names if why[n] is not None]
        if not spread and not pinned:
            continue
        for n in names:
            if spread:
                where = ", ".join(f"{m!r} ({_place_of(home[m])})" for m in names if m != n)
                why[n] = (f"it shares storage with {where}, and tied tensors split over traps "
                          "stay resident")  # fmt: skip
            elif why[n] is None:
                why[n] = f"it moves with {pinned[0]!r}, which stays resident ({why[pinned[0]]})"
    return split


def _place_of(trap: str | None) -> str:
    return "untrapped" if trap is None else f"trap {trap!r}"


def assign_tensors(
    entries: list[TensorEntry],
    sel: Selection,
    plan: SlotPlan,
    reads: dict[str, set[str | None]],
) -> Assignment:
    """Apply the ownership rules above to every tensor of the model."""
    home, why, cross, moved = _place(entries, sel, plan, reads)
    split = _apply_groups(entries, home, why)
    by_trap: dict[str, list[TensorStat]] = {t: [] for t in plan.traps}
    untrapped: list[TensorStat] = []
    for e in entries:
        trap = home[e.name]
        stat = _stat(e, why[e.name] is None, why[e.name] or None)
        if trap is None:
            untrapped.append(replace(stat, offloadable=False, pin_reason=None))
        else:
            by_trap[trap].append(stat)
    return Assignment(
        by_trap={t: tuple(v) for t, v in by_trap.items()},
        untrapped=tuple(untrapped),
        cross_reads=cross,
        moved=moved,
        split_ties=tuple(sorted(split)),
    )
