"""VRAM wrappers keep a parameter's inner tensor fields (an FP8 `weight.scale`): every stored
copy and every compute copy carries them, on the parameter's device, in their own dtype (an
`offload_dtype` casts the weight, never its scale), through offload, onload, keep and the disk
tier.

The "meta" device stands in for an accelerator in one test: a computation placement on meta
(set directly, as placements refuse meta) makes a forward that mixes a meta weight with a host
scale fail as it would on CUDA, so a field left behind on the host is caught without a GPU."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    AutoWrappedNonRecurseModule,
    DiskMap,
)
from flextensor_runtime.errors import DiskMapError, VramManagementError
from flextensor_runtime.vram.enable import enable_vram_management
from flextensor_runtime.vram.placement import Placement
from tests.runtime.models import ScaledLinear

BF16 = dict(
    offload_dtype=torch.bfloat16, offload_device="cpu",
    computation_dtype=torch.float32, computation_device="cpu",
)  # fmt: skip
DISK = dict(offload_device="disk", onload_device="disk", computation_device="cpu")


def _scaled() -> ScaledLinear:
    torch.manual_seed(0)
    return ScaledLinear(8, 4).eval()


def _linear_scaled() -> nn.Linear:
    """`_scaled()`'s weights and scale on a plain nn.Linear (AutoWrappedLinear refuses a Linear
    subclass with its own forward; its GEMM does not read the scale, it only carries it)."""
    source = _scaled()
    module = nn.Linear(8, 4).eval()
    module.load_state_dict(source.state_dict())
    module.weight.scale = source.weight.scale  # type: ignore[attr-defined]
    return module


def _rounded(module: nn.Module) -> nn.Module:
    """A copy of `module` with its weights rounded through bfloat16 and its scales as they are
    (`copy.deepcopy` of a Parameter drops its attributes, so they are set again)."""
    out = copy.deepcopy(module)
    for param, source in zip(out.parameters(), module.parameters(), strict=True):
        param.data = param.data.bfloat16().float()
        param.__dict__.update(vars(source))
    return out


def _x(device: str = "cpu") -> torch.Tensor:
    return torch.rand(3, 8, generator=torch.Generator().manual_seed(2)).to(device)


@pytest.fixture
def disk_map(tmp_path: Path) -> DiskMap:
    """A checkpoint of `_scaled()` as a state dict writes it: no `weight.scale`."""
    path = tmp_path / "scaled.safetensors"
    save_file({k: v.contiguous() for k, v in _scaled().state_dict().items()}, str(path))
    return DiskMap(str(path), "cpu")


@torch.no_grad()
def test_a_module_wrapper_keeps_the_scale_through_transitions() -> None:
    module = _scaled()
    scale = module.weight.scale.clone()
    expected = _rounded(module)(_x())
    wrapper = AutoWrappedModule(module, **BF16)
    for move in (None, wrapper.onload, wrapper.keep, wrapper.offload, wrapper.preparing):
        if move is not None:
            move()
        weight = wrapper.module.weight
        assert weight.dtype == (torch.bfloat16 if wrapper.state == 0 else torch.float32)
        assert weight.scale.dtype == torch.float32 and torch.equal(weight.scale, scale)
        assert torch.equal(wrapper(_x()), expected)
        assert torch.equal(wrapper.computation()(_x()), expected)  # a clone keeps it too
    clone = wrapper.cast_to(wrapper.module, torch.float32, "cpu")
    assert clone.weight.scale.dtype == torch.float32 and torch.equal(clone(_x()), expected)


@torch.no_grad()
def test_a_linear_wrapper_keeps_the_scale_through_transitions() -> None:
    module = _linear_scaled()
    scale = module.weight.scale
    wrapper = AutoWrappedLinear(module, **BF16)
    for move in (None, wrapper.keep, wrapper.offload):
        if move is not None:
            move()
        assert wrapper.weight.scale.dtype == torch.float32
        assert torch.equal(wrapper.weight.scale, scale)
        weight, _ = wrapper.computation()
        assert weight.dtype == torch.float32 and torch.equal(weight.scale, scale)


@torch.no_grad()
def test_enable_vram_management_keeps_scales() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(ScaledLinear(8, 8), nn.GELU(), ScaledLinear(8, 8), nn.Linear(8, 4))
    expected = _rounded(model)(_x())
    enable_vram_management(model, {ScaledLinear: AutoWrappedModule, nn.Linear: AutoWrappedLinear},
                           BF16)  # fmt: skip
    assert torch.equal(model(_x()), expected)
    assert model[0].module.weight.scale.dtype == torch.float32


class _DirectScaled(nn.Module):
    """A module with a direct scaled weight and a child Linear (wrapped separately)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.weight = nn.Parameter(torch.rand(4, 8))
        self.weight.scale = torch.rand(4, 1) + 0.5  # type: ignore[attr-defined]
        self.child = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(F.linear(x, self.weight * self.weight.scale))  # type: ignore[attr-defined]


@torch.no_grad()
def test_a_non_recurse_wrapper_keeps_the_scale_of_its_direct_weight() -> None:
    module = _DirectScaled().eval()
    reference = _DirectScaled().eval()
    reference.weight.data = reference.weight.data.bfloat16().float()
    wrapper = AutoWrappedNonRecurseModule(module, **BF16)
    assert module.weight.dtype == torch.bfloat16 and module.weight.scale.dtype == torch.float32
    assert module.child.weight.dtype == torch.float32  # not managed here
    assert torch.equal(wrapper(_x()), reference(_x()))
    assert wrapper.computation() is module and torch.equal(module(_x()), reference(_x()))


