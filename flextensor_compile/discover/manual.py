"""The hook through which manual traps (`offload_block("name")` regions) are seen during discovery.

Owns: installing a context-local observer for the duration of one discovery or timing forward.
The runtime's `flextensor_runtime.manual` module defines the context variable
`offload_block_observer: ContextVar[Callable[[str, bool], None] | None]`; its `offload_block(name)`
calls `observer(name, True)` on entry and `observer(name, False)` on exit when an observer is set
(and does nothing else when no profile is installed). The compiler sets the observer; the runtime
never imports the compiler.
Must not know: what the observer records, timing, the profile.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["OBSERVER_NAME", "manual_blocks_supported", "observe_manual_blocks"]

OBSERVER_NAME = "offload_block_observer"


def _observer_var() -> ContextVar[Any] | None:
    try:
        module = importlib.import_module("flextensor_runtime.manual")
    except ImportError:
        return None
    var = getattr(module, OBSERVER_NAME, None)
    return var if isinstance(var, ContextVar) else None


def manual_blocks_supported() -> bool:
    """True when the runtime's `offload_block` reports its regions to an observer."""
    return _observer_var() is not None


@contextmanager
def observe_manual_blocks(callback: Callable[[str, bool], None]) -> Iterator[bool]:
    """Route `offload_block` entries/exits to `callback(name, entering)` inside the block.

    Yields whether manual regions can be observed at all (False when the runtime lacks the hook).
    """
    var = _observer_var()
    if var is None:
        yield False
        return
    token = var.set(callback)
    try:
        yield True
    finally:
        var.reset(token)
