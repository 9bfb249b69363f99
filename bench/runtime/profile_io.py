"""`python -m bench.runtime.profile_io [--repeats N] [--fraction F]`: reading and writing a large model's profile.

A deployment reads its profile before anything else (`offload_from_profile` loads and checks it),
so its read time is part of start-up; `ftc profile` and `ftc plan` write it. This plans the
DeepSeek-V3-shaped instance of `bench.plan_quality.large` at 30% of its weights (`--fraction`) (124 traps,
45,215 tensor entries) and times, least CPU time of `--repeats`, each step of `wire.loads`
(msgpack decode, section parsing, cross-checks) and of `wire.dumps` (checks, document, encode,
read-back), and prints the file size.
Must not know: how the reader and writer do their work.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.plan_quality.large import deepseek_v3
from flextensor_compile.planning import plan_profile
from flextensor_runtime.profile import PlanConfig
from flextensor_runtime.profile.check import check_profile
from flextensor_runtime.profile.fields import Reader
from flextensor_runtime.profile.wire import (
    _parse_sections,
    dumps,
    loads,
    to_document,
    unpack_bounded,
)

__all__ = ["main"]


def _least_ms(step: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        step()
        best = min(best, time.process_time() - start)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.runtime.profile_io")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a quick run)")
    ap.add_argument("--fraction", type=float, default=0.3, help="the budget, of the weights")
    args = ap.parse_args()
    stats = deepseek_v3() if args.layers is None else deepseek_v3(args.layers)
    weights = sum(t.bytes for trap in stats.traps for t in trap.tensors)
    profile = plan_profile(stats, PlanConfig(budget_bytes=int(args.fraction * weights)))
    data = dumps(profile)
    raw = unpack_bounded(data)
    entries = sum(len(t.tensors) for t in profile.traps) + len(profile.untrapped)
    steps = {
        "loads": lambda: loads(data),
        "  decode": lambda: unpack_bounded(data),
        "  parse": lambda: _parse_sections(Reader(raw, "")),
        "  checks": lambda: check_profile(profile),
        "dumps": lambda: dumps(profile),
        "  document": lambda: to_document(profile),
    }
    n = max(1, args.repeats)
    print(f"deepseek-v3-moe at {args.fraction:.0%}: {len(profile.traps)} traps, {entries} tensor entries, "
          f"{len(data) / 1e6:.1f} MB")  # fmt: skip
    for name, step in steps.items():
        print(f"{name:<12}{_least_ms(step, n):>9.1f} ms")


if __name__ == "__main__":
    main()
