"""Why a tensor of a compiled profile stays resident: one line for `ftc inspect --explain`.

Owns: the wording of each reason and the figures it quotes. A tensor the solver pinned says the
solver's reason (discovery's, for one marked not offloadable: the exclude pattern that matches
it, a buffer no pattern names, a tie across traps), and what the profile shows when the reason
was not recorded. A tensor the solver could have streamed says why the plan keeps it: whether
its copy fits the transfer window (scaled by `transfer_budget_scale`) alone and with what its
trap already streams, else that streaming it would not lower the makespan and how the solver
ranks plans that predict the same; in memory mode after the budget's figures (peak, budget, left).
Must not know: the CLI, rendering, how the plan was searched.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from flextensor_compile.solve import BandwidthModel
from flextensor_compile.solve.families import window_ms
from flextensor_compile.solve.problem import TINY_RATIO, align_up, discovery_pin
from flextensor_compile.units import format_bytes
from flextensor_runtime.profile import Profile, TensorEntry

__all__ = ["PlanFacts", "resident_reason", "solver_window_ms"]

_UNTRAPPED = "untrapped"
_TIED_ACROSS = "tied to a tensor of another trap"


@dataclass(frozen=True)
class PlanFacts:
    """What every reason reads: the profile, its copy model, who owns each tensor, the solver's
    pin reasons (from its `solver` section), its winning strategy and the staging bound."""

    profile: Profile
    bw: BandwidthModel
    owner: dict[str, int]  # tensor name -> trap order
    pinned: dict[str, str]
    strategy: str
    bound_ms: float | None

    @cached_property
    def tie_groups(self) -> dict[str, list[TensorEntry]]:
        """Name -> the tensors named so or tied to it, in profile order (one pass, not a scan
        per tensor: a large model's profile has tens of thousands)."""
        groups: dict[str, list[TensorEntry]] = {}
        for t in self.profile.all_tensors():
            groups.setdefault(t.name, []).append(t)
            if t.tie is not None and t.tie != t.name:
                groups.setdefault(t.tie, []).append(t)
        return groups

    @cached_property
    def largest(self) -> tuple[int, ...]:
        """Per trap: its largest tensor's bytes (0: none)."""
        return tuple(max((x.bytes for x in t.tensors), default=0) for t in self.profile.traps)


def solver_window_ms(profile: Profile, order: int) -> float:
    """The transfer window the solver gives trap `order` (`solve.families.window_ms`)."""
    return window_ms(profile.traps, order)


def resident_reason(facts: PlanFacts, e: TensorEntry, order: int) -> str:
    """Why `e` (of trap `order`, -1: untrapped) stays resident."""
    why = facts.pinned.get(e.tie or e.name)
    if e.tie is not None and _split_tie(facts, e, order):  # an alias: the reason recorded for
        marked = why is not None and discovery_pin(why)[0]  # its canonical tensor names it
        shared = (
            f"it {_shared_with(facts, e, order)}, and tied tensors split over traps stay resident"
        )
        return f"kept resident: {'not offloadable: ' if marked else ''}{shared}"
    if why is not None:
        return f"kept resident: {_pinned(facts, e, order, why)}"
    if order < 0:
        return f"kept resident: {_pinned(facts, e, order, _UNTRAPPED)}"
    if _split_tie(facts, e, order):
        return f"kept resident: {_pinned(facts, e, order, _TIED_ACROSS)}"
    trap = facts.profile.traps[order]
    if trap.calls > 1:
        return f"kept resident: its trap runs {trap.calls} times per iteration"
    largest = facts.largest[order]
    if e.bytes * TINY_RATIO < largest:
        return f"kept resident: {_tiny(e, largest)}"
    if e.tie is not None:
        return f"kept resident: it shares storage with {e.tie!r} in its trap, which stays resident"
    return _unstreamed(facts, e, order)


def _pinned(facts: PlanFacts, e: TensorEntry, order: int, why: str) -> str:
    marked, detail = discovery_pin(why)
    if marked:
        return f"not offloadable: {detail or _unrecorded(facts, e)}"
    if why == _UNTRAPPED:
        return ("no trap owns it (it lies outside every trapped module, and no one trap alone "
                "reads it), so it cannot stream")  # fmt: skip
    if why == _TIED_ACROSS:
        return (
            f"it {_shared_with(facts, e, order)}, and tied tensors split over traps stay resident"
        )
    if why.startswith(f"under 1/{TINY_RATIO} "):
        return _tiny(e, facts.largest[order]) if order >= 0 else why
    return why


def _tiny(e: TensorEntry, largest: int) -> str:
    return (f"under 1/{TINY_RATIO} of its trap's largest tensor ({format_bytes(e.bytes)} against "
            f"{format_bytes(largest)}): not worth a copy of its own")  # fmt: skip


def _shared_with(facts: PlanFacts, e: TensorEntry, order: int) -> str:
    """`shares storage with 'x' (trap 3 'head')`: the members of its tie group elsewhere."""
    canon = e.tie or e.name
    group = [t for t in facts.tie_groups.get(canon, ()) if t is not e]
    elsewhere = [t for t in group if facts.owner.get(t.name, -1) != order] or group
    where = ", ".join(f"{t.name!r} ({_trap_label(facts, t.name)})" for t in elsewhere[:3])
    return f"shares storage with {where}" if where else "shares storage with another trap's tensor"


def _split_tie(facts: PlanFacts, e: TensorEntry, order: int) -> bool:
    """Whether a tensor sharing storage with `e` belongs to another trap (or none)."""
    canon = e.tie or e.name
    return any(t is not e and facts.owner.get(t.name, -1) != order
               for t in facts.tie_groups.get(canon, ()))  # fmt: skip


def _trap_label(facts: PlanFacts, name: str) -> str:
    order = facts.owner.get(name)
    return "untrapped" if order is None else f"trap {order} {facts.profile.traps[order].name!r}"


def _unrecorded(facts: PlanFacts, e: TensorEntry) -> str:
    """What the profile shows about a tensor marked not offloadable without a recorded reason
    (a profile or stats file from before discovery recorded them)."""
    if e.kind == "buffer":
        return (f"it is a buffer, and buffers stay resident unless an include pattern names them "
                f"(add --include {e.name!r} to the include patterns)")  # fmt: skip
    order = facts.owner.get(e.name, -1)
    if _split_tie(facts, e, order):
        return (
            f"it {_shared_with(facts, e, order)}, and tied tensors split over traps stay resident"
        )
    return (
        "discovery pinned it (an exclude pattern matches it, code outside its trap reads it, "
        "or its trap runs only in some iterations); this profile does not record which: "
        "re-profile to see it here"
    )


def _unstreamed(facts: PlanFacts, e: TensorEntry, order: int) -> str:
    """A tensor the solver could stream: its copy against its trap's window (alone, then with
    what the trap already streams), else why the plan that keeps it resident ranks first; in
    memory mode after the budget's figures."""
    p = facts.profile
    budget = p.config.budget_bytes
    mode = "latency mode"
    if budget is not None:
        peak = p.predicted.peak_bytes
        mode = (f"memory mode (peak {format_bytes(peak)} of the {format_bytes(budget)} budget, "
                f"{format_bytes(budget - peak)} left)")  # fmt: skip
    window = solver_window_ms(p, order)
    scale = p.config.transfer_budget_scale
    hides = window * scale
    of = f"{window:.3f} ms" + (f" x transfer_budget_scale {scale:g}" if scale != 1.0 else "")
    copy = facts.bw.copy_ms(align_up(e.bytes))
    if copy > hides:
        then = "so streaming it would stall" if scale >= 1.0 else "the part copies may use"
        return (f"{mode}: its copy ({copy:.3f} ms) is longer than the compute before its trap "
                f"({of}), {then}")  # fmt: skip
    streams = sum(t.bytes for t in p.transfers_for(order))
    both = facts.bw.copy_ms(streams + align_up(e.bytes))
    if streams and both > hides:
        return (f"{mode}: its copy ({copy:.3f} ms) fits the window ({of}) alone, but its trap "
                f"already streams {format_bytes(streams)}, and both copies ({both:.3f} ms) do not "
                "fit it")  # fmt: skip
    fits = f"{mode}: its copy ({copy:.3f} ms) fits the window ({of})"
    if p.config.strategy != "adaptive":
        return (f"{fits}, but the {p.config.strategy} strategy does not select it "
                "(--strategy adaptive keeps the best plan of every strategy)")  # fmt: skip
    return f"{fits}, but the plan the solver ranked first keeps it resident: {_ranked(facts)}"


def _ranked(facts: PlanFacts) -> str:
    """How `adaptive` ranks plans, with this plan's figures."""
    pred = facts.profile.predicted
    best = facts.bound_ms is not None and pred.makespan_ms <= facts.bound_ms * (1 + 1e-9)
    least = ", and no plan predicts less" if best else ""
    stall = ", no stall" if best and pred.stall_ms == 0 else ""
    return (f"plans rank by predicted makespan ({pred.makespan_ms:.3f} ms here{least}{stall}), "
            f"then by lower peak ({format_bytes(pred.peak_bytes)} here), then by fewer streamed "
            f"bytes (the {facts.strategy} plan won)")  # fmt: skip
