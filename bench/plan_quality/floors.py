"""Block-shape floors at leaf granularity: `python -m bench.plan_quality.floors [instances]
[--fractions F ...] [--copy-model curve|latency | --copy-curve FILE]`.

Per case it prints the makespan over LB of the best plan of two shapes, each streaming tensors
of one size x, one tensor a copy, and each at least the total compute (D = weight bytes - budget;
the blocks take budget too, so a plan streams D plus its block bytes; copies are counted as a
real number):
- two blocks of x: one is read while the other fills, so the engine never idles: (D + 2x) / x
  copies of t(x) ms;
- one block of x: each copy waits until the tensor before it has been read: (D + x) / x copies
  of t(x) plus the least compute of a trap reading a tensor of that size.
The best x of each shape over the leaf instance's tensor sizes (those with enough tensors to
stream what the shape needs; `-` when no size has) is shown beside our leaf plan's makespan / LB
and the leaf problem's staging bound / LB; the last two columns give the two-block shape's
floor over every size x, as if tensors of any size existed (`any_size_floor_ms`): whether any
model's tensor sizes could let that shape reach a target under the copy model.
These are floors of those shapes only, not bounds on every plan: they say how
far plans of the shapes the worst cases use can go under a copy model, and so whether a target is
out of their reach (per-copy costs against staging: a larger x needs fewer copies but more
staging; one block stages less but idles the engine).
Must not know: how plans are searched; FlexTensor.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import Counter

from bench.plan_quality import auto
from bench.plan_quality.__main__ import (
    FRACTIONS,
    _cases,
    add_copy_model_options,
    copy_model,
    lower_bound_ms,
)
from bench.plan_quality.instances import INSTANCES
from flextensor_compile.solve import Problem, solve, staging_bound_ms

__all__ = ["any_size_floor_ms", "block_floor_ms"]

MB = 1e6


def block_floor_ms(problem: Problem, blocks: int) -> tuple[float, int]:
    """(ms, x): the least over tensor sizes x of the `blocks`-block shape's floor (2: (D + 2x) /
    x copies of t(x); 1: (D + x) / x copies of t(x) plus the least compute of a trap reading a
    tensor of size x), at least the total compute, over the sizes with enough bytes of tensors
    of that size; (inf, 0) when none has, (total compute, 0) when nothing must stream."""
    if blocks not in (1, 2):
        raise ValueError(f"blocks must be 1 or 2, got {blocks}")
    assert problem.budget_bytes is not None  # the floor is about a memory budget
    deficit = problem.total_bytes + problem.reserve_bytes - problem.budget_bytes
    if deficit <= 0:
        return problem.compute_ms, 0
    count: Counter[int] = Counter()
    reader_ms: dict[int, float] = {}
    for trap in problem.traps:
        for it in trap.items:
            count[it.bytes] += 1
            reader_ms[it.bytes] = min(reader_ms.get(it.bytes, math.inf), trap.compute_ms)
    best, best_x = math.inf, 0
    for x, n in sorted(count.items()):
        need = deficit + blocks * x
        if n * x < need:
            continue
        wait_ms = reader_ms[x] if blocks == 1 else 0.0
        ms = max(problem.compute_ms, need / x * (problem.bandwidth.copy_ms(x) + wait_ms))
        if ms < best:
            best, best_x = ms, x
    return best, best_x


def any_size_floor_ms(problem: Problem) -> tuple[float, int]:
    """(ms, x): the two-block shape's floor as if every trap offered a tensor of any size x:
    (D + 2x) / x copies of t(x), least over every x up to D, at least the total compute;
    (total compute, 0) when nothing must stream. Copy time is linear between the curve's
    knots, so on each piece (D + 2x) t(x) / x = D c / x + D b + 2 c + 2 b x with t = c + b x,
    least at x = sqrt(D c / (2 b)) or at a piece's ends: exact, no grid."""
    assert problem.budget_bytes is not None  # the floor is about a memory budget
    deficit = problem.total_bytes + problem.reserve_bytes - problem.budget_bytes
    if deficit <= 0:
        return problem.compute_ms, 0
    bw = problem.bandwidth
    knots = sorted({1, deficit, *(b for b, _ in bw.points if b < deficit)})
    candidates = set(knots)
    for lo, hi in itertools.pairwise(knots):
        slope = (bw.copy_ms(hi) - bw.copy_ms(lo)) / (hi - lo)
        intercept = bw.copy_ms(lo) - slope * lo
        if slope > 0 and intercept > 0:
            best_x = math.sqrt(deficit * intercept / (2 * slope))
            candidates.update(min(hi, max(lo, x)) for x in (math.floor(best_x), math.ceil(best_x)))
    ms, x = min(((deficit + 2 * x) / x * bw.copy_ms(x), x) for x in candidates)
    return max(problem.compute_ms, ms), x


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.floors")
    ap.add_argument("instances", nargs="*", default=list(INSTANCES))
    ap.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS),
                    help="budgets as fractions of the weight bytes")  # fmt: skip
    add_copy_model_options(ap)
    args = ap.parse_args()
    model = copy_model(ap, args)
    print(f"copy model: {model.name}")
    cases = list(_cases(args.instances, tuple(args.fractions), None, model))
    leaves = auto.leaf_problems([(c[0], c[3], c[4]) for c in cases])
    print(f"{'instance':<26}{'link':<6}{'budget':>7}{'LB ms':>10}{'2 blocks/LB':>12}{'x MB':>7}"
          f"{'1 block/LB':>11}{'x MB':>7}{'leaf/LB':>8}{'LB*/LB':>7}{'2 any/LB':>9}{'x MB':>7}")  # fmt: skip
    for (name, link, frac, _stats, p, weights), leaf in zip(cases, leaves, strict=True):
        budget = p.budget_bytes
        assert budget is not None
        lb = lower_bound_ms(p, weights)
        two_ms, two_x = block_floor_ms(leaf, 2)
        one_ms, one_x = block_floor_ms(leaf, 1)
        plan = solve(leaf, "adaptive")
        print(f"{name:<26}{link:<6}{frac:>7.0%}{lb:>10.1f}{_shape(two_ms, two_x, lb, 12)}"
              f"{_shape(one_ms, one_x, lb, 11)}{plan.makespan_ms / lb:>8.3f}"
              f"{staging_bound_ms(leaf) / lb:>7.3f}{_shape(*any_size_floor_ms(leaf), lb, 9)}")  # fmt: skip


def _shape(ms: float, x: int, lb_ms: float, width: int) -> str:
    """A shape's two columns; `-` when no tensor size has enough bytes for it."""
    if math.isinf(ms):
        return f"{'-':>{width}}{'-':>7}"
    return f"{ms / lb_ms:>{width}.3f}{x / MB:>7.1f}"


if __name__ == "__main__":
    main()
