"""AutoWrappedModule and AutoWrappedNonRecurseModule: compute copies, buffers, disk, fall-through."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    AutoWrappedNonRecurseModule,
    ConfigError,
    DiskMap,
    enable_vram_management,
)
from flextensor_runtime.vram.placement import GIB

CPU32 = dict(computation_dtype=torch.float32, computation_device="cpu")
DISK = dict(offload_device="disk", onload_device="disk", **CPU32)


def test_output_equal_and_attributes_fall_through(tiny_net) -> None:
    x = torch.randn(3, 8)
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), **CPU32)
    assert torch.equal(wrapped(x), tiny_net(x))
    assert wrapped.proj_in.in_features == 8  # falls through to the wrapped module
    assert isinstance(wrapped.norm, nn.LayerNorm)
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_attribute


def test_compute_copy_only_when_placement_differs(tiny_net) -> None:
    same = AutoWrappedModule(copy.deepcopy(tiny_net), **CPU32)
    assert same.computation() is same.module
    lower = AutoWrappedModule(copy.deepcopy(tiny_net), offload_dtype=torch.bfloat16, **CPU32)
    clone = lower.computation()
    assert clone is not lower.module
    assert clone.proj_in.weight.dtype == torch.float32
    assert lower.module.proj_in.weight.dtype == torch.bfloat16  # stored module untouched
    x = torch.randn(2, 8)
    assert torch.equal(lower(x), clone(x))
    assert lower.module.proj_in.weight.dtype == torch.bfloat16  # forward restored it too


def test_buffers_stay_resident_and_cast_to_computation(tiny_net) -> None:
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), offload_dtype=torch.float16,
                                computation_dtype=torch.float64, computation_device="cpu")  # fmt: skip
    assert wrapped.module.offset.dtype == torch.float64
    wrapped.offload()
    assert wrapped.module.offset.dtype == torch.float64  # buffers are not offloaded
    assert wrapped.module.norm.weight.dtype == torch.float16


def test_disk_backed_module_matches_and_keeps_meta(tiny_net, tiny_checkpoint) -> None:
    x = torch.randn(4, 8)
    wrapped = AutoWrappedModule(
        copy.deepcopy(tiny_net), disk_map=DiskMap(tiny_checkpoint, "cpu"), **DISK
    )
    assert wrapped.module.proj_in.weight.device.type == "meta"
    assert wrapped.module.offset.device.type == "cpu"  # buffers retained
    assert torch.equal(wrapped(x), tiny_net(x))
    assert wrapped.module.proj_in.weight.device.type == "meta"
    clone = wrapped.load_from_disk(torch.float32, "cpu", copy_module=True)
    assert clone.norm.weight.device.type == "cpu"
    assert wrapped.module.norm.weight.device.type == "meta"
    wrapped.load_from_disk(torch.float32, "cpu")
    assert torch.equal(wrapped.module.norm.weight, tiny_net.norm.weight)
    wrapped.offload()  # disk offload: meta placeholders, never .to(cpu)
    assert wrapped.module.norm.weight.device.type == "meta"


def test_non_persistent_buffers_are_never_replaced(tiny_net, tiny_checkpoint) -> None:
    net = copy.deepcopy(tiny_net)
    step = net.step
    wrapped = AutoWrappedModule(net, disk_map=DiskMap(tiny_checkpoint, "cpu"), **DISK)
    wrapped.load_from_disk(torch.float32, "cpu")
    wrapped.offload_to_disk(wrapped.module)
    assert wrapped.module.step is step  # not in the checkpoint and never touched
    assert "step" not in DiskMap(tiny_checkpoint, "cpu")


def test_vram_limit_reached_computes_from_temporary_copy(tiny_net, fake_reader) -> None:
    wrapped = AutoWrappedModule(
        copy.deepcopy(tiny_net), onload_dtype=torch.bfloat16, vram_limit=4.0,
        memory_reader=fake_reader, **CPU32,
    )  # fmt: skip
    wrapped.onload()
    fake_reader.used = 4 * GIB
    x = torch.randn(2, 8)
    wrapped(x)
    assert wrapped.state == 1 and wrapped.module.proj_in.weight.dtype == torch.bfloat16
    fake_reader.used = 0
    wrapped(x)
    assert wrapped.state == 2 and wrapped.module.proj_in.weight.dtype == torch.float32


def test_cast_to_module_clones_and_leaves_the_source(tiny_net) -> None:
    wrapped = AutoWrappedModule(copy.deepcopy(tiny_net), **CPU32)
    clone = wrapped.cast_to(wrapped.module, torch.float16, "cpu")
    assert clone.proj_in.weight.dtype == torch.float16
    assert wrapped.module.proj_in.weight.dtype == torch.float32


def test_float8_computation_is_rejected_for_modules(tiny_net) -> None:
    with pytest.raises(ConfigError, match="only supported by AutoWrappedLinear"):
        AutoWrappedModule(tiny_net, computation_dtype=torch.float8_e4m3fn)


def test_non_recurse_manages_direct_parameters_only(tiny_checkpoint, tiny_net) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)
            self.gain = nn.Parameter(torch.full((4,), 2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * self.gain

    torch.manual_seed(6)
    model = nn.Sequential(Scaled())
    x = torch.randn(3, 4)
    expected = model(x)
    wrapped = enable_vram_management(
        copy.deepcopy(model),
        {Scaled: AutoWrappedNonRecurseModule, nn.Linear: AutoWrappedLinear},
        dict(offload_dtype=torch.bfloat16, **CPU32),
    )
    outer = wrapped[0]
    assert isinstance(outer, AutoWrappedNonRecurseModule)
    assert isinstance(outer.module.inner, AutoWrappedLinear)  # child wrapped separately
    assert outer.module.inner.name == "0.inner"
    assert list(outer._managed()) == ["gain"]
    assert outer.cast_to(outer.module, torch.float16, "cpu") is outer.module
    bf16 = (x @ model[0].inner.weight.detach().bfloat16().float().t()
            + model[0].inner.bias.detach().bfloat16().float()) * 2.0  # fmt: skip
    assert torch.equal(wrapped(x), bf16)
    assert outer.module.gain.dtype == torch.bfloat16  # restored after the call
    assert outer.computation() is outer.module and outer.state == 2
    assert not torch.equal(expected, bf16)  # the bf16 offload really changed precision


def test_module_onload_skips_disk_and_preparing_materializes(tiny_net, tiny_checkpoint) -> None:
    wrapped = AutoWrappedModule(
        copy.deepcopy(tiny_net), disk_map=DiskMap(tiny_checkpoint, "cpu"),
        preparing_dtype=torch.bfloat16, **DISK,
    )  # fmt: skip
    wrapped.onload()
    assert wrapped.state == 1 and wrapped.module.proj_in.weight.device.type == "meta"
    wrapped.preparing()
    assert wrapped.module.proj_in.weight.dtype == torch.bfloat16
    wrapped.keep()  # moves from where the weights are now (bfloat16), not from disk
    rounded = tiny_net.proj_in.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(wrapped.module.proj_in.weight, rounded)


class Gain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


def test_non_recurse_disk_materializes_direct_parameters_in_place(tmp_path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(10)
    model = nn.Sequential(Gain())
    path = tmp_path / "gain.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    x = torch.randn(2, 4)
    expected = model(x)
    disk_map = DiskMap(path, "cpu")
    wrapped = enable_vram_management(
        copy.deepcopy(model), {Gain: AutoWrappedNonRecurseModule, nn.Linear: AutoWrappedLinear},
        DISK, disk_map=disk_map,
    )  # fmt: skip
    outer = wrapped[0]
    assert (
        outer.module.gain.device.type == "meta" and outer.module.inner.weight.device.type == "meta"
    )
    assert torch.equal(wrapped(x), expected)
    assert outer.module.gain.device.type == "meta"
    outer.load_from_disk(torch.float32, "cpu")  # direct parameters only
    assert (
        outer.module.gain.device.type == "cpu" and outer.module.inner.weight.device.type == "meta"
    )
    outer.offload_to_disk(outer.module)
    assert outer.module.gain.device.type == "meta"
    assert isinstance(outer.module.inner, AutoWrappedLinear)  # the child was left alone


def test_default_memory_reader_reads_zero_on_cpu() -> None:
    from flextensor_runtime.vram.placement import TorchMemoryReader

    assert TorchMemoryReader().used_bytes(torch.device("cpu")) == 0


def test_non_module_is_a_config_error() -> None:
    for wrapper in (AutoWrappedModule, AutoWrappedNonRecurseModule):
        with pytest.raises(ConfigError, match=r"wraps an nn\.Module, got NoneType"):
            wrapper(None)
