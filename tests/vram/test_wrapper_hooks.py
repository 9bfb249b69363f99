"""A wrapper stands where its module stood: forward hooks and train/eval mode carry over.

AutoWrappedLinear took a Linear's weight and bias but dropped its forward hooks (a pre-hook
that changed the input changed the output no longer) and came up in training mode inside an
eval model."""

from __future__ import annotations

import torch
from torch import nn

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, enable_vram_management

MODULE_MAP = {nn.Linear: AutoWrappedLinear, nn.LayerNorm: AutoWrappedModule}


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3)).eval()


def test_linear_hooks_carry_over_and_stay_removable() -> None:
    model = _net()
    seen: list[str] = []
    model[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    capture = model[2].register_forward_hook(lambda m, a, out: seen.append(type(m).__name__))
    x = torch.randn(3, 4)
    with torch.no_grad():
        plain = model(x)
    seen.clear()
    enable_vram_management(model, MODULE_MAP, {"computation_device": "cpu"})
    with torch.no_grad():
        assert torch.equal(model(x), plain)
    assert seen == ["AutoWrappedLinear"]
    capture.remove()  # the handle taken before wrapping still removes the hook
    with torch.no_grad():
        model(x)
    assert seen == ["AutoWrappedLinear"]


def test_wrappers_keep_the_eval_mode() -> None:
    model = enable_vram_management(_net(), MODULE_MAP, {"computation_device": "cpu"})
    assert not any(m.training for m in model.modules())
