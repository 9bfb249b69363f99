"""Keeping torch's fused fast paths from reading managed weights behind their wrappers' backs.

Owns: the torch modules whose fused fast path reads the weights of their submodules without
calling them, and turning that path off where another wrapper manages those submodules.
`nn.TransformerEncoderLayer` in eval mode without autograd runs one fused op
(`torch._transformer_encoder_layer_fwd`) on the weights of `self_attn`, `linear1`, `linear2`,
`norm1` and `norm2`, calling none of them: a trap or a VRAM wrapper on one of those submodules
never runs, so a streamed weight is read from whatever its memory block holds (garbage, NaN)
and a wrapped one at its offload placement (a dtype or device error). Torch skips the fast path
when any of the layer's modules has a forward hook; a no-op forward pre-hook on the layer turns
it off (it then calls each submodule, as the compiler saw when it recorded the traps), and
removing the hook turns it back on.
Must not know: traps, profiles, placements.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torch import nn

__all__ = ["FUSED_PARENTS", "call_submodules"]

# module classes whose fused fast path reads their submodules' weights without calling them
FUSED_PARENTS: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer,)


def _no_op(_module: nn.Module, _args: Any) -> None:
    """A forward pre-hook that changes nothing: its presence turns the fused fast path off."""
    return None


def call_submodules(model: nn.Module, managed: Collection[int]) -> Callable[[], None]:
    """Turn off the fused fast path of each module in `model` (itself included) that has a
    submodule whose id is in `managed`; return the undo that turns it back on."""
    handles = [
        module.register_forward_pre_hook(_no_op)
        for module in model.modules()
        if isinstance(module, FUSED_PARENTS)
        and any(id(m) in managed for m in module.modules() if m is not module)
    ]

    def undo() -> None:
        for h in handles:
            h.remove()

    return undo
