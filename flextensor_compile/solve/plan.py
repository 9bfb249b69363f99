"""A plan: what streams, into which block, issued when, and what the simulator predicts for it.

Owns: the `Plan` dataclass and `build_plan`, which turns a streamed selection (per trap, which
items stream) and a layout (a block count and order, or the ring: one block holding whatever
the budget leaves) into blocks, a schedule and a simulation; the ring's `RingCandidate` (a
ring plan ranked before its transfers are made: a solve keeps one of many); the per-solve
`PlanCache` (picks, copy times and simulations the candidates of one solve share); and the
memory arithmetic (peak = resident + blocks + activation reserve).
Must not know: how the selection was chosen (strategies), the profile format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress
from operator import itemgetter

from flextensor_compile.solve.assign import assign_blocks, assigned_bytes
from flextensor_compile.solve.bandwidth import BandwidthModel
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.ring import RingPiece, ring_layout, ring_need
from flextensor_compile.solve.simulate import Simulation, simulate_copies

__all__ = [
    "RING",
    "Pick",
    "Plan",
    "PlanCache",
    "PlannedTransfer",
    "Ranked",
    "RingCandidate",
    "Selection",
    "build_plan",
    "copies_of",
    "pick_memory",
    "pick_of",
    "plan_memory",
    "plan_of_transfers",
    "ring_candidate",
]

Selection = tuple[tuple[int, ...], ...]  # per trap: indexes into its `items` that stream
_IDLE_TOLERANCE = 1e-3  # a ring plan this close to its busier lane is not also placed mirrored
# the ring's placements, in the order tried: (mirrored, stacked); by release first
_PLACEMENTS = ((False, False), (True, False), (False, True))
RING = "ring"  # the block order naming the ring layout (one block, tensors placed by release)
_TRAP_ISSUE_BYTES = itemgetter(0, 4, 2)  # of a RingPiece: (trap, issue_at, bytes), a copy's key


@dataclass(frozen=True)
class PlannedTransfer:
    """One packed copy of a trap's streamed items, in this order, into block[offset:+bytes]
    (a block layout gives each trap one transfer at offset 0; the ring may split a trap's)."""

    trap: int
    block: int
    bytes: int
    issue_at: int
    release_after: int
    copy_ms: float
    items: tuple[int, ...]
    offset: int = 0


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


@dataclass(frozen=True)
class PlanCache:
    """What `build_plan` may reuse within one solve: each distinct schedule's simulation (keyed
    by (trap, issue_at, bytes) per copy), each copy size's time, each selection's pick."""

    simulations: dict[tuple[tuple[int, int, int], ...], Simulation] = field(default_factory=dict)
    copy_times: dict[int, float] = field(default_factory=dict)
    picks: dict[Selection, Pick] = field(default_factory=dict)

    def pick(self, problem: Problem, selection: Selection) -> Pick:
        got = self.picks.get(selection)
        if got is None:
            got = self.picks[selection] = pick_of(problem, selection)
        return got

    def copy_ms(self, bw: BandwidthModel, nbytes: int) -> float:
        ms = self.copy_times.get(nbytes)
        if ms is None:
            ms = self.copy_times[nbytes] = bw.copy_ms(nbytes)
        return ms

    def copies_ms(self, bw: BandwidthModel, sizes: Sequence[int]) -> list[float]:
        """`copy_ms` of each size (one call for a whole schedule's copies)."""
        times = self.copy_times
        try:
            return [times[nbytes] for nbytes in sizes]
        except KeyError:  # sizes not timed yet
            for nbytes in set(sizes).difference(times):
                times[nbytes] = bw.copy_ms(nbytes)
            return [times[nbytes] for nbytes in sizes]


@dataclass(frozen=True, eq=False)
class Pick:
    """A selection with its per-trap packed sizes and streamed bytes (what memory needs). The
    selection may be given as a function that makes it: memory needs only the sizes, and most
    picks a search tries are only checked for memory, so their tensors are never listed; `part`
    makes one trap's share alone (a pick mixed from two lists only the traps it keeps of each)."""

    made: Selection | Callable[[], Selection]  # the selection, or what makes it on first use
    slot_bytes: tuple[int, ...]  # per trap: packed size of its transfer (0: none)
    trap_streamed: tuple[int, ...]  # per trap: counted bytes it streams
    part: Callable[[int], tuple[int, ...]] | None = None  # trap -> its items, made alone

    @cached_property
    def selection(self) -> Selection:
        made = self.made
        return made() if callable(made) else made

    def chosen(self, order: int) -> tuple[int, ...]:
        """Trap `order`'s streamed items (`selection[order]`), made alone while the whole
        selection is not."""
        if self.part is None or "selection" in self.__dict__:
            return self.selection[order]
        return self.part(order)

    @cached_property
    def streamed_bytes(self) -> int:  # read by every memory check of the pick: summed once
        return sum(self.trap_streamed)

    @cached_property
    def packed(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(traps with a transfer, their transfer sizes): what block layouts assign (each
        layout checks the pick's memory: packed once)."""
        slots = self.slot_bytes
        return tuple(compress(range(len(slots)), slots)), tuple(filter(None, slots))


def pick_of(problem: Problem, selection: Selection) -> Pick:
    slots, streamed = [], []
    for slot_bytes, counted, chosen in zip(problem.item_slot_bytes, problem.item_bytes,
                                           selection, strict=True):  # fmt: skip
        if chosen:
            slots.append(sum(map(slot_bytes.__getitem__, chosen)))
            streamed.append(sum(map(counted.__getitem__, chosen)))
        else:
            slots.append(0)
            streamed.append(0)
    return Pick(selection, tuple(slots), tuple(streamed))


def pick_memory(
    problem: Problem, pick: Pick, num_blocks: int, order: str = "least-growth"
) -> int | None:
    """Peak bytes of a pick with `num_blocks` blocks (None: cannot be scheduled); for the ring,
    with the staging `ring_need` asks for."""
    if order == RING:
        resident = problem.total_bytes - pick.streamed_bytes
        return resident + ring_need(problem, pick.slot_bytes) + problem.reserve_bytes
    traps, sizes = pick.packed
    blocks = assigned_bytes(traps, sizes, len(problem.traps), num_blocks, order,
                            problem.min_blocks)  # fmt: skip
    if blocks is None:
        return None
    resident = problem.total_bytes - pick.streamed_bytes
    return resident + blocks + problem.reserve_bytes


def plan_memory(
    problem: Problem, selection: Selection, num_blocks: int, order: str = "least-growth"
) -> int | None:
    """Peak bytes of a selection with `num_blocks` blocks (None: cannot be scheduled)."""
    return pick_memory(problem, pick_of(problem, selection), num_blocks, order)


def build_plan(
    problem: Problem,
    selection: Selection,
    num_blocks: int,
    strategy: str,
    order: str = "least-growth",
    *,
    cache: PlanCache | None = None,
) -> Plan | None:
    """Assign, schedule and simulate a selection; None when it cannot be scheduled. `cache`
    (one per solve) lets plans share simulations and copy times."""
    cache = PlanCache() if cache is None else cache
    if order == RING:
        return _build_ring(problem, selection, strategy, cache)
    pick = cache.pick(problem, selection)
    traps, sizes = pick.packed
    n = len(problem.traps)
    a = assign_blocks(traps, sizes, n, num_blocks, order, problem.min_blocks)
    if a is None:
        return None
    copy_ms = cache.copies_ms(problem.bandwidth, sizes)
    transfers = tuple([
        PlannedTransfer(t, a.blocks[j], sizes[j], a.issue_at[j], a.release_after[j], copy_ms[j],
                        selection[t])
        for j, t in enumerate(traps)
    ])  # fmt: skip
    return plan_of_transfers(problem, selection, strategy, a.block_bytes, transfers, cache)


def plan_of_transfers(problem: Problem, selection: Selection, strategy: str,
                      block_bytes: tuple[int, ...], transfers: tuple[PlannedTransfer, ...],
                      cache: PlanCache) -> Plan:  # fmt: skip
    """The plan of a schedule laid out elsewhere (`transfers` into blocks of `block_bytes`
    covering `selection`), simulated."""
    sim = _simulated(problem, tuple([(x.trap, x.issue_at, x.bytes) for x in transfers]), cache)
    streamed = cache.pick(problem, selection).streamed_bytes
    resident = problem.total_bytes - streamed
    peak = resident + sum(block_bytes) + problem.reserve_bytes
    return Plan(strategy, selection, block_bytes, transfers, resident, streamed, peak, sim)


def _simulated(problem: Problem, copies: tuple[tuple[int, int, int], ...], cache: PlanCache
               ) -> Simulation:  # fmt: skip
    """The simulation of `copies` (trap, issue_at, bytes), from `cache` when the same schedule
    was seen."""
    sim = cache.simulations.get(copies)
    if sim is None:
        traps = [x[0] for x in copies]
        issue_at = [x[1] for x in copies]
        sizes = [x[2] for x in copies]
        sim = cache.simulations[copies] = simulate_copies(
            problem.trap_compute_ms, traps, issue_at, cache.copies_ms(problem.bandwidth, sizes)
        )
    return sim


@dataclass(frozen=True, eq=False)
class RingCandidate:
    """A ring plan before its transfers are made (a solve ranks many and keeps one): what
    ranking reads, as the `Plan` has it, and `plan()`, the Plan itself."""

    problem: Problem
    selection: Selection
    strategy: str
    pieces: tuple[RingPiece, ...]
    ring_bytes: int
    resident_bytes: int
    streamed_bytes: int
    simulation: Simulation
    cache: PlanCache

    @property
    def makespan_ms(self) -> float:
        return self.simulation.makespan_ms

    @property
    def block_bytes(self) -> tuple[int, ...]:
        return (self.ring_bytes,)

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.ring_bytes + self.problem.reserve_bytes

    def rank_key(self) -> tuple[float, int, int, str]:
        """`Plan.rank_key` of `plan()`."""
        return (round(self.makespan_ms, 9), self.peak_bytes, self.streamed_bytes, self.strategy)

    def plan(self) -> Plan:
        return _ring_plan(self.problem, self.selection, self.strategy, self.pieces,
                          self.resident_bytes, self.streamed_bytes, self.cache,
                          self.simulation)  # fmt: skip


Ranked = Plan | RingCandidate  # what a solve ranks: a ring plan's transfers wait for `plan()`


def copies_of(plan: Ranked) -> int:
    """How many copies a plan (or ring candidate) makes."""
    return len(plan.pieces) if isinstance(plan, RingCandidate) else len(plan.transfers)


def _build_ring(problem: Problem, selection: Selection, strategy: str,
                cache: PlanCache) -> Plan | None:  # fmt: skip
    found = ring_candidate(problem, selection, strategy, cache)
    return None if found is None else found.plan()


def ring_candidate(problem: Problem, selection: Selection, strategy: str,
                   cache: PlanCache, tight: bool = False) -> RingCandidate | None:  # fmt: skip
    """The ring plan (as a candidate): one block laid out in as much as the budget leaves
    (latency mode: `ring_need` plus the largest transfer), placed by release, mirrored, and
    stacked where the others' split copies cost more than whole ones (the best kept), then cut
    to the bytes the placement used. `tight`: the ring may be smaller
    than `ring_need` asks, down to the largest trap's transfer (copies then wait for the bytes
    the trap before releases: the plan stalls, and fits budgets nothing else does)."""
    pick = cache.pick(problem, selection)
    if not pick.streamed_bytes:
        return None
    resident = problem.total_bytes - pick.streamed_bytes
    need = max(pick.slot_bytes) if tight else ring_need(problem, pick.slot_bytes)
    budget = problem.budget_bytes
    # latency mode (no cap): room for one more transfer, so copies need not wait for bytes
    ring = (
        need + max(pick.slot_bytes) if budget is None else budget - problem.reserve_bytes - resident
    )
    if ring < need:
        return None
    # the placements' plans differ only in makespan and ring bytes: the Plan of the better only
    best: tuple[tuple[float, int], tuple[RingPiece, ...], Simulation] | None = None
    for mirrored, stacked in _PLACEMENTS:
        if best is not None and best[2].makespan_ms <= _busy_ms(best[2]) * (1 + _IDLE_TOLERANCE):
            break  # the engine or the compute stream (nearly) never idles
        if stacked and best is not None and not _splits_cost(problem, pick, *best[1:], cache):
            continue  # stacking only saves the cost of split copies
        pieces = ring_layout(problem, selection, ring, mirrored, stacked)
        if pieces is None:
            continue
        sim = _ring_simulation(problem, pieces, cache)
        rank = (round(sim.makespan_ms, 9), _ring_bytes(pieces))  # as `Plan.rank_key` orders
        if best is None or rank < best[0]:
            best = (rank, pieces, sim)
    if best is None:
        return None
    return RingCandidate(problem, selection, strategy, best[1], best[0][1], resident,
                         pick.streamed_bytes, best[2], cache)  # fmt: skip


def _splits_cost(problem: Problem, pick: Pick, pieces: tuple[RingPiece, ...], sim: Simulation,
                 cache: PlanCache) -> bool:  # fmt: skip
    """Whether copying `pieces` takes the engine more than `_IDLE_TOLERANCE` of the makespan
    longer than copying each trap's transfer whole (each copy has its cost: latency, or a
    lower rate for small copies)."""
    split = sum(cache.copies_ms(problem.bandwidth, [x.bytes for x in pieces]))
    whole = sum(cache.copies_ms(problem.bandwidth, [b for b in pick.slot_bytes if b]))
    return split - whole > sim.makespan_ms * _IDLE_TOLERANCE


def _busy_ms(sim: Simulation) -> float:
    return max(sim.compute_ms, sim.copy_busy_ms)


def _ring_bytes(pieces: tuple[RingPiece, ...]) -> int:
    return max([x.offset + x.bytes for x in pieces])  # bytes never reached stay free


def _ring_simulation(problem: Problem, pieces: tuple[RingPiece, ...], cache: PlanCache
                     ) -> Simulation:  # fmt: skip
    return _simulated(problem, tuple(map(_TRAP_ISSUE_BYTES, pieces)), cache)


def _ring_plan(problem: Problem, selection: Selection, strategy: str,
               pieces: tuple[RingPiece, ...], resident: int, streamed: int,
               cache: PlanCache | None = None, sim: Simulation | None = None) -> Plan:  # fmt: skip
    ring = _ring_bytes(pieces)
    cache = PlanCache() if cache is None else cache
    copy_ms = cache.copies_ms(problem.bandwidth, [x.bytes for x in pieces])
    transfers = tuple([
        PlannedTransfer(x.trap, 0, x.bytes, x.issue_at, x.trap, ms, x.items, x.offset)
        for x, ms in zip(pieces, copy_ms, strict=True)
    ])  # fmt: skip
    sim = _ring_simulation(problem, pieces, cache) if sim is None else sim
    peak = resident + ring + problem.reserve_bytes
    return Plan(strategy, selection, (ring,), transfers, resident, streamed, peak, sim)
