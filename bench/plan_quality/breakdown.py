"""Where the gap to the lower bound goes: `python -m bench.plan_quality.breakdown [instances]
[--copy-model curve|latency | --copy-curve FILE]`.

Per case it prints, for our `adaptive` plan: makespan / LB and over the staging bound LB* with the
bound's binding term (staging or overlap), the winning strategy, the bytes that must move
(weight bytes - budget) against the bytes streamed, the staging blocks, the number of transfers
(and of traps), the smallest and largest transfer, the copy engine's busy and idle time in the
steady-state iteration, how much of the busy time goes to per-copy costs (latency and the slower
small copies) over moving the streamed bytes at the full rate, the stall, and the budget left
unused.
"""

from __future__ import annotations

import argparse

from bench.plan_quality.__main__ import (
    FRACTIONS,
    _cases,
    add_copy_model_options,
    copy_model,
    lower_bound_ms,
)
from bench.plan_quality.instances import INSTANCES
from flextensor_compile.solve import solve, staging_bound

MB = 1e6


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.breakdown")
    ap.add_argument("instances", nargs="*", default=list(INSTANCES))
    add_copy_model_options(ap)
    args = ap.parse_args()
    print(f"{'instance':<24}{'link':<6}{'bud':>4} {'ours/LB':>7} {'/LB*':>6} {'by':<8}"
          f"{'strategy':<24}{'need MB':>8}"
          f"{'stream MB':>10}  {'blocks MB':<18}{'xfers':>6}{'min/max MB':>12}{'busy ms':>9}"
          f"{'idle ms':>8}{'copy ovh':>9}{'stall ms':>9}{'unused MB':>10}")  # fmt: skip
    for name, link, frac, _stats, p, weights in _cases(args.instances, FRACTIONS, None,
                                                      copy_model(ap, args)):
        plan = solve(p, "adaptive")
        budget = p.budget_bytes
        assert budget is not None
        lb = lower_bound_ms(p, weights)
        sim = plan.simulation
        bound = staging_bound(p)
        term = "overlap" if bound.overlap_ms >= bound.bound_ms else (
            "staging" if bound.staging_ms >= bound.bound_ms else "other")  # fmt: skip
        full_rate_ms = sum(t.bytes for t in plan.transfers) / p.bandwidth.tail_bytes_per_ms
        overhead = 1 - full_rate_ms / sim.copy_busy_ms if sim.copy_busy_ms else 0.0
        sizes = [t.bytes / MB for t in plan.transfers] or [0.0]
        blocks = "+".join(f"{b / MB:.0f}" for b in plan.block_bytes) or "-"
        print(f"{name[:23]:<24}{link:<6}{frac:>4.0%} {plan.makespan_ms / lb:>7.3f} "
              f"{plan.makespan_ms / bound.bound_ms:>6.3f} {term:<8}{plan.strategy:<24}{(weights - budget) / MB:>8.0f}{plan.streamed_bytes / MB:>10.0f}"
              f"  {blocks:<18}{len(plan.transfers):>3}/{len(p.traps):<2}"
              f"{min(sizes):>6.0f}/{max(sizes):<5.0f}{sim.copy_busy_ms:>9.1f}"
              f"{max(0.0, sim.makespan_ms - sim.copy_busy_ms):>8.1f}{overhead:>9.1%}"
              f"{sim.stall_ms:>9.1f}"
              f"{(budget - plan.peak_bytes) / MB:>10.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
