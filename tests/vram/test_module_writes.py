"""Attribute writes through an `AutoWrappedModule` reach the wrapped module (as reads do);
the wrapper's own attributes stay its own."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoWrappedModule, ConfigError, DiskMap, enable_vram_management

CPU32 = dict(computation_dtype=torch.float32, computation_device="cpu")
DISK = dict(offload_device="disk", onload_device="disk", **CPU32)


class _Flagged(nn.Module):
    """A module whose forward reads a flag that code may set after wrapping."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.negate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return -y if self.negate else y


def test_a_flag_written_through_the_wrapper_reaches_the_module() -> None:
    """`wrapper.negate = True` stayed on the wrapper: the module's forward never saw it."""
    torch.manual_seed(0)
    net = _Flagged().eval()
    wrapped = AutoWrappedModule(copy.deepcopy(net), **CPU32)
    x = torch.randn(2, 8)
    wrapped.negate = True
    wrapped.fresh = "new"  # a name neither has yet goes to the module too
    assert wrapped.module.negate is True and wrapped.module.fresh == "new"
    assert "negate" not in wrapped.__dict__ and "fresh" not in wrapped.__dict__
    assert torch.equal(wrapped(x), -net(x))
    del wrapped.fresh
    assert not hasattr(wrapped.module, "fresh") and not hasattr(wrapped, "fresh")


def test_a_submodule_written_through_the_wrapper_is_managed_at_its_placement(tiny_net) -> None:
    """`wrapper.proj_out = new` registered `new` on the wrapper itself: the wrapped module kept
    computing with its old submodule and the state dict had both."""
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), offload_dtype=torch.bfloat16, **CPU32)
    new = nn.Linear(16, 4)
    expected = copy.deepcopy(tiny_net)
    expected.proj_out = copy.deepcopy(new)
    for p in expected.parameters():  # the wrapper stores bfloat16 and computes in float32
        p.data = p.data.bfloat16().float()
    wrapped.proj_out = new
    assert wrapped.module.proj_out is new and new.weight.dtype == torch.bfloat16
    x = torch.randn(3, 8)
    assert torch.equal(wrapped(x), expected(x))
    assert not wrapped._parameters and not wrapped._buffers
    assert sorted(wrapped.state_dict()) == sorted(f"module.{k}" for k in tiny_net.state_dict())


def test_a_direct_parameter_written_through_the_wrapper_is_moved_or_kept() -> None:
    torch.manual_seed(0)
    wrapped = AutoWrappedModule(nn.Linear(8, 4), offload_dtype=torch.float16, **CPU32)
    same = nn.Parameter(torch.ones(4, dtype=torch.float16))
    wrapped.bias = same  # already at the stored placement: the same object
    assert wrapped.module.bias is same and "bias" not in wrapped._parameters
    wrapped.weight = nn.Parameter(torch.full((4, 8), 2.0))  # float32: moved to float16
    assert wrapped.module.weight.dtype == torch.float16
    assert torch.equal(wrapped(torch.ones(1, 8)), torch.full((1, 4), 17.0))
    with pytest.raises(RuntimeError):  # a meta weight cannot be placed: the module keeps its own
        wrapped.weight = nn.Parameter(torch.empty(4, 8, device="meta"))
    assert wrapped.module.weight.dtype == torch.float16 and not wrapped.module.weight.is_meta


def test_a_buffer_written_through_the_wrapper_stays_at_the_computation_placement(tiny_net) -> None:
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), computation_dtype=torch.float64,
                                computation_device="cpu")  # fmt: skip
    wrapped.offset = torch.ones(4)
    assert wrapped.module.offset.dtype == torch.float64 and torch.equal(
        wrapped.module.offset, torch.ones(4, dtype=torch.float64)
    )


def test_the_wrappers_own_attributes_stay_on_the_wrapper(tiny_net) -> None:
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), name="net", **CPU32)
    module = wrapped.module
    wrapped.vram_limit = 2.0
    wrapped.name = "renamed"
    wrapped.forward = wrapped.forward  # an instance forward (what traps and caches set)
    assert wrapped.__dict__["vram_limit"] == 2.0 and wrapped.name == "renamed"
    assert "forward" in wrapped.__dict__ and "forward" not in module.__dict__
    assert not hasattr(module, "vram_limit") and not hasattr(module, "stored")
    del wrapped.__dict__["forward"]
    other = copy.deepcopy(tiny_net)
    wrapped.module = other  # the wrapper's own submodule
    assert wrapped.module is other


