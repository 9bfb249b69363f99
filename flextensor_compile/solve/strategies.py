"""The strategies: each decides what streams, then shares assignment, schedule and simulation.

Owns: `solve(problem, strategy) -> Plan` and the documented algorithm of every strategy:
- knapsack: per transfer window, the exact largest subset whose copy fits scale x window;
- greedy: per trap, largest tensors first up to one uniform byte cap;
- nth-layer: every n-th trap streams whole (n as large as the budget allows);
- adaptive-knapsack: exact subsets against time windows when copies can hide in compute,
  against bytes in proportion to each trap's weights when copies dominate;
- global-offload: per trap, largest tensors first that fit the window before it;
- global-tensor-selection: exact subsets against blended time-and-bytes caps for the whole model
  at one level (three blends), keeping the best simulated;
- adaptive (default): all of the above, best by makespan, then peak, then streamed bytes.
In memory mode every strategy bisects its level to the smallest that fits the budget, for each
block count tried; latency mode uses the windows scaled by `transfer_budget_scale`, uncapped.
Must not know: the profile format, files, clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flextensor_compile.solve.families import CapFamily, Context, make_context
from flextensor_compile.solve.plan import Plan, Selection, build_plan, plan_memory
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.search import fit_level, smallest_memory
from flextensor_runtime.errors import BudgetError, ConfigError

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "nth_selection", "solve"]

DEFAULT_STRATEGY = "adaptive"
STRATEGIES = ("adaptive", "knapsack", "greedy", "nth-layer", "adaptive-knapsack",
              "global-offload", "global-tensor-selection")  # fmt: skip
_BLOCK_COUNTS = (1, 2, 3)
_MIN_WINDOW_MS = 1e-6  # shorter windows hide no copy

Candidate = tuple[str, Selection]
Generator = Callable[[Context, int], Iterator[Candidate]]


def _fit(ctx: Context, name: str, family: CapFamily, exact: bool, hi: float, k: int
         ) -> Iterator[Candidate]:  # fmt: skip
    select = (lambda x: ctx.exact(family(x))) if exact else (lambda x: ctx.greedy(family(x)))
    p = ctx.problem
    if p.budget_bytes is None:
        yield name, select(p.transfer_budget_scale).selection
        return
    pick = fit_level(ctx, select, hi, k)
    if pick is not None:
        yield name, pick.selection


def _time_hi(ctx: Context) -> float:
    bw = ctx.problem.bandwidth
    ratios = [bw.copy_ms(s) / w for s, w in zip(ctx.streamable, ctx.window_ms, strict=True)
              if s and w > _MIN_WINDOW_MS]  # fmt: skip
    return max(ratios, default=1.0) * 1.001 + 1e-9


def _bytes_hi(ctx: Context) -> float:
    return float(max(ctx.streamable, default=0)) + 1.0


def _latency_family(ctx: Context, name: str, exact: bool, k: int) -> Iterator[Candidate]:
    yield from _fit(ctx, name, ctx.time_caps(), exact, _time_hi(ctx), k)


def _knapsack(ctx: Context, k: int) -> Iterator[Candidate]:
    yield from _fit(ctx, "knapsack", ctx.time_caps(), True, _time_hi(ctx), k)


def _greedy(ctx: Context, k: int) -> Iterator[Candidate]:
    if ctx.problem.budget_bytes is None:
        yield from _latency_family(ctx, "greedy", False, k)
        return
    yield from _fit(ctx, "greedy", ctx.uniform_caps(), False, _bytes_hi(ctx), k)


def _global_offload(ctx: Context, k: int) -> Iterator[Candidate]:
    yield from _fit(ctx, "global-offload", ctx.time_caps(), False, _time_hi(ctx), k)


def _copies_dominate(ctx: Context) -> bool:
    p = ctx.problem
    if p.budget_bytes is None:
        return False
    need = max(0, p.total_bytes + p.reserve_bytes - p.budget_bytes)
    return p.bandwidth.copy_ms(need) > p.compute_ms


def _adaptive_knapsack(ctx: Context, k: int) -> Iterator[Candidate]:
    if _copies_dominate(ctx):
        yield from _fit(ctx, "adaptive-knapsack", ctx.proportional_caps(), True,
                        _bytes_hi(ctx), k)  # fmt: skip
    else:
        yield from _fit(ctx, "adaptive-knapsack", ctx.time_caps(), True, _time_hi(ctx), k)


def _global_tensor_selection(ctx: Context, k: int) -> Iterator[Candidate]:
    if ctx.problem.budget_bytes is None:
        yield from _latency_family(ctx, "global-tensor-selection", True, k)
        return
    hi = ctx.problem.bandwidth.copy_ms(int(_bytes_hi(ctx))) * 1.001 + 1e-9
    yield from _fit(ctx, "global-tensor-selection", ctx.blended_caps(0.0), True, hi, k)
    windows = ctx.window_ms
    mean_ms = sum(windows) / max(1, len(windows))
    if mean_ms > _MIN_WINDOW_MS:
        top = 1.0 + hi / mean_ms
        yield from _fit(ctx, "global-tensor-selection", ctx.window_plus_caps(), True, top, k)


def nth_selection(problem: Problem, step: int) -> Selection:
    """Every trap whose order is a multiple of `step` streams whole (the last one not, when it
    would be adjacent to trap 0 across the iteration boundary)."""
    n = len(problem.traps)
    chosen = {o for o, t in enumerate(problem.traps) if t.items and o % step == 0}
    if 0 in chosen and n - 1 in chosen and n > 1:
        chosen.discard(n - 1)
    return tuple(
        tuple(range(len(t.items))) if o in chosen else () for o, t in enumerate(problem.traps)
    )


def _nth_layer(ctx: Context, k: int) -> Iterator[Candidate]:
    p = ctx.problem
    if p.budget_bytes is None:
        yield "nth-layer", nth_selection(p, 2)
        return
    for step in range(len(p.traps), 0, -1):
        sel = nth_selection(p, step)
        mem = plan_memory(p, sel, k)
        if mem is not None and mem <= p.budget_bytes:
            yield "nth-layer", sel
            return


_GENERATORS: dict[str, Generator] = {
    "knapsack": _knapsack,
    "greedy": _greedy,
    "nth-layer": _nth_layer,
    "adaptive-knapsack": _adaptive_knapsack,
    "global-offload": _global_offload,
    "global-tensor-selection": _global_tensor_selection,
}


def _block_counts(p: Problem) -> tuple[int, ...]:
    if p.num_blocks is not None:
        return (p.num_blocks,)
    return tuple(k for k in _BLOCK_COUNTS if k >= p.min_blocks) or (p.min_blocks,)


def _candidates(ctx: Context, strategy: str) -> Iterator[Plan]:
    names = list(_GENERATORS) if strategy == "adaptive" else [strategy]
    p = ctx.problem
    for k in _block_counts(p):
        for name in names:
            for label, sel in _GENERATORS[name](ctx, k):
                plan = build_plan(p, sel, k, label)
                if plan is None or len(plan.block_bytes) < min(p.min_blocks, len(plan.transfers)):
                    continue
                if p.budget_bytes is None or plan.peak_bytes <= p.budget_bytes:
                    yield plan


def solve(problem: Problem, strategy: str = DEFAULT_STRATEGY) -> Plan:
    """The best plan `strategy` finds; `BudgetError` (with the smallest feasible budget) if none
    fits in memory mode."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    ctx = make_context(problem)
    best: Plan | None = None
    for plan in _candidates(ctx, strategy):
        if best is None or plan.rank_key() < best.rank_key():
            best = plan
    if best is not None:
        return best
    least = smallest_memory(problem, _block_counts(problem), nth_selection(problem, 2))
    hint = f"at least {least} bytes" if least is not None else "more memory"
    also = "" if strategy == DEFAULT_STRATEGY else f" with --strategy {DEFAULT_STRATEGY}"
    raise BudgetError(
        f"no {strategy} plan fits the budget of {problem.budget_bytes} bytes (the smallest "
        f"feasible budget is {hint}); raise --budget or --mem-fraction to {hint}{also}"
    )
