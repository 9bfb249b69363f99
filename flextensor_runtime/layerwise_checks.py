"""What layer-wise offload refuses about a model's tensors, before it changes anything.

Owns: the checks on the tensors of the layer stack and the rest of the model: every parameter,
buffer and inner tensor field must hold values (none on the meta device: a host master or a
device copy of a meta tensor has none, and copying one failed half-way through the install with
torch's "Cannot copy out of meta tensor"), and with `reuse_buffers=True` no tensor may be shared
by two layers. Each failure is one `ConfigError` line naming the tensor and the fix.
Must not know: hooks, copies, the window (see `layerwise`, `vram.layer_window`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.field_moves import carried_fields

__all__ = ["check_materialized", "check_unshared", "layer_tensors"]


def layer_tensors(layer: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the window copies for `layer`: its parameters and their inner tensor fields."""
    for param in layer.parameters():
        yield "a parameter", param
        for attr, inner in carried_fields(param):
            yield f"an inner tensor field .{attr}", inner


def check_unshared(layers: list[nn.Module]) -> None:
    """`reuse_buffers=True` packs each layer into slots of its own: nothing may be shared."""
    owner: dict[int, int] = {}
    for index, layer in enumerate(layers):
        for what, t in layer_tensors(layer):
            if owner.setdefault(id(t), index) != index:
                raise ConfigError(
                    f"layers {owner[id(t)]} and {index} share {what}: reuse_buffers=True "
                    "forbids shared storage across layers; use reuse_buffers=False"
                )


def check_materialized(model: nn.Module) -> None:
    """Every parameter (with its inner tensor fields) and buffer of `model` holds values."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        fields = [(f"{name}.{attr}", t) for attr, t in carried_fields(tensor)]
        for what, t in [(name, tensor), *fields]:
            if t.device.type == "meta":
                raise ConfigError(
                    f"layer-wise offload got {what!r} on the meta device, which holds no values; "
                    "load the checkpoint into the model first (e.g. load_state_dict(..., "
                    "assign=True)), then enable the offload"
                )
