"""Layer-wise offload keeps a parameter's inner tensor fields (an FP8 `weight.scale`) and a
tensor subclass's inner tensors: they go where their parameter goes (host masters, device copies
bound for the forward, resident copies outside the stack), and `disable()` gives them back.

The "meta" device stands in for an accelerator here: a forward mixing a meta weight with a host
scale fails as it would on CUDA, so a field left behind on the host is caught without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.layerwise import _move_resident, enable_layerwise_offload_on
from flextensor_runtime.vram.copy_backend import ThreadCopyBackend
from tests.runtime.models import ScaledLinear, TinyLM, on_cuda

two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")


def _ids(device: str = "cpu") -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)).to(device)


def _scaled_lm() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(scaled=True).eval()  # blocks 0 and 2 hold a ScaledLinear


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_scales_survive_round_trips_with_identical_outputs(reuse_buffers: bool) -> None:
    model = _scaled_lm()
    plain = model(_ids())
    weight = model.blocks[0].up.weight
    scale = weight.scale
    handle = enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=reuse_buffers)
    for _ in range(3):  # each forward onloads and offloads every layer
        assert torch.equal(model(_ids()), plain)
    assert model.blocks[0].up.weight is weight and weight.scale is scale  # the host master
    assert handle.report().effective
    assert handle.disable()
    assert model.blocks[0].up.weight.scale is scale and torch.equal(model(_ids()), plain)


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_the_bound_copy_carries_a_device_copy_of_the_scale(reuse_buffers: bool) -> None:
    model = _scaled_lm()
    host_scale = model.blocks[2].up.weight.scale
    enable_layerwise_offload_on(model, ThreadCopyBackend("meta"), reuse_buffers=reuse_buffers)
    seen = []

    def probe(module: nn.Module, args: object) -> None:
        seen.append((module.weight.device.type, module.weight.scale.device.type))
        assert module.weight.scale is not host_scale

    model.blocks[2].up.register_forward_pre_hook(probe)
    for _ in range(2):
        assert model(_ids("meta")).device.type == "meta"  # a host scale would fail here
    assert seen == [("meta", "meta")] * 2
    assert model.blocks[2].up.weight.scale is host_scale


@torch.no_grad()
def test_edited_scales_reach_the_next_forward() -> None:
    from flextensor_runtime import layerwise_offload_mutation_scope

    model, expected = _scaled_lm(), _scaled_lm()
    expected.blocks[0].up.weight.scale.mul_(2)
    enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=True)
    model(_ids())  # block 0 is prefetched again, with the old scale
    with layerwise_offload_mutation_scope(model):
        model.blocks[0].up.weight.scale.mul_(2)
    assert torch.equal(model(_ids()), expected(_ids()))


def test_resident_parameters_take_their_scales_to_the_device() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = ScaledLinear(4, 4)
            self.layers = nn.ModuleList(ScaledLinear(4, 4) for _ in range(2))

    model = Scaled()
    model.proj.weight.tag = "fp8"  # a plain attribute is carried too
    _move_resident(model, list(model.layers), torch.device("meta"))
    weight = model.proj.weight
    assert weight.device.type == "meta" and weight.scale.device.type == "meta"
    assert weight.tag == "fp8"
    assert all(layer.weight.scale.device.type == "cpu" for layer in model.layers)


def test_layers_sharing_a_scale_are_refused_with_reuse_buffers() -> None:
    model = _scaled_lm()
    model.blocks[2].up.weight.scale = model.blocks[0].up.weight.scale
    with pytest.raises(ConfigError, match=r"layers 0 and 2 share an inner tensor field \.scale"):
        enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=True)
    assert not model.blocks[0]._forward_pre_hooks  # nothing installed


class _Affine(nn.Module):
    """x * a + b with (a, b) one tensor-subclass parameter: its inner tensors are `w.a`, `w.b`."""

    def __init__(self, width: int) -> None:
        super().__init__()
        pair = two_tensor.TwoTensor(torch.rand(width), torch.rand(width))
        self.w = nn.Parameter(pair, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.a + self.w.b


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_tensor_subclass_parameters_keep_their_inner_tensors(reuse_buffers: bool) -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 4), nn.ModuleList(_Affine(4) for _ in range(3)))
    layers = model[1]
    x = torch.rand(2, 4)

    def run() -> torch.Tensor:
        h = model[0](x)
        for layer in layers:
            h = layer(h)
        return h

    plain = run()
    handle = enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=reuse_buffers)
    for _ in range(2):
        assert torch.equal(run(), plain)
    assert handle.disable() and torch.equal(run(), plain)


@pytest.mark.cuda
@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_cuda_round_trips_keep_scales(reuse_buffers: bool) -> None:
    from flextensor_runtime import enable_layerwise_cpu_offload

    model = _scaled_lm()
    plain = model(_ids())
    on_cuda(model)  # the stack's weights and scales come back to pinned host masters
    handle = enable_layerwise_cpu_offload(model, device="cuda", reuse_buffers=reuse_buffers)
    for _ in range(2):
        out = model(_ids("cuda"))
        torch.testing.assert_close(out.cpu(), plain, rtol=1e-5, atol=1e-5)
    scale = model.blocks[0].up.weight.scale
    assert scale.device.type == "cpu" and scale.is_pinned() and handle.report().effective
