"""AutoTorchModule: stage defaults, every state transition, cast_to, check_free_vram, param_name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoTorchModule, AutoWrappedLinear, ConfigError
from flextensor_runtime.vram.placement import GIB, Placement

STAGES = dict(
    offload_dtype=torch.float16,
    onload_dtype=torch.bfloat16,
    preparing_dtype=torch.float32,
    computation_dtype=torch.float64,
    computation_device="cpu",
)


def make_linear(**overrides) -> AutoWrappedLinear:
    torch.manual_seed(1)
    return AutoWrappedLinear(nn.Linear(6, 5), **{**STAGES, **overrides})


def test_omitted_stages_default_to_computation_placement() -> None:
    module = AutoTorchModule(computation_dtype=torch.bfloat16, computation_device="cpu")
    for stage in ("offload", "onload", "preparing"):
        assert getattr(module, f"{stage}_dtype") == torch.bfloat16
        assert getattr(module, f"{stage}_device") == "cpu"
    module.set_dtype_and_device(offload_device="disk", computation_dtype=torch.float16)
    assert module.offload_device == "disk"
    assert module.onload_dtype == torch.float16
    assert module.stages.onload == Placement(torch.float16, "cpu")


def test_invalid_devices_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="invalid device"):
        AutoTorchModule(offload_device="floppy")
    with pytest.raises(ConfigError, match="computation_device='disk'"):
        AutoTorchModule(computation_device="disk")


def test_wrapper_starts_offloaded_and_walks_every_transition() -> None:
    layer = make_linear()
    assert layer.state == 0 and layer.weight.dtype == torch.float16
    layer.onload()
    assert layer.state == 1 and layer.weight.dtype == torch.bfloat16
    layer.preparing()  # preparing (float32) differs from computation (float64): still stage 1
    assert layer.state == 1 and layer.weight.dtype == torch.float32
    layer.keep()
    assert layer.state == 2 and layer.weight.dtype == torch.float64
    layer.offload()
    assert layer.state == 0 and layer.weight.dtype == torch.float16
    layer.keep()
    layer.onload()
    assert layer.state == 1 and layer.stored == layer.stages.onload


def test_preparing_at_computation_placement_is_state_two() -> None:
    layer = make_linear(preparing_dtype=torch.float64)
    layer.preparing()
    assert layer.state == 2 and layer.weight.dtype == torch.float64


def test_transition_to_current_placement_keeps_the_tensor() -> None:
    layer = make_linear()
    layer.onload()
    weight = layer.weight
    layer.onload()
    assert layer.weight is weight


def test_cast_to_copies_without_mutating_the_source() -> None:
    module = AutoTorchModule()
    source = torch.arange(6, dtype=torch.float32)
    copy = module.cast_to(source, torch.float16, "cpu")
    copy.add_(1)
    assert source.dtype == torch.float32 and torch.equal(source, torch.arange(6.0))
    assert copy.dtype == torch.float16 and copy.data_ptr() != source.data_ptr()
    ints = module.cast_to(torch.arange(3), torch.float16, "cpu")
    assert ints.dtype == torch.int64  # integer tensors keep their dtype


def test_cast_to_names_a_dtype_given_as_a_string() -> None:
    from flextensor_runtime.errors import ConfigError

    with pytest.raises(ConfigError, match=r"torch.dtype, got 'bfloat16' \(str\)"):
        AutoTorchModule().cast_to(torch.ones(2), "bfloat16", "cpu")  # type: ignore[arg-type]


def test_check_free_vram_reads_the_injected_reader(fake_reader) -> None:
    module = AutoTorchModule(vram_limit=2.0, memory_reader=fake_reader)
    fake_reader.used = GIB
    assert module.check_free_vram()
    assert not module.check_free_vram(required_bytes=GIB)  # promotion would reach the limit
    fake_reader.used = 2 * GIB
    assert not module.check_free_vram()
    assert not AutoTorchModule(memory_reader=fake_reader).check_free_vram()  # no limit set


def test_param_name_prefixes_the_module_name() -> None:
    module = AutoTorchModule()
    assert module.param_name("weight") == "weight"
    module.name = "blocks.0.attn"
    assert module.param_name("weight") == "blocks.0.attn.weight"


def test_open_dtype_placement_needs_no_copy() -> None:
    layer = AutoWrappedLinear(nn.Linear(3, 2), computation_device="cpu")  # no dtypes given
    assert layer.holds(layer.stages.computation)
    assert layer.compute_tensors()["weight"] is layer.weight  # forward uses it directly
    assert Placement(torch.float16, "cpu").satisfies(Placement(None, "cpu"))
    assert not Placement(torch.float16, "cpu").satisfies(Placement(torch.float32, "cpu"))
    assert not Placement(None, "cpu").satisfies(Placement(torch.float32, "cpu"))