def test_enable_marks_a_root_wrapper_not_its_module(tiny_net) -> None:
    model = enable_vram_management(copy.deepcopy(tiny_net), {type(tiny_net): AutoWrappedModule},
                                   vram_config=dict(offload_dtype=torch.float32, **CPU32))  # fmt: skip
    assert isinstance(model, AutoWrappedModule)
    assert model.__dict__["vram_management_enabled"] is True
    assert "vram_management_enabled" not in model.module.__dict__


def test_a_parameter_written_on_the_disk_tier_is_refused(tiny_net, tiny_checkpoint) -> None:
    """The disk tier reads weights from the disk map at each use: a new one would be ignored."""
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), disk_map=DiskMap(tiny_checkpoint, "cpu"),
                                **DISK)  # fmt: skip
    before = wrapped.module.proj_in.weight
    with pytest.raises(ConfigError, match=r"^setting 'proj_in' through the wrapper of 'TinyNet': "
                       r"its weights are on the disk tier.*call wrapper\.load_from_disk"):  # fmt: skip
        wrapped.proj_in = nn.Linear(8, 16)
    assert wrapped.module.proj_in.weight is before
    wrapped.flag = True  # plain attributes still go through
    assert wrapped.module.flag is True


def test_a_parameter_written_on_a_linear_wrapper_is_moved_to_its_stored_placement() -> None:
    """`wrapper.weight = nn.Parameter(t)` stayed float32 while `stored` said float16: offload()
    then saw the weights 'already there' and kept the float32 one, unlike AutoWrappedModule."""
    from flextensor_runtime import AutoWrappedLinear

    torch.manual_seed(0)
    wrapped = AutoWrappedLinear(nn.Linear(8, 4), offload_dtype=torch.float16, **CPU32)
    wrapped.weight = nn.Parameter(torch.full((4, 8), 2.0))  # float32: moved to float16
    same = nn.Parameter(torch.ones(4, dtype=torch.float16))
    wrapped.bias = same  # already at the stored placement: the same object
    assert wrapped.weight.dtype == torch.float16 and wrapped.bias is same
    assert torch.equal(wrapped(torch.ones(1, 8)), torch.full((1, 4), 17.0))
    wrapped.keep()
    wrapped.weight = nn.Parameter(torch.full((4, 8), 3.0, dtype=torch.float64))  # to float32
    assert wrapped.weight.dtype == torch.float32 and wrapped.state == 2
    assert torch.equal(wrapped(torch.ones(1, 8)), torch.full((1, 4), 25.0))
    wrapped.offload()
    assert wrapped.weight.dtype == torch.float16 and wrapped.bias.dtype == torch.float16
    assert sorted(wrapped.state_dict()) == ["bias", "weight"]
    with pytest.raises(RuntimeError):  # a meta weight cannot be placed: the wrapper keeps its own
        wrapped.weight = nn.Parameter(torch.empty(4, 8, device="meta"))
    assert wrapped.weight.dtype == torch.float16 and not wrapped.weight.is_meta
    wrapped.bias = None  # not a parameter: as on any module
    assert torch.equal(wrapped(torch.ones(1, 8)), torch.full((1, 4), 24.0))


def test_a_parameter_written_on_a_linear_wrapper_on_the_disk_tier_is_refused(tmp_path) -> None:
    from safetensors.torch import save_file

    from flextensor_runtime import AutoWrappedLinear

    torch.manual_seed(0)
    linear = nn.Linear(8, 4)
    path = tmp_path / "lin.safetensors"
    save_file({f"lin.{k}": v.contiguous() for k, v in linear.state_dict().items()}, str(path))
    wrapped = AutoWrappedLinear(linear, name="lin", disk_map=DiskMap(path, "cpu"), **DISK)
    before = wrapped.weight
    with pytest.raises(ConfigError, match=r"^setting 'weight' on AutoWrappedLinear 'lin': its "
                       r"weights are on the disk tier.*call wrapper\.load_from_disk\(dtype, "
                       r"device\) first"):  # fmt: skip
        wrapped.weight = nn.Parameter(torch.zeros(4, 8))
    assert wrapped.weight is before and wrapped.weight.is_meta
    x = torch.randn(2, 8)
    assert torch.equal(wrapped(x), linear(x))
    wrapped.load_from_disk(torch.float32, "cpu")  # the fix: off the disk tier, then write
    wrapped.bias = nn.Parameter(torch.zeros(4))
    assert torch.equal(wrapped(x), x @ linear.weight.T)
