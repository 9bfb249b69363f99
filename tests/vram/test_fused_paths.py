"""VRAM wrappers inside modules that read their submodules' weights without calling them.

`nn.MultiheadAttention` passes `out_proj.weight` to its attention op in every path, and
`nn.TransformerEncoderLayer` (eval, no autograd) runs one fused op on the weights of all its
submodules: wrappers there were bypassed, their stored (offload) weights used."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, enable_vram_management
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.section_deploy import install_undoable
from flextensor_runtime.vram.vram_section import parse_vram_section

BF16_HOST = dict(offload_dtype=torch.bfloat16, offload_device="cpu",
                 computation_dtype=torch.float32, computation_device="cpu")  # fmt: skip


def _encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _rounded(model: nn.Module) -> nn.Module:
    """The plain model with its weights rounded to bfloat16 (what the wrappers compute with)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return out


def test_out_proj_wrapped_apart_from_its_attention_is_refused() -> None:
    model = _encoder()
    before = {n: (p, p.dtype) for n, p in model.named_parameters()}
    with pytest.raises(ConfigError, match=r"layers\.0\.self_attn\.out_proj.*MultiheadAttention"):
        enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, BF16_HOST)
    assert {n: (p, p.dtype) for n, p in model.named_parameters()} == before
    assert not any(isinstance(m, AutoWrappedLinear) for m in model.modules())


def test_out_proj_at_its_computation_placement_may_be_wrapped() -> None:
    model = _encoder()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        plain = model(x)
    enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, {"computation_device": "cpu"})
    with torch.no_grad():
        assert torch.equal(model(x), plain)


def test_encoder_layer_calls_its_wrapped_submodules() -> None:
    model = _encoder()
    expected_model = _rounded(model)
    x = torch.randn(2, 5, 32)
    module_map = {nn.MultiheadAttention: AutoWrappedModule, nn.Linear: AutoWrappedLinear,
                  nn.LayerNorm: AutoWrappedModule}  # fmt: skip
    enable_vram_management(model, module_map, BF16_HOST)
    with torch.no_grad():
        assert torch.equal(model(x), expected_model(x))


def test_vram_section_remove_gives_the_fast_path_back() -> None:
    model = _encoder()
    section = parse_vram_section({
        "module_map": [["MultiheadAttention", "AutoWrappedModule"], ["Linear", "AutoWrappedLinear"]],
        "vram_config": {"offload_dtype": "bfloat16", "offload_device": "cpu",
                        "computation_device": "cpu"},
    })  # fmt: skip
    installed = install_undoable(model, section)
    assert all(layer._forward_pre_hooks for layer in model.layers)
    installed.remove()
    assert not any(layer._forward_pre_hooks for layer in model.layers)
