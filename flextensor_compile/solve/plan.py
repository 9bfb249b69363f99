"""A plan: what streams, into which block, issued when, and what the simulator predicts for it.

Owns: the `Plan` dataclass and `build_plan`, which turns a streamed selection (per trap, which
items stream) and a block count into blocks, a schedule and a simulation; and the memory
arithmetic (peak = resident + blocks + activation reserve).
Must not know: how the selection was chosen (strategies), the profile format.
"""

from __future__ import annotations

from dataclasses import dataclass

from flextensor_compile.solve.assign import assign_blocks
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.simulate import CopyJob, Simulation, simulate

__all__ = ["Plan", "PlannedTransfer", "Selection", "build_plan", "plan_memory"]

Selection = tuple[tuple[int, ...], ...]  # per trap: indexes into its `items` that stream


@dataclass(frozen=True)
class PlannedTransfer:
    """The one packed copy of a trap's streamed items (region = block[0:bytes])."""

    trap: int
    block: int
    bytes: int
    issue_at: int
    release_after: int
    copy_ms: float
    items: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    strategy: str
    selection: Selection
    block_bytes: tuple[int, ...]
    transfers: tuple[PlannedTransfer, ...]
    resident_bytes: int
    streamed_bytes: int
    peak_bytes: int
    simulation: Simulation

    @property
    def makespan_ms(self) -> float:
        return self.simulation.makespan_ms

    def rank_key(self) -> tuple[float, int, int, str]:
        """How `adaptive` orders candidates: makespan, then peak, then streamed bytes."""
        return (round(self.makespan_ms, 9), self.peak_bytes, self.streamed_bytes, self.strategy)


def _packed(problem: Problem, selection: Selection) -> tuple[tuple[int, ...], tuple[int, ...]]:
    traps, sizes = [], []
    for order, chosen in enumerate(selection):
        if chosen:
            items = problem.traps[order].items
            traps.append(order)
            sizes.append(sum(items[k].slot_bytes for k in chosen))
    return tuple(traps), tuple(sizes)


def _streamed(problem: Problem, selection: Selection) -> int:
    return sum(problem.traps[o].items[k].bytes for o, ch in enumerate(selection) for k in ch)


def plan_memory(problem: Problem, selection: Selection, num_blocks: int) -> int | None:
    """Peak bytes of a selection with `num_blocks` blocks (None: cannot be scheduled)."""
    traps, sizes = _packed(problem, selection)
    a = assign_blocks(traps, sizes, len(problem.traps), num_blocks, problem.assignment)
    if a is None:
        return None
    resident = problem.total_bytes - _streamed(problem, selection)
    return resident + sum(a.block_bytes) + problem.reserve_bytes


def build_plan(
    problem: Problem, selection: Selection, num_blocks: int, strategy: str
) -> Plan | None:
    """Assign, schedule and simulate a selection; None when it cannot be scheduled."""
    traps, sizes = _packed(problem, selection)
    n = len(problem.traps)
    a = assign_blocks(traps, sizes, n, num_blocks, problem.assignment)
    if a is None:
        return None
    bw = problem.bandwidth
    transfers = tuple(
        PlannedTransfer(t, a.blocks[j], sizes[j], a.issue_at[j], a.release_after[j],
                        bw.copy_ms(sizes[j]), selection[t])
        for j, t in enumerate(traps)
    )  # fmt: skip
    jobs = tuple(CopyJob(x.trap, x.issue_at, x.copy_ms) for x in transfers)
    sim = simulate(tuple(t.compute_ms for t in problem.traps), jobs)
    streamed = _streamed(problem, selection)
    resident = problem.total_bytes - streamed
    peak = resident + sum(a.block_bytes) + problem.reserve_bytes
    return Plan(strategy, selection, a.block_bytes, transfers, resident, streamed, peak, sim)
