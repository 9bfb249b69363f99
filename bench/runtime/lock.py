"""`python -m bench.runtime.lock`: what the one-thread lock costs per trap call, uncontended.

Each trap entry tries the runtime's re-entrant lock without waiting and its exit releases it
(`traps.Runtime.enter` / `exit`); this times that pair, written as there (an attribute lookup
and `acquire(blocking=False)`, then `release()`), on one thread, against an empty statement,
and prints the medians and their difference in nanoseconds.
Must not know: the runtime; it prices a `threading.RLock`, the lock the runtime uses.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import timeit

__all__ = ["main"]


class _Holder:
    def __init__(self) -> None:
        self._owner = threading.RLock()


def _median_ns(stmt: str, number: int, repeats: int) -> tuple[float, float]:
    """Median and least time of one `stmt`, in ns, over `repeats` runs of `number` loops."""
    runs = timeit.repeat(stmt, globals={"rt": _Holder()}, number=number, repeat=repeats)
    per_loop = [run / number * 1e9 for run in runs]
    return statistics.median(per_loop), min(per_loop)


def main(number: int = 200_000, repeats: int = 31) -> float:
    """Print the table; return the median pair cost minus the empty loop, in ns."""
    pair = _median_ns("rt._owner.acquire(blocking=False); rt._owner.release()", number, repeats)
    empty = _median_ns("pass", number, repeats)
    print(f"{'uncontended RLock, ' + str(repeats) + ' x ' + str(number) + ' loops':44s} "
          f"{'median ns':>10s} {'least ns':>9s}")  # fmt: skip
    print(f"{'acquire(blocking=False) + release()':44s} {pair[0]:10.1f} {pair[1]:9.1f}")
    print(f"{'empty statement (the loop)':44s} {empty[0]:10.1f} {empty[1]:9.1f}")
    cost = pair[0] - empty[0]
    print(f"{'per trap call (median difference)':44s} {cost:10.1f}")
    return cost


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.runtime.lock")
    parser.add_argument("--number", type=int, default=200_000, help="loops per run")
    parser.add_argument("--repeats", type=int, default=31, help="runs (the median is taken)")
    args = parser.parse_args()
    main(args.number, args.repeats)
