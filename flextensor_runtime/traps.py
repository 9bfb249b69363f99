"""Direct inference traps: what happens when a trapped module is entered and exited.

Owns: the per-transfer state machine (valid / active / events), issuing the schedule's copies at
trap entry (in `Tables.issues` order: the trap's own on-entry copies first), waiting for every
transfer the trap reads, recording release events at exit, demand loads
when execution departs from the planned order (counted as stalls), the inference-only guard,
the check that each streamed tensor a trap loads is still where its module holds it (a slot
emptied by `module.weight = None` or `del module.weight`, which reach no torch hook), and
per-trap counters. On CUDA nothing here synchronises the host.
Must not know: profiles on disk, how blocks and host buffers were allocated or filled, models
beyond the trap modules' `training` flag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flextensor_runtime.backend import DeviceBackend
from flextensor_runtime.errors import ConfigError, InferenceOnlyError, InstallError
from flextensor_runtime.schedule import Tables

__all__ = ["Runtime", "Slot", "TrapCounters"]

# where a module holds a streamed tensor: (its `_parameters`, `_buffers` or the parameter's
# `__dict__` for an inner field, key, the tensor the runtime fills), and the tensor's name
Slot = tuple[dict[str, Any], str, torch.Tensor]


@dataclass
class TrapCounters:
    """Per-trap counters since install (or the last `reset`)."""

    calls: int = 0
    stalls: int = 0  # transfers read here that had not been issued in time (demand loads)
    issued: int = 0  # copies issued at this trap's entry
    bytes_issued: int = 0
    enter_ns: int = 0  # host time spent in entry (issuing, waiting)


class Runtime:
    """Executes one profile's schedule for one model. Transfers are indexed as in `Tables`."""

    def __init__(
        self,
        tables: Tables,
        trap_names: Sequence[str],
        backend: DeviceBackend,
        copy_fns: Sequence[Callable[[list[Any], Any], None]],
        bind_fn: Callable[[int], None] | None,
        unbind_fn: Callable[[int], None] | None,
        free_fn: Callable[[int], None] | None,
        log: Any,
    ) -> None:
        self.tables = tables
        self.trap_names = tuple(trap_names)
        self.backend = backend
        self._copy = list(copy_fns)
        self._bind, self._unbind, self._free = bind_fn, unbind_fn, free_fn
        self.log = log
        n_transfers = len(tables.transfers)
        self.valid = [False] * n_transfers
        self.active = [0] * n_transfers
        self.ready = [backend.new_event() for _ in range(n_transfers)]
        self.released = [backend.new_event() for _ in range(n_transfers)]
        # a copy into shared block bytes waits for the last reader of every overlapping transfer
        self._after = [[self.released[u] for u in p.conflicts] for p in tables.transfers]
        self.counters = [TrapCounters() for _ in trap_names]
        self.modules: list[torch.nn.Module | None] = [None] * len(trap_names)
        self.grad_tensors: list[tuple[torch.Tensor, ...]] = [() for _ in trap_names]
        self.slots: list[tuple[Slot, ...]] = [() for _ in trap_names]
        self.slot_names: list[tuple[str, ...]] = [() for _ in trap_names]
        self.timing: list[tuple[int, int, int]] | None = None  # (trap, enter_ns, exit_ns)
        self._entered_ns = [0] * len(trap_names)
        self.on_exit: Callable[[int], None] | None = None  # replan's iteration counter
        self._sync = backend.synchronous
        self.index = {name: i for i, name in enumerate(self.trap_names)}
        self.calls = [1] * len(trap_names)  # planned calls per iteration (`Trap.calls`)
        self._calls_seen = [0] * len(trap_names)
        # held from a trap's entry to its exit (re-entrant: nested and gap traps): the schedule
        # state is one thread's at a time, so another thread's trap is refused, never interleaved
        self._owner = threading.RLock()
        self._depth = 0  # traps the owning thread is inside
        self._inside = -1  # the outermost of them

    def set_tables(self, tables: Tables) -> None:
        """Swap in a rebuilt schedule over the same transfers (strategy replan)."""
        assert len(tables.transfers) == len(self.tables.transfers)
        self.tables = tables

    # --- issuing ------------------------------------------------------------------------
    def issue(self, k: int, at: int, demand: bool = False) -> bool:
        """Copy transfer `k` into its region unless a running trap still reads that region."""
        plan = self.tables.transfers[k]
        active, valid, log = self.active, self.valid, self.log
        conflicts = plan.conflicts
        for u in conflicts:
            if active[u]:
                if demand:
                    raise InstallError(
                        f"trap {self.trap_names[plan.transfer.trap]!r} needs bytes of block "
                        f"{plan.transfer.block} that running trap "
                        f"{self.trap_names[self.tables.transfers[u].transfer.trap]!r} still reads "
                        "(this forward nests traps in an order the profile did not record); "
                        "recompile the profile with a forward that takes this path"
                    )
                return False
        for u in conflicts:
            if valid[u]:
                valid[u] = False
                if self._free is not None:
                    self._free(u)
                if log is not None:
                    log.append(("reuse", plan.transfer.block, plan.transfer.trap,
                                self.tables.transfers[u].transfer.trap))  # fmt: skip
        self._copy[k](self._after[k], self.ready[k])
        valid[k] = True
        if log is not None:
            t = plan.transfer
            log.append(("issue", t.trap, t.block, at, t.bytes, demand, t.offset))
            if self._sync:
                log.append(("complete", t.trap))
        if at >= 0:
            c = self.counters[at]
            c.issued += 1
            c.bytes_issued += plan.transfer.bytes
        return True

    def prologue(self) -> None:
        """Issue the cyclic transfers the steady state has in flight when an iteration starts."""
        for k in self.tables.prologue:
            if not self.valid[k]:
                self.issue(k, at=-1)

    def refill(self) -> None:
        """Have every transfer copied again from its host buffer (whose values other code
        changed in place, e.g. `Module.apply` run on the true values): copies made so far are
        dropped, except those a running trap still reads, and the prologue is issued again."""
        self.backend.synchronize()
        for k, valid in enumerate(self.valid):
            if valid and not self.active[k]:
                self.valid[k] = False
                if self._free is not None:
                    self._free(k)
        self.prologue()

    # --- trap entry and exit ------------------------------------------------------------
    def _guard(self, i: int) -> None:
        module = self.modules[i]
        if module is not None and module.training:
            raise InferenceOnlyError(
                f"trap {self.trap_names[i]!r} ran in training mode; offloaded models are "
                "inference-only: call model.eval() (or remove() the profile to train)"
            )
        if torch.is_grad_enabled() and any(t.requires_grad for t in self.grad_tensors[i]):
            raise InferenceOnlyError(
                f"trap {self.trap_names[i]!r} ran under autograd with weights that require "
                "gradients; wrap the call in torch.inference_mode() or torch.no_grad()"
            )
        for held, key, tensor in self.slots[i]:  # one lookup per streamed tensor
            if held.get(key) is not tensor:
                self._refuse_emptied(i)

    def _refuse_emptied(self, i: int) -> None:
        """A streamed tensor of trap `i` is no longer where its module holds it: one line."""
        for (held, key, tensor), name in zip(self.slots[i], self.slot_names[i], strict=True):
            now = held.get(key, held)
            if now is tensor:
                continue
            how = "deleted" if now is held else "set to None" if now is None else "replaced"
            raise ConfigError(
                f"{name} was {how} while an offload profile is installed: trap "
                f"{self.trap_names[i]!r} streams it and would run without it (or crash in torch); "
                "call handle(model).remove() first, then change the model (and compile a profile "
                "for the changed model with `ftc profile`)"
            )

    def enter(self, i: int) -> None:
        if not self._owner.acquire(blocking=False):
            self._refuse_thread(i)
        self._depth += 1
        if self._depth == 1:
            self._inside = i
        try:
            self._enter(i)
        except BaseException:
            self._depth -= 1
            self._owner.release()
            raise

    def _refuse_thread(self, i: int) -> None:
        raise InstallError(
            f"trap {self.trap_names[i]!r} was called from another thread while trap "
            f"{self.trap_names[self._inside]!r} runs: an offloaded model runs one forward at a time (its traps share memory blocks "
            "and one schedule state); call the model from one thread, or hold a lock around "
            "each call"
        )

    def _enter(self, i: int) -> None:
        start = time.perf_counter_ns()
        self._guard(i)
        log, tables, active = self.log, self.tables, self.active
        if log is not None:
            log.append(("enter", i))
        counters = self.counters[i]
        counters.calls += 1
        reads = tables.reads[i]
        for k in reads:
            active[k] += 1
        try:
            self._issue_and_wait(i, counters)
        except BaseException:
            for k in reads:
                active[k] -= 1
            raise
        if self.timing is not None:  # measuring (replan): synchronise so times are compute only
            self.backend.synchronize()
        now = time.perf_counter_ns()
        counters.enter_ns += now - start
        self._entered_ns[i] = now

    def _issue_and_wait(self, i: int, counters: TrapCounters) -> None:
        log, tables, valid = self.log, self.tables, self.valid
        for k in tables.issues[i]:
            if not valid[k]:
                self.issue(k, at=i)
        for k in tables.reads[i]:
            if not valid[k]:
                counters.stalls += 1
                self.issue(k, at=i, demand=True)
            self.backend.wait(self.ready[k])
            if log is not None:
                log.append(("wait", tables.transfers[k].transfer.trap, i))
            if self._bind is not None:
                self._bind(k)

    def exit(self, i: int) -> None:
        try:
            self._exit(i)
        finally:
            self._depth -= 1
            self._owner.release()

    def _exit(self, i: int) -> None:
        log, tables = self.log, self.tables
        if self.timing is not None:
            self.backend.synchronize()
            self.timing.append((i, self._entered_ns[i], time.perf_counter_ns()))
        for k in tables.reads[i]:
            self.active[k] -= 1
            self.backend.record(self.released[k])
            if self._unbind is not None and not self.active[k]:
                self._unbind(k)
            if log is not None:
                log.append(("release", tables.transfers[k].transfer.trap, i))
        if self._free is not None and self._last_call(i):
            for k in tables.releases[i]:
                if not self.active[k] and self.valid[k]:
                    self.valid[k] = False
                    self._free(k)
                    if log is not None:
                        log.append(("free", tables.transfers[k].transfer.trap))
        if log is not None:
            log.append(("exit", i))
        for g in tables.virtual_after[i]:
            self.enter(g)
            self.exit(g)
        if self.on_exit is not None:
            self.on_exit(i)

    def _last_call(self, i: int) -> bool:
        """Whether this exit ends the trap's planned calls for the iteration (`Trap.calls`)."""
        self._calls_seen[i] += 1
        if self._calls_seen[i] < self.calls[i]:
            return False
        self._calls_seen[i] = 0
        return True

    def reset_counters(self) -> None:
        self.counters = [TrapCounters() for _ in self.trap_names]
