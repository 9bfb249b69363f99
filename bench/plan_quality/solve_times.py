"""Solve times of the suite's module problems alone: for comparing two checkouts side by side.

Each of the 48 module problems (the `curve` copy model) is solved `--repeats` times and the
least time kept; prints the median, the largest and the sum. Run it from each checkout in turn,
alternating, on one machine (`PYTHONPATH=. python -m bench.plan_quality.solve_times`).
"""

from __future__ import annotations

import argparse
import time

from bench.plan_quality.__main__ import FRACTIONS, _cases
from bench.plan_quality.instances import INSTANCES
from flextensor_compile.solve import solve


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.solve_times")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    times = []
    for case in _cases(list(INSTANCES), FRACTIONS):
        least = float("inf")
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            solve(case[4])
            least = min(least, time.perf_counter() - start)
        times.append(least * 1000)
    times.sort()
    print(f"{len(times)} module solves, least of {args.repeats}: median "
          f"{times[len(times) // 2]:.1f} ms, max {times[-1]:.1f} ms, sum {sum(times):.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
