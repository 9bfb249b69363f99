"""Why each tensor streams or stays resident, and the block assignment table (`--explain`).

Owns: per tensor its trap, placement, transfer window (the compute between the copy's issue
and its reader, or for a resident tensor the window the solver gave its trap: the compute before
it, back through gap traps), its copy time under the device's bandwidth model, and a one-line
reason (where a streamed tensor is copied; why a resident one stays: `why_resident`); the budget
left; the predicted makespan against the staging bound (the least any plan for the same
measurements and budget can predict); and per block the transfers it carries in order. All of it
as plain data (`explanation_json` for `--json`, the same reasons).
Must not know: the CLI, rendering, how the plan was searched.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from flextensor_compile.emit import SOLVER_SECTION
from flextensor_compile.solve.bound import staging_bound_ms
from flextensor_compile.solve.problem import problem_from_stats
from flextensor_compile.sweep import stats_from_profile
from flextensor_compile.timeline import bandwidth_of
from flextensor_compile.why_resident import PlanFacts, resident_reason, solver_window_ms
from flextensor_runtime.errors import FlextensorError
from flextensor_runtime.profile import Profile, TensorEntry, Transfer

__all__ = ["BlockRow", "Explanation", "TensorWhy", "bound_of", "explain_profile",
           "explanation_json"]  # fmt: skip


@dataclass(frozen=True)
class TensorWhy:
    name: str
    trap: str
    placement: str
    bytes: int
    window_ms: float
    copy_ms: float
    reason: str


@dataclass(frozen=True)
class BlockRow:
    block: int
    bytes: int
    # (trap, name, offset, bytes, issue, release)
    transfers: tuple[tuple[int, str, int, int, int, int], ...]


@dataclass(frozen=True)
class Explanation:
    strategy: str
    budget_bytes: int | None
    peak_bytes: int
    budget_left_bytes: int | None
    makespan_ms: float  # predicted
    bound_ms: float | None  # the staging bound (None: the profile's measurements do not solve)
    tensors: tuple[TensorWhy, ...]
    blocks: tuple[BlockRow, ...]


def _window_ms(profile: Profile, t: Transfer, order: int) -> float:
    n = len(profile.traps)
    span = (order - t.issue_at) % n  # 0: an on-entry copy, no compute hides it
    return sum(profile.traps[(t.issue_at + k) % n].compute_ms for k in range(span))


def _solver_section(profile: Profile) -> dict[str, Any]:
    section = profile.extensions.get(SOLVER_SECTION)
    return section if isinstance(section, dict) else {}


def _facts(profile: Profile) -> PlanFacts:
    section = _solver_section(profile)
    pinned = section.get("pinned", {})
    chosen = section.get("strategy")
    return PlanFacts(
        profile=profile,
        bw=bandwidth_of(profile.device),
        owner={e.name: o for o, trap in enumerate(profile.traps) for e in trap.tensors},
        pinned={k: v for k, v in pinned.items() if isinstance(v, str)}
        if isinstance(pinned, dict) else {},
        strategy=chosen if isinstance(chosen, str) else profile.config.strategy,
        bound_ms=bound_of(profile),
    )  # fmt: skip


def _streamed_reason(facts: PlanFacts, e: TensorEntry, order: int, t: Transfer | None) -> str:
    if t is None:  # a tied alias whose canonical tensor another trap's transfer carries
        return f"streamed with {e.tie!r}, whose storage it shares"
    own = facts.profile.transfers_for(order)
    part = f" (1 of {len(own)})" if len(own) > 1 else ""
    window = _window_ms(facts.profile, t, order)
    when = (
        "as its trap is entered, once the bytes it overwrites are released"
        if t.issue_at == order
        else f"at trap {t.issue_at}: {window:.3f} ms of compute before its reader"
    )
    return (f"streamed in trap {order}'s copy{part} of {t.bytes} bytes "
            f"({facts.bw.copy_ms(t.bytes):.3f} ms) into block {t.block} at byte "
            f"{t.offset}, issued {when}")  # fmt: skip


def explain_profile(profile: Profile) -> Explanation:
    facts = _facts(profile)
    bw = facts.bw
    rows = []
    for order, trap in enumerate(profile.traps):
        own = profile.transfers_for(order)
        for e in trap.tensors:
            copy = bw.copy_ms(e.bytes)
            if e.placement != "resident":
                t = _carrier(own, e)
                window = _window_ms(profile, t, order) if t else solver_window_ms(profile, order)
                reason = _streamed_reason(facts, e, order, t)
            else:
                window = solver_window_ms(profile, order)
                reason = resident_reason(facts, e, order)
            rows.append(TensorWhy(e.name, trap.name, e.placement, e.bytes, window, copy, reason))
    for e in profile.untrapped:
        rows.append(TensorWhy(e.name, "", e.placement, e.bytes, 0.0, bw.copy_ms(e.bytes),
                              resident_reason(facts, e, -1)))  # fmt: skip
    budget = profile.config.budget_bytes
    return Explanation(
        strategy=facts.strategy,
        budget_bytes=budget,
        peak_bytes=profile.predicted.peak_bytes,
        budget_left_bytes=None if budget is None else budget - profile.predicted.peak_bytes,
        makespan_ms=profile.predicted.makespan_ms,
        bound_ms=facts.bound_ms,
        tensors=tuple(rows),
        blocks=_blocks(profile),
    )


def bound_of(profile: Profile) -> float | None:
    """The staging bound for the profile's measurements and budget: no plan predicts less
    (None when they cannot be solved again, e.g. no plan fits)."""
    try:
        problem = problem_from_stats(stats_from_profile(profile), profile.config)
    except FlextensorError:
        return None
    bound = staging_bound_ms(problem)
    return bound if math.isfinite(bound) else None


def _carrier(own: tuple[Transfer, ...], e: TensorEntry) -> Transfer | None:
    """The transfer of its trap that carries a streamed tensor (None for a tied alias whose
    canonical tensor is carried by another trap's transfer)."""
    for t in own:
        if (
            t.block == e.block
            and e.offset is not None
            and t.offset <= e.offset < t.offset + t.bytes
        ):
            return t
    return own[0] if own and e.tie is not None else None


def _blocks(profile: Profile) -> tuple[BlockRow, ...]:
    out = []
    for b in profile.blocks:
        users = sorted((t for t in profile.schedule if t.block == b.id),
                       key=lambda t: (t.trap, t.offset))  # fmt: skip
        out.append(BlockRow(b.id, b.bytes, tuple(
            (t.trap, profile.traps[t.trap].name, t.offset, t.bytes, t.issue_at, t.release_after)
            for t in users)))  # fmt: skip
    return tuple(out)


def explanation_json(expl: Explanation) -> dict[str, Any]:
    """A JSON-ready document of the explanation (what `ftc inspect --explain --json` prints)."""
    doc = asdict(expl)
    doc["blocks"] = [
        {"block": r.block, "bytes": r.bytes,
         "transfers": [dict(zip(("trap", "name", "offset", "bytes", "issue_at", "release_after"),
                                t, strict=True)) for t in r.transfers]}
        for r in expl.blocks
    ]  # fmt: skip
    return doc
