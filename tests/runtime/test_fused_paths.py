"""Torch's fused fast paths must not read streamed weights behind their traps' backs.

`nn.TransformerEncoderLayer` in eval mode without autograd runs one fused op on the weights of
its submodules, calling none of them: with traps on those submodules (leaf granularity) the
traps never ran and the layer read whatever the memory blocks held (NaN)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.runtime.conftest import assert_same, deploy, deploy_runs_unchanged
from tests.runtime.plans import build_profile, record_order

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")
LEAVES = ("self_attn", "norm1", "linear1", "linear2", "norm2")


def _encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()


@pytest.mark.parametrize("mode", MODES)
def test_encoder_layer_fast_path_runs_the_leaf_traps(mode: str) -> None:
    model = _encoder()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(x)
    names = [f"layers.{i}.{leaf}" for i in range(3) for leaf in LEAVES]
    order, calls = record_order(model, names, x)
    profile = build_profile(model, order, calls=calls, num_blocks=2, prefetch=1, mode=mode)
    h, before = deploy_runs_unchanged(model, profile, (x,), plain, runs=2)
    h.remove()
    assert_same(model, before)
    assert all(not layer._forward_pre_hooks for layer in model.layers)  # the fast path is back
    with torch.no_grad():
        assert torch.equal(model(x), plain)


def test_encoder_layer_trapped_whole_keeps_its_fast_path() -> None:
    model = _encoder()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(x)
    names = [f"layers.{i}" for i in range(3)]
    order, calls = record_order(model, names, x)
    h = deploy(model, build_profile(model, order, calls=calls, num_blocks=2, prefetch=1))
    assert all(not layer._forward_pre_hooks for layer in model.layers)
    with torch.no_grad():
        assert torch.equal(model(x), plain)
    h.remove()
