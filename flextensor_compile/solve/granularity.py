"""Choosing between two trap granularities of one model: whole modules or their leaves.

Owns: the rule that compares a plan for module traps with a plan for leaf traps (each selected
module split into the descendants that own its parameters). Finer traps lower the staging a
plan needs (a trap's streamed tensors are on the device together while it computes), but every
trap call costs the runtime some host time. The plans are compared by predicted makespan plus
the part of that per-call cost the plan's stalls do not hide (`exposed_call_ms`), then peak, then
the number of traps (fewer wins a tie).
Must not know: modules, torch, how either set of traps was recorded.
"""

from __future__ import annotations

from flextensor_compile.solve.plan import Plan
from flextensor_compile.solve.problem import Problem

__all__ = [
    "RESIDENT_CALL_MS",
    "STREAMING_CALL_MS",
    "call_overhead_ms",
    "exposed_call_ms",
    "prefer_leaves",
]

# host time of one trap call (enter + exit), as `python -m bench.runtime` measures it: 0.8 us for
# a trap that streams nothing and 4.3 us for one that waits for and releases one transfer
RESIDENT_CALL_MS = 0.001
STREAMING_CALL_MS = 0.005


def _call_ms(problem: Problem, plan: Plan) -> list[float]:
    streaming = {t.trap for t in plan.transfers}
    return [
        STREAMING_CALL_MS if order in streaming else RESIDENT_CALL_MS
        for order in range(len(problem.traps))
    ]


def call_overhead_ms(problem: Problem, plan: Plan) -> float:
    """The runtime's host time for one iteration's trap calls under `plan`."""
    return sum(_call_ms(problem, plan))


def exposed_call_ms(problem: Problem, plan: Plan) -> float:
    """The part of the trap calls' host time that lengthens the iteration under `plan`.

    The runtime's waits are stream waits, so the host does not block on a copy: while the
    device stalls for one, the host runs ahead by the stall. The host is assumed to need as long
    to issue a trap's work as the device needs to run it (no lead from compute), and to start
    each iteration with no lead. Walking the traps in order, a stall adds to the lead, a call
    spends it, and a call the lead cannot pay for delays the device by the rest.
    """
    lead_ms = exposed_ms = 0.0
    stalls = plan.simulation.trap_stall_ms
    for stall_ms, call_ms in zip(stalls, _call_ms(problem, plan), strict=True):
        lead_ms += stall_ms - call_ms
        if lead_ms < 0:
            exposed_ms -= lead_ms
            lead_ms = 0.0
    return exposed_ms


def _key(problem: Problem, plan: Plan) -> tuple[float, int, int]:
    cost = plan.makespan_ms + exposed_call_ms(problem, plan)
    return (round(cost, 9), plan.peak_bytes, len(problem.traps))


def prefer_leaves(modules: tuple[Problem, Plan], leaves: tuple[Problem, Plan]) -> bool:
    """Whether the leaf-trap plan beats the module-trap plan (makespan + the call cost its stalls
    do not hide, then peak, then fewer traps)."""
    return _key(*leaves) < _key(*modules)
