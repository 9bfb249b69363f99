"""Layer-wise offload of a model with tensors on the meta device is refused before any change.

A host master or device copy of a meta tensor holds no values; the install failed half-way with
torch's "Cannot copy out of meta tensor; no data!" (on CUDA after the rest of the model had
already moved to the device)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime import ConfigError, init_weights_on_device
from flextensor_runtime.layerwise import enable_layerwise_offload_on, layerwise_root
from flextensor_runtime.vram.copy_backend import ThreadCopyBackend
from tests.vram.test_layerwise import Stack


@pytest.mark.parametrize("reuse_buffers", [False, True])
@pytest.mark.parametrize("where", ["layers.2.lin", "head"])
def test_meta_tensors_are_refused_and_the_model_is_unchanged(
    where: str, reuse_buffers: bool
) -> None:
    torch.manual_seed(0)
    model = Stack()
    parent, _, key = where.rpartition(".")
    with init_weights_on_device():  # a module whose weights were never loaded
        setattr(model.get_submodule(parent), key, nn.Linear(16, 16 if parent else 3))
    before = dict(model.named_parameters())
    with pytest.raises(ConfigError, match=rf"'{where}\.weight' on the meta device"):
        enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=reuse_buffers)
    assert dict(model.named_parameters()) == before
    assert layerwise_root(model) is None
    assert not any(m._forward_pre_hooks for m in model.modules())
