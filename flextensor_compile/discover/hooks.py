"""Trap hooks for the compile side: forward hooks that report trap entries and exits as events.

Owns: installing (and removing) forward pre/post hooks on the root model and the trap modules,
the stack of active traps (a trap entered while another is active is *nested* and reported as
such, not as a top-level trap), iteration boundaries (one root forward = one iteration), manual
`offload_block` regions through `discover.manual`, and the event list:
`Event(kind, name, value)` with kind in begin | end | enter | exit | nested | op (and pause |
resume around the caller's on_enter / on_exit callbacks), and `value` sampled by the caller's
clock (time, FLOPs, or nothing).
Must not know: what the values mean, which tensors a trap owns, the profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from flextensor_compile.discover.manual import observe_manual_blocks

__all__ = ["Event", "TrapHooks"]


@dataclass(frozen=True)
class Event:
    """One boundary seen during a forward. `value` is the sampler's reading at that moment."""

    kind: str
    name: str
    value: Any = 0.0


class TrapHooks:
    """Report trap and iteration boundaries of `root` and `traps` (module path -> module)."""

    def __init__(
        self,
        root: nn.Module | None,
        traps: dict[str, nn.Module],
        sample: Callable[[], Any] = lambda: 0.0,
        on_enter: Callable[[str], None] | None = None,
        on_exit: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root
        self.traps = traps
        self.sample = sample
        self.on_enter = on_enter  # called before the trap's value is sampled
        self.on_exit = on_exit  # called after the trap's value is sampled
        self.events: list[Event] = []
        self.stack: list[str] = []
        self.root_depth = 0
        self.manual_seen = False
        self.manual_names: set[str] = set()
        self.last_exit: str | None = None  # the last top-level trap that exited this iteration

    @property
    def current(self) -> str | None:
        """The outermost active trap (the one that owns what runs now), or None."""
        return self.stack[0] if self.stack else None

    def _enter(self, name: str) -> None:
        if self.stack:
            self.stack.append(name)
            self.events.append(Event("nested", name))
            return
        if self.on_enter is not None:
            self._paused(self.on_enter, name)
        self.stack.append(name)
        self.events.append(Event("enter", name, self.sample()))

    def _exit(self, name: str) -> None:
        if not self.stack:  # an exit without entry (hooks installed mid-forward): ignore
            return
        self.stack.pop()
        if not self.stack:
            self.last_exit = name
            self.events.append(Event("exit", name, self.sample()))
            if self.on_exit is not None:
                self._paused(self.on_exit, name)

    def _paused(self, callback: Callable[[str], None], name: str) -> None:
        """Run a callback between pause and resume marks (its time is no slot's)."""
        self.events.append(Event("pause", name, self.sample()))
        callback(name)
        self.events.append(Event("resume", name, self.sample()))

    def begin(self) -> None:
        """Mark an iteration start (called by hooks, or by the driver when there is no root)."""
        self.last_exit = None
        self.events.append(Event("begin", "", self.sample()))

    def end(self) -> None:
        self.events.append(Event("end", "", self.sample()))

    def mark_op(self) -> None:
        """Record that compute ran outside every trap inside an iteration (a gap candidate)."""
        fresh = not self.events or self.events[-1].kind != "op"
        if not self.stack and fresh:  # outside an iteration: dropped when iterations are split
            self.events.append(Event("op", ""))

    def _manual(self, name: str, entering: bool) -> None:
        self.manual_seen = True
        self.manual_names.add(name)
        if entering:
            self._enter(name)
        else:
            self._exit(name)

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        self.root_depth += 1
        if self.root_depth == 1:
            self.begin()

    def _root_post(self, module: nn.Module, args: Any, output: Any) -> None:
        self.root_depth -= 1
        if self.root_depth == 0:
            self.end()

    @contextmanager
    def installed(self) -> Iterator[TrapHooks]:
        """Hooks live only inside this block; they are removed even if the forward raises."""
        handles = []
        try:
            for name, module in self.traps.items():
                handles.append(module.register_forward_pre_hook(self._pre_for(name)))
                handles.append(module.register_forward_hook(self._post_for(name), always_call=True))
            if self.root is not None:
                handles.append(self.root.register_forward_pre_hook(self._root_pre, prepend=True))
                handles.append(self.root.register_forward_hook(self._root_post, always_call=True))
            with observe_manual_blocks(self._manual):
                yield self
        finally:
            for h in handles:
                h.remove()

    def _pre_for(self, name: str) -> Callable[..., None]:
        def pre(module: nn.Module, args: Any) -> None:
            self._enter(name)

        return pre

    def _post_for(self, name: str) -> Callable[..., None]:
        def post(module: nn.Module, args: Any, output: Any) -> None:
            self._exit(name)

        return post
