"""Manual traps: `offload_block(name)` around model code that cannot be forward-patched.

Owns: entering and exiting a profile's manual trap by name on the model it is installed on
(given explicitly, or the model most recently deployed in this context), and the observer hook
through which an offline compiler sees manual regions while it measures: when
`offload_block_observer` holds a callable, `offload_block(name)` calls `observer(name, True)` on
entry and `observer(name, False)` on exit and needs no deployed model. With neither an observer
nor a deployed model, the block runs its code plainly (so the same model code runs unoffloaded).
Must not know: schedules, blocks, backends, the compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch import nn

from flextensor_runtime.errors import ConfigError

__all__ = ["current_model", "offload_block", "offload_block_observer"]

# The model most recently deployed in this context (set by `offload_from_profile`).
current_model: ContextVar[nn.Module | None] = ContextVar("flextensor_current_model", default=None)

# Set by a measuring tool (the compiler's discovery and timing) for the duration of a forward.
offload_block_observer: ContextVar[Callable[[str, bool], None] | None] = ContextVar(
    "flextensor_offload_block_observer", default=None
)


@contextmanager
def offload_block(name: str, model: nn.Module | None = None) -> Iterator[None]:
    """Run the enclosed code as the profile's manual trap `name`: its streamed weights are
    present on entry, the transfers scheduled there are issued, and they are released on exit.

    `model` defaults to the model most recently deployed with `offload_from_profile`.
    """
    from flextensor_runtime.deploy import handle

    observer = offload_block_observer.get()
    if observer is not None:
        observer(name, True)
        try:
            yield
        finally:
            observer(name, False)
        return
    target = model if model is not None else current_model.get()
    if target is None or "_ft_handle" not in target.__dict__:
        yield  # nothing deployed: the plain model runs this code as it is
        return
    runtime = handle(target).deployment.runtime
    assert runtime is not None
    i = runtime.index.get(name)
    traps = handle(target).profile.traps
    if i is None or traps[i].kind != "manual":
        manual = [t.name for t in traps if t.kind == "manual"]
        which = "" if model is not None else (
            f" of the most recently deployed model (a {type(target).__name__}; pass model= for "
            "another)")  # fmt: skip
        raise ConfigError(
            f"offload_block({name!r}) names no manual trap of the installed profile{which} "
            f"(manual traps: {', '.join(manual) or 'none'}); use one of those names or recompile"
        )
    runtime.enter(i)
    try:
        yield
    finally:
        runtime.exit(i)
