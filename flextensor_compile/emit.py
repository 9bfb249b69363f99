"""Emit: a solved plan plus the stats it came from becomes an offload `Profile`.

Owns: packing each transfer's tensors into its block region (in the plan's order, each at an
`ALIGN_BYTES`-aligned offset from the transfer's start, tied aliases at their canonical's offset), the tensor entries,
blocks, schedule and `predicted` section (from the simulator), the model fingerprint, and the
`solver` extension section (the strategy that won, and why each pinned tensor stayed resident).
Must not know: how the plan was searched, msgpack, files, torch.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from flextensor_compile.solve import Plan, Problem, align_up
from flextensor_compile.stats import Stats, TensorStat
from flextensor_runtime.profile import (
    Block,
    Meta,
    PlanConfig,
    Predicted,
    Profile,
    TensorEntry,
    Transfer,
    Trap,
    fingerprint,
)

__all__ = ["SOLVER_SECTION", "emit_profile"]

SOLVER_SECTION = "solver"  # extension section: the winning strategy and why tensors were pinned


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(prod(shape[k + 1 :]) for k in range(len(shape)))


def _entry(t: TensorStat, placement: str = "resident", block: int | None = None,
           offset: int | None = None) -> TensorEntry:  # fmt: skip
    return TensorEntry(
        name=t.name, bytes=t.bytes, dtype=t.dtype, shape=t.shape,
        stride=t.stride or _contiguous(t.shape), placement=placement, block=block,
        offset=offset, tie=t.tie, kind=t.kind,
    )  # fmt: skip


def _offsets(problem: Problem, plan: Plan) -> dict[str, tuple[int, int]]:
    """Streamed canonical tensor name -> (block, offset)."""
    out: dict[str, tuple[int, int]] = {}
    for x in plan.transfers:
        items = problem.traps[x.trap].items
        offset = x.offset
        for k in x.items:
            out[items[k].name] = (x.block, offset)
            offset += align_up(items[k].bytes)
        assert offset == x.offset + x.bytes
    return out


def _traps(stats: Stats, problem: Problem, plan: Plan) -> tuple[Trap, ...]:
    where = _offsets(problem, plan)
    traps = []
    for trap in stats.traps:
        entries = []
        for t in trap.tensors:
            placed = where.get(t.tie or t.name)
            if placed is None:
                entries.append(_entry(t))
            else:
                entries.append(_entry(t, "streamed", placed[0], placed[1]))
        traps.append(Trap(trap.name, trap.kind, trap.compute_ms, tuple(entries), trap.calls))
    return tuple(traps)


def emit_profile(stats: Stats, config: PlanConfig, problem: Problem, plan: Plan,
                 meta: Meta) -> Profile:  # fmt: skip
    """The profile for `plan` (a valid one: it passes `check_profile`)."""
    traps = _traps(stats, problem, plan)
    untrapped = tuple(_entry(t) for t in stats.untrapped)
    sim = plan.simulation
    predicted = Predicted(
        compute_ms=sim.compute_ms, makespan_ms=sim.makespan_ms, stall_ms=sim.stall_ms,
        peak_bytes=plan.peak_bytes, resident_bytes=plan.resident_bytes,
        streamed_bytes=plan.streamed_bytes, trap_stall_ms=sim.trap_stall_ms,
    )  # fmt: skip
    schedule = tuple(
        Transfer(x.trap, x.block, x.offset, x.bytes, x.issue_at, x.release_after)
        for x in plan.transfers
    )
    entries = [e for trap in traps for e in trap.tensors] + list(untrapped)
    return Profile(
        meta=meta,
        model=fingerprint(entries),
        device=stats.device,
        config=replace(config, budget_bytes=problem.budget_bytes),
        traps=traps,
        blocks=tuple(Block(b, size) for b, size in enumerate(plan.block_bytes)),
        schedule=schedule,
        predicted=predicted,
        untrapped=untrapped,
        extensions={SOLVER_SECTION: {"strategy": plan.strategy, "pinned": dict(problem.pinned)}},
    )
