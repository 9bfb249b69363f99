"""Per-trap caps and selections: the building blocks the strategies are made of.

Owns: the transfer window of each trap (compute time of the traps since the previous module
trap, so gap traps widen it), the cap families (time window, uniform bytes, bytes in proportion
to what a trap can stream, and blends), and turning caps into a selection exactly (subset-sum
table) or greedily (largest items first).
Must not know: blocks, schedules, budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flextensor_compile.solve.plan import Selection
from flextensor_compile.solve.problem import Problem
from flextensor_compile.solve.subset import SubsetTable

__all__ = ["CapFamily", "Context", "make_context"]

CapFamily = Callable[[float], tuple[float, ...]]  # level x -> per-trap cap in slot bytes


@dataclass(frozen=True)
class Context:
    """What every strategy reuses: subset tables, windows, and per-trap streamable bytes."""

    problem: Problem
    tables: tuple[SubsetTable, ...]
    window_ms: tuple[float, ...]
    streamable: tuple[int, ...]  # slot bytes if everything a trap can stream streams

    def exact(self, caps: tuple[float, ...]) -> Selection:
        return tuple(t.subsets[t.best_within(c)] for t, c in zip(self.tables, caps, strict=True))

    def greedy(self, caps: tuple[float, ...]) -> Selection:
        out = []
        for trap, cap in zip(self.problem.traps, caps, strict=True):
            order = sorted(range(len(trap.items)), key=lambda k: (-trap.items[k].slot_bytes, k))
            chosen, used = [], 0
            for k in order:
                if used + trap.items[k].slot_bytes <= cap:
                    chosen.append(k)
                    used += trap.items[k].slot_bytes
            out.append(tuple(sorted(chosen)))
        return tuple(out)

    def time_caps(self) -> CapFamily:
        bw, windows = self.problem.bandwidth, self.window_ms
        return lambda x: tuple(float(bw.bytes_within(x * w)) for w in windows)

    def uniform_caps(self) -> CapFamily:
        n = len(self.streamable)
        return lambda x: (x,) * n

    def proportional_caps(self) -> CapFamily:
        top = max(self.streamable, default=0) or 1
        return lambda x: tuple(x * s / top for s in self.streamable)

    def blended_caps(self, alpha: float) -> CapFamily:
        """alpha of the time-window cap plus (1 - alpha) of the uniform cap, at one level."""
        bw, windows = self.problem.bandwidth, self.window_ms
        mean_ms = sum(windows) / max(1, len(windows)) or 1.0
        return lambda x: tuple(
            alpha * bw.bytes_within(x * w / mean_ms) + (1 - alpha) * bw.bytes_within(x)
            for w in windows
        )


def _windows(problem: Problem) -> tuple[float, ...]:
    traps = problem.traps
    n = len(traps)
    out = []
    for i in range(n):
        total, k = 0.0, i - 1
        for _ in range(n - 1):
            total += traps[k % n].compute_ms
            if traps[k % n].kind != "gap":
                break
            k -= 1
        out.append(total)
    return tuple(out)


def make_context(problem: Problem) -> Context:
    tables = tuple(SubsetTable.build(tuple(it.slot_bytes for it in t.items)) for t in problem.traps)
    return Context(problem, tables, _windows(problem),
                   tuple(t.streamable_slot_bytes for t in problem.traps))  # fmt: skip
