"""Paired caps (one cap per staging block) against their contract and on an alternating model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_compile.solve import BandwidthModel, SubsetTable, problem_from_stats, solve
from flextensor_compile.solve.paired import classes_of, paired_caps
from flextensor_compile.stats import Stats, TrapStat
from flextensor_runtime.profile import PlanConfig
from tests.solve.instances import device, tensor, total_bytes


def test_classes_alternate_over_the_traps_that_can_stream() -> None:
    assert classes_of((5, 0, 7, 3, 0, 1)) == (0, -1, 1, 0, -1, 1)
    assert classes_of((5, 2, 7, 0)) == (0, -1, 1, -1)  # odd: the smallest sits out


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 1000), min_size=1, max_size=4), min_size=2, max_size=8),
    st.floats(0.0, 1.0),
)
def test_paired_caps_cover_the_requirement(traps: list[list[int]], share: float) -> None:
    tables = tuple(SubsetTable.build(tuple(sizes)) for sizes in traps)
    classes = classes_of(tuple(sum(s) for s in traps))
    bw = BandwidthModel.linear(1e6)
    need = int(share * sum(map(sum, traps)))
    pair = paired_caps(tables, classes, (1.0,) * len(traps), bw, need)
    picks = [[], []]  # type: list[list[int]]
    if pair is None:  # then even streaming everything does not cover need + the two blocks
        for t, c in zip(tables, classes, strict=True):
            if c >= 0:
                picks[c].append(t.sums[-1])
        assert sum(map(sum, picks)) - max(picks[0]) - max(picks[1]) < need
        return
    for t, c in zip(tables, classes, strict=True):
        if c >= 0:
            picks[c].append(t.sums[t.best_within(pair[c])])
    assert sum(map(sum, picks)) - max(picks[0]) - max(picks[1]) >= need


def _alternating(layers: int) -> Stats:
    """Small traps (4 small tensors) between large ones (3 large tensors), copy-bound."""
    traps = []
    for i in range(layers):
        traps.append(TrapStat(f"a{i}", 0.01, tuple(tensor(f"a{i}.{k}", 3000) for k in range(4))))
        traps.append(TrapStat(f"m{i}", 0.01, tuple(tensor(f"m{i}.{k}", 40_000) for k in range(3))))
    return Stats("alt", device(1e8), tuple(traps))


def test_paired_caps_shrink_the_small_block_when_copies_dominate() -> None:
    stats = _alternating(16)
    budget = int(0.3 * total_bytes(stats))
    problem = problem_from_stats(stats, PlanConfig(budget_bytes=budget))
    plan = solve(problem)
    uniform = solve(problem_from_stats(stats, PlanConfig(budget_bytes=budget, num_blocks=2)),
                    "greedy")  # fmt: skip
    assert plan.peak_bytes <= budget
    assert plan.makespan_ms <= uniform.makespan_ms
    assert sum(plan.block_bytes) < sum(uniform.block_bytes)
    assert plan.streamed_bytes < uniform.streamed_bytes
