"""`python -m bench.runtime.guard`: what the call guard costs per trap call, measured side by side.

The guard is the check in front of the forward of each module that owns streamed weights
without a trap of its own (each block's `fc` in the overhead stack, whose traps are the
blocks); this runs the
overhead table with it and with it replaced by nothing, three times each, and prints the median
per-call time of both and their difference. The guard stays on in real use; this only prices it.
Must not know: how the guard decides.
"""

from __future__ import annotations

import statistics
from unittest import mock

from bench.runtime.overhead import measure

__all__ = ["main"]

_ROWS = ("flextensor traps (resident)", "flextensor traps (streamed, 2 blocks)",
         "flextensor traps (2 copies/trap)")  # fmt: skip


def _per_call(repeats: int) -> dict[str, float]:
    runs = [{r.name: r.per_call_us for r in measure(iters=400, warmup=30)} for _ in range(repeats)]
    return {name: statistics.median(run[name] for run in runs) for name in _ROWS}


def main(repeats: int = 3) -> None:
    on = _per_call(repeats)
    with mock.patch("flextensor_runtime.install.guard_owner_calls", lambda *a, **k: lambda: None):
        off = _per_call(repeats)
    print(f"{'variant (64 traps, dim 64)':40s} {'guard on us':>12s} {'off us':>8s} {'cost us':>8s}")
    for name in _ROWS:
        print(f"{name:40s} {on[name]:12.2f} {off[name]:8.2f} {on[name] - off[name]:8.2f}")


if __name__ == "__main__":
    main()
