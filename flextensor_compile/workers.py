"""Running independent, pure calls in worker processes when that pays.

Owns: `run_calls`, which applies one picklable function to a list of argument tuples and returns
the results in order, either in this process or in a pool of `spawn`ed worker processes (spawned,
not forked: the caller may run threads, e.g. a progress bar), falling back to this process when
no pool can be started; `parallel_jobs`, the rule for how many workers a batch gets.
Must not know: what the calls compute, the CLI, files.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from typing import Any, TypeVar

__all__ = ["MIN_PARALLEL_S", "parallel_jobs", "run_calls"]

T = TypeVar("T")

MIN_PARALLEL_S = 2.0  # a batch expected to take less in one process stays there (a worker's
# start-up, the imports of the solver, is about 0.2 s)


def parallel_jobs(jobs: int | None, calls: int, expected_s: float) -> int:
    """Workers for `calls` calls expected to take `expected_s` in all: `jobs` when given, else
    one per CPU when the batch is long enough to pay for starting them; never more than one per
    call or per CPU (the calls are CPU-bound: more would only share the CPUs)."""
    if calls <= 1:
        return 1
    cpus = os.cpu_count() or 1
    if jobs is not None:
        return max(1, min(jobs, calls, cpus))
    return min(cpus, calls) if expected_s >= MIN_PARALLEL_S else 1


def run_calls(fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], jobs: int,
              done: Callable[[], None] | None = None) -> list[T]:  # fmt: skip
    """`[fn(*args) for args in calls]`, in `jobs` worker processes when `jobs` > 1; `done` is
    called in this process after each call finishes. An exception a call raises is raised here;
    if no pool can be started or it breaks (no process support, a worker killed), the calls
    that have no result yet run here."""
    results: list[Any] = [_PENDING] * len(calls)
    if jobs > 1:
        # e.g. no semaphores or no /dev/shm, or a worker killed: the rest run here
        with suppress(OSError, NotImplementedError, BrokenProcessPool):
            _in_pool(fn, calls, jobs, done, results)
    for k, args in enumerate(calls):
        if results[k] is _PENDING:
            results[k] = fn(*args)
            if done is not None:
                done()
    return results


_PENDING = object()  # a call with no result yet


def _in_pool(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], jobs: int,
             done: Callable[[], None] | None, results: list[Any]) -> None:  # fmt: skip
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(fn, *args): k for k, args in enumerate(calls)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if done is not None:
                    done()
        except BaseException:
            for future in futures:  # an error or Ctrl-C: drop what has not started
                future.cancel()
            raise
