"""Execution order from recorded events: trap order, gap traps, calls, and per-slot attribution.

Owns: splitting an event list into iterations (one root forward each), the order of traps (first
iteration, then traps first seen later inserted after their predecessor), which traps are
called more than once (back to back or not) or only in some iterations (conditional), where gap
traps sit (a stretch outside every trap in which compute ran; named `gap:start` or
`gap:after:<previous trap>`), and turning sampled values (time, FLOPs) at boundaries into a
per-slot, per-iteration figure.
Must not know: torch, tensors, how values were sampled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from flextensor_compile.discover.hooks import Event

__all__ = ["SlotPlan", "attribute", "drop_traps", "gap_name", "plan_slots", "split_iterations"]


def gap_name(previous: str | None) -> str:
    """The gap trap after `previous` (None: before the first trap of an iteration)."""
    return "gap:start" if previous is None else f"gap:after:{previous}"


@dataclass(frozen=True)
class SlotPlan:
    """Traps and gaps in execution order, with how each trap was called."""

    order: tuple[str, ...]
    kinds: dict[str, str]  # name -> module | manual | gap
    calls: dict[str, int]  # calls per iteration (the most seen in any iteration)
    contiguous: frozenset[str]  # traps whose repeated calls run back to back
    conditional: frozenset[str]  # traps missing from some iterations
    iterations: int

    @property
    def traps(self) -> tuple[str, ...]:
        return tuple(n for n in self.order if self.kinds[n] != "gap")


def split_iterations(events: list[Event]) -> list[list[Event]]:
    """Events between each `begin` and its `end` (the events outside are dropped)."""
    out: list[list[Event]] = []
    current: list[Event] | None = None
    for e in events:
        if e.kind == "begin":
            current = [e]
        elif current is not None:
            current.append(e)
            if e.kind == "end":
                out.append(current)
                current = None
    return out


def entered_outside(events: list[Event]) -> set[str]:
    """Traps entered outside every `begin`/`end` pair: called by the workload between or
    before the model's forwards (an encoder that `generate()` runs itself), not in an
    iteration."""
    outside: set[str] = set()
    inside = False
    for e in events:
        if e.kind in ("begin", "end"):
            inside = e.kind == "begin"
        elif e.kind == "enter" and not inside:
            outside.add(e.name)
    return outside


def drop_traps(events: list[Event], dropped: set[str]) -> list[Event]:
    """Remove top-level calls of `dropped` traps; their compute becomes outside compute."""
    out: list[Event] = []
    for e in events:
        if e.kind == "nested":
            continue
        if e.kind in ("enter", "exit") and e.name in dropped:
            if e.kind == "enter":
                out.append(Event("op", ""))
            continue
        out.append(e)
    return out


def _insert_order(order: list[str], seq: list[str]) -> None:
    """Add the traps of `seq` not in `order` yet, each after the furthest known trap before it.

    The cursor only moves forward: a trap called again later (a reused module) does not pull
    the traps that follow it back to its first call's place.
    """
    cursor = -1
    for name in seq:
        if name in order:
            cursor = max(cursor, order.index(name))
        else:
            cursor += 1
            order.insert(cursor, name)


def _gaps(tokens: list[str | None]) -> tuple[set[str], set[str]]:
    """tokens: trap names in call order, None for 'compute ran outside traps'.

    Returns the gap slots, and the traps with outside compute between two of their own calls
    (a gap only if those calls turn out not to be back to back in every iteration).
    """
    gaps: set[str] = set()
    between_own_calls: set[str] = set()
    prev: str | None = None
    saw_op = False
    for tok in tokens:
        if tok is None:
            saw_op = True
            continue
        if saw_op and tok != prev:
            gaps.add(gap_name(prev))
        elif saw_op:
            between_own_calls.add(tok)
        prev, saw_op = tok, False
    if saw_op:
        gaps.add(gap_name(prev))
    return gaps, between_own_calls


def plan_slots(events: list[Event], manual: set[str]) -> SlotPlan:
    """Order, calls and gaps from events already cleaned by `drop_traps`."""
    iterations = split_iterations(events)
    order: list[str] = []
    calls: dict[str, int] = defaultdict(int)
    present: dict[str, int] = defaultdict(int)
    broken: set[str] = set()
    gaps: set[str] = set()
    between_own_calls: set[str] = set()
    for it in iterations:
        tokens = [e.name if e.kind == "enter" else None for e in it if e.kind in ("enter", "op")]
        seq = [t for t in tokens if t is not None]
        _insert_order(order, seq)
        found, own = _gaps(tokens)
        gaps |= found
        between_own_calls |= own
        counts: dict[str, int] = defaultdict(int)
        for i, name in enumerate(seq):
            counts[name] += 1
            if counts[name] > 1 and seq[i - 1] != name:
                broken.add(name)
        for name, n in counts.items():
            calls[name] = max(calls[name], n)
            present[name] += 1
    gaps |= {gap_name(t) for t in between_own_calls & broken}
    full: list[str] = [gap_name(None)] if gap_name(None) in gaps else []
    kinds = {g: "gap" for g in gaps}
    for name in order:
        full.append(name)
        kinds[name] = "manual" if name in manual else "module"
        if gap_name(name) in gaps:
            full.append(gap_name(name))
    return SlotPlan(
        order=tuple(full),
        kinds=kinds,
        calls=dict(calls),
        contiguous=frozenset(n for n in order if calls[n] > 1 and n not in broken),
        conditional=frozenset(n for n in order if present[n] < len(iterations)),
        iterations=len(iterations),
    )


def attribute(events: list[Event], plan: SlotPlan) -> dict[str, float]:
    """Per-slot sum of value differences, averaged over iterations (values must be numbers).

    A trap gets its calls (and, for back-to-back calls, the stretches between them); a gap gets
    the stretches that follow its trap. Stretches with no gap slot are dropped.
    """
    totals: dict[str, float] = dict.fromkeys(plan.order, 0.0)
    iterations = split_iterations(events)
    for it in iterations:
        last_name: str | None = None
        last_value = float(it[0].value)
        open_value = last_value
        for e in it[1:]:
            if e.kind == "enter":
                slot = (
                    e.name
                    if e.name == last_name and e.name in plan.contiguous
                    else gap_name(last_name)
                )
                if slot in totals:
                    totals[slot] += float(e.value) - last_value
                open_value = float(e.value)
            elif e.kind == "exit":
                if e.name in totals:
                    totals[e.name] += float(e.value) - open_value
                last_name, last_value = e.name, float(e.value)
            elif e.kind == "end":
                slot = gap_name(last_name)
                if slot in totals:
                    totals[slot] += float(e.value) - last_value
    n = max(len(iterations), 1)
    return {k: v / n for k, v in totals.items()}
