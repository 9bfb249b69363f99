"""`--granularity auto`: measure module traps, and leaf traps when they may plan better; keep one.

Owns: when the leaf traps are measured too (the module plan stalls, or does not fit the
budget: a plan that hides every copy leaves leaf traps only their call cost to add), the
comparison of the two plans (`solve.prefer_leaves`: makespan plus the runtime's per-call host
time that the plan's stalls do not hide, then peak, then fewer traps), the profiling cost of both measurements, and the note that
says which granularity was kept and why.
Must not know: how a measurement runs (the caller passes it), the CLI, files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from flextensor_compile.planning import try_solve_stats
from flextensor_compile.solve import Plan, Problem, exposed_call_ms, prefer_leaves
from flextensor_compile.stats import Stats, canonical_stats
from flextensor_runtime.counts import count_of
from flextensor_runtime.model_tensors import owner_path
from flextensor_runtime.profile import PlanConfig

if TYPE_CHECKING:
    from flextensor_compile.compile_api import Compilation

__all__ = ["choose_granularity", "splittable"]

Solved = tuple[Problem, Plan]


def _solved(stats: Stats, config: PlanConfig) -> Solved | None:
    """The plan `ftc plan` would make from these stats (None: none fits the budget)."""
    return try_solve_stats(canonical_stats(stats), config)


def _cost_ms(solved: Solved) -> float:
    return solved[1].makespan_ms + exposed_call_ms(*solved)


def _describe(kept: str, modules: Solved | None, leaves: Solved | None, n: tuple[int, int]) -> str:
    def one(what: str, solved: Solved | None, traps: int) -> str:
        if solved is None:
            return f"{what} ({count_of(traps, 'trap')}) fit no plan"
        return f"{what} ({count_of(traps, 'trap')}) predict {_cost_ms(solved):.3f} ms"

    noun = {"modules": "module", "leaves": "leaf"}[kept]
    return (f"granularity auto: kept {noun} traps; {one('modules', modules, n[0])}, "
            f"{one('leaves', leaves, n[1])} (makespan + trap-call time stalls do not hide)")  # fmt: skip


def splittable(stats: Stats) -> bool:
    """Whether some trap's weights belong to more than one module (its own and its children's):
    only then do leaf traps differ from module traps (a Linear's weight and bias do not split)."""
    return any(len({owner_path(t.name, t.kind) for t in trap.tensors if t.tie is None}) > 1
               for trap in stats.traps)  # fmt: skip


def _traps(c: Compilation) -> int:
    return sum(1 for t in c.stats.traps if t.kind != "gap")


def choose_granularity(measure: Callable[[bool], Compilation], config: PlanConfig) -> Compilation:
    """`measure(leaves)` runs discovery and measurement at one granularity. Module traps are
    measured first; leaf traps only when the module plan stalls or fits no plan (and some module
    trap holds several modules' weights, or a selected module never ran), and they are
    kept when `prefer_leaves` says so, when only they fit, or when neither fits (planning then
    fails naming the smaller budget leaf traps need). The kept compilation's cost counts both
    measurements."""
    modules = measure(False)
    coarse = _solved(modules.stats, config)
    if coarse is not None and coarse[1].makespan_ms <= coarse[0].compute_ms * (1 + 1e-9):
        note = ("granularity auto: kept module traps; their plan hides every copy, so leaf "
                "traps were not measured")  # fmt: skip
        return replace(modules, notes=(*modules.notes, note))
    # a selected module that never ran (a ModuleList is iterated, not called) is no trap, but
    # the modules inside it that own its weights may run: as leaf traps they can stream
    if not splittable(modules.stats) and not modules.discovery.report.unused:
        note = ("granularity auto: kept module traps; each holds one module's weights, so leaf "
                "traps would be the same")  # fmt: skip
        return replace(modules, notes=(*modules.notes, note))
    leaves = measure(True)
    split = _traps(leaves) != _traps(modules)
    fine = _solved(leaves.stats, config) if split else None
    if coarse is None and fine is None:  # neither fits: finer traps need the smaller budget,
        use_leaves = split  # so their error names the budget to ask for
    else:
        use_leaves = fine is not None and (coarse is None or prefer_leaves(coarse, fine))
    kept = leaves if use_leaves else modules
    cost = replace(
        kept.cost,
        discovery_forwards=modules.cost.discovery_forwards + leaves.cost.discovery_forwards,
        warmup_forwards=modules.cost.warmup_forwards + leaves.cost.warmup_forwards,
        profiling_forwards=modules.cost.profiling_forwards + leaves.cost.profiling_forwards,
        seconds=modules.cost.seconds + leaves.cost.seconds,
    )
    note = _describe("leaves" if use_leaves else "modules", coarse, fine,
                     (_traps(modules), _traps(leaves)))  # fmt: skip
    return replace(kept, cost=cost, notes=(*kept.notes, note))