@torch.no_grad()
@pytest.mark.parametrize("wrapper_class", [AutoWrappedModule, AutoWrappedLinear])
def test_compute_copies_take_the_scale_to_the_computation_device(wrapper_class: type) -> None:
    module = _scaled() if wrapper_class is AutoWrappedModule else _linear_scaled()
    wrapper = wrapper_class(module, offload_device="cpu", computation_device="cpu")
    wrapper.stages = replace(wrapper.stages, computation=Placement(torch.float32, "meta"))
    if wrapper_class is AutoWrappedModule:
        assert wrapper(_x("meta")).device.type == "meta"  # a host scale fails here
        weight = wrapper.computation().weight
    else:
        weight, _ = wrapper.computation()
    assert weight.device.type == "meta" and weight.scale.device.type == "meta"
    assert wrapper.weight.scale.device.type == "cpu"  # the stored one stays


@torch.no_grad()
def test_on_the_disk_tier_the_scale_waits_on_the_host(disk_map: DiskMap) -> None:
    module = _scaled()
    scale = module.weight.scale
    expected = module(_x())
    wrapper = AutoWrappedModule(module, disk_map=disk_map, **DISK)
    assert wrapper.module.weight.device.type == "meta"  # the checkpoint has no scale
    assert wrapper.module.weight.scale is scale
    assert torch.equal(wrapper(_x()), expected)
    clone = wrapper.load_from_disk(torch.float32, "cpu", copy_module=True)
    assert clone.weight.scale is scale and torch.equal(clone(_x()), expected)
    wrapper.offload_to_disk(clone)  # a clone's placeholders keep the scale as well
    assert clone.weight.device.type == "meta" and clone.weight.scale is scale
    wrapper.load_from_disk(torch.float32, "cpu")  # in place
    assert wrapper.module.weight.scale is scale and torch.equal(wrapper(_x()), expected)
    wrapper.offload_to_disk(wrapper.module)
    assert wrapper.module.weight.device.type == "meta" and wrapper.module.weight.scale is scale
    assert torch.equal(wrapper(_x()), expected)


@torch.no_grad()
def test_a_linear_on_the_disk_tier_keeps_the_scale(disk_map: DiskMap) -> None:
    module = _linear_scaled()
    scale = module.weight.scale
    wrapper = AutoWrappedLinear(module, disk_map=disk_map, **DISK)
    weight, _ = wrapper.load_from_disk(torch.float32, "cpu", assign=False)
    assert weight.scale is scale and wrapper.weight.device.type == "meta"
    wrapper.load_from_disk(torch.float32, "cpu")
    assert wrapper.weight.scale is scale and wrapper.weight.device.type == "cpu"
    wrapper.offload()
    assert wrapper.weight.device.type == "meta" and wrapper.weight.scale is scale


def _meta_scaled() -> ScaledLinear:
    """`_scaled()` built with everything on meta, its scale too (a meta buffer-like field)."""
    module = _scaled()
    module.to("meta")
    module.weight.scale = torch.empty(4, 1, device="meta")  # type: ignore[attr-defined]
    return module


@torch.no_grad()
def test_a_meta_scale_is_read_from_the_checkpoint(tmp_path: Path) -> None:
    reference = _scaled()
    path = tmp_path / "with_scale.safetensors"
    tensors = {k: v.contiguous() for k, v in reference.state_dict().items()}
    save_file({**tensors, "weight.scale": reference.weight.scale.double()}, str(path))
    wrapper = AutoWrappedModule(_meta_scaled(), disk_map=DiskMap(str(path), "cpu"), **DISK)
    assert torch.equal(wrapper(_x()), reference(_x()))
    copy_ = wrapper.load_from_disk(torch.bfloat16, "cpu", copy_module=True)
    assert copy_.weight.dtype == torch.bfloat16
    assert copy_.weight.scale.dtype == torch.float32  # read in the field's own dtype


def test_a_meta_scale_missing_from_the_checkpoint_is_refused(disk_map: DiskMap) -> None:
    with pytest.raises(DiskMapError, match=r"inner tensor field 'weight\.scale' on the meta"):
        AutoWrappedModule(_meta_scaled(), disk_map=disk_map, **DISK)
    with pytest.raises(VramManagementError, match="no disk_map: pass disk_map="):
        AutoWrappedModule(_meta_scaled(), **BF16)


@pytest.mark.cuda
@torch.no_grad()
@pytest.mark.parametrize("wrapper_class", [AutoWrappedModule, AutoWrappedLinear])
def test_cuda_scales_follow_their_weights(wrapper_class: type) -> None:
    module = _scaled() if wrapper_class is AutoWrappedModule else _linear_scaled()
    expected = _rounded(module)(_x())
    module.cuda()  # Module.cuda() leaves weight.scale on the host
    wrapper = wrapper_class(module, offload_dtype=torch.bfloat16, offload_device="cpu",
                            computation_dtype=torch.float32, computation_device="cuda")  # fmt: skip
    scale = wrapper.weight.scale
    assert scale.device.type == "cpu" and scale.is_pinned() and scale.dtype == torch.float32
    if wrapper_class is AutoWrappedModule:
        torch.testing.assert_close(wrapper(_x("cuda")).cpu(), expected)
    wrapper.keep()
    assert wrapper.weight.scale.device.type == "cuda"
    wrapper.offload()
    assert wrapper.weight.scale.device.type == "cpu" and wrapper.weight.scale.is_pinned()
    # weights already in place, scale left on the host by .cuda(): it is brought next to them
    plain = _scaled() if wrapper_class is AutoWrappedModule else _linear_scaled()
    resident = wrapper_class(plain.cuda(), computation_device="cuda")
    assert resident.weight.scale.device.type == "cuda"
