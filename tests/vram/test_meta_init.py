"""init_weights_on_device and skip_model_initialization."""

from __future__ import annotations

import psutil
import pytest
import torch
from torch import nn

from flextensor_runtime import init_weights_on_device, skip_model_initialization


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0))


def test_parameters_go_to_meta_buffers_stay() -> None:
    with init_weights_on_device():
        model = WithBuffer()
    assert model.linear.weight.device.type == "meta" and model.linear.weight.requires_grad
    assert model.table.device.type == "cpu" and torch.equal(model.table, torch.arange(4.0))


def test_include_buffers_puts_buffers_on_the_device_too() -> None:
    with init_weights_on_device("meta", include_buffers=True):
        model = WithBuffer()
        created = torch.zeros(2)
    assert model.table.device.type == "meta" and created.device.type == "meta"
    assert model.linear.bias.device.type == "meta"
    assert torch.zeros(2).device.type == "cpu"  # default device restored


class Tied(nn.Module):
    """An output head tied to the embedding in `__init__`, and one parameter registered twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight
        shared = nn.Parameter(torch.ones(3))
        self.a, self.b = nn.Module(), nn.Module()
        self.a.register_parameter("scale", shared)
        self.b.register_parameter("scale", shared)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_ties_made_in_init_are_kept(device) -> None:
    """Each registration used to wrap the parameter in a new one: `head.weight` and
    `embed.weight` came out as two objects, and the profile refused the model as re-tied."""
    with init_weights_on_device(device):
        model = Tied()
    assert model.head.weight is model.embed.weight
    assert model.a.scale is model.b.scale
    assert model.embed.weight.device.type == device and model.a.scale.device.type == device
    assert len(list(model.parameters())) == 2


def test_hooks_restored_even_when_the_block_raises() -> None:
    register = nn.Module.register_parameter
    kaiming = nn.init.kaiming_uniform_
    with pytest.raises(RuntimeError, match="boom"), skip_model_initialization():
        raise RuntimeError("boom")
    assert nn.Module.register_parameter is register and nn.init.kaiming_uniform_ is kaiming
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_skip_model_initialization_on_cpu_skips_initialisers() -> None:
    calls: list[str] = []
    original = nn.init.kaiming_uniform_

    def spy(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append("init")
        return original(tensor, *args, **kwargs)

    nn.init.kaiming_uniform_ = spy
    try:
        nn.Linear(3, 3)
        assert calls == ["init"]
        with skip_model_initialization("cpu"):
            layer = nn.Linear(3, 3)
        assert calls == ["init"] and layer.weight.device.type == "cpu"
    finally:
        nn.init.kaiming_uniform_ = original


def test_meta_model_builds_without_touching_host_memory() -> None:
    process = psutil.Process()
    before = process.memory_info().rss
    with init_weights_on_device():
        big = nn.Linear(20_000, 20_000)  # 1.6 GB if its weight were initialised on the host
    assert process.memory_info().rss - before < 200 * 2**20
    assert big.weight.device.type == "meta" and big.weight.shape == (20_000, 20_000)


def test_bad_device_is_a_config_error_and_patches_nothing() -> None:
    from flextensor_runtime.errors import ConfigError

    block = init_weights_on_device("gpux")
    with pytest.raises(ConfigError, match="device='gpux', which is not a torch device"):
        block.__enter__()
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_the_innermost_block_decides_and_the_outer_one_applies_again() -> None:
    """An inner block used to chain to the outer block's patch, which moved every parameter to
    the outer device: `init_weights_on_device("cpu")` inside the meta default gave meta."""
    register = nn.Module.register_parameter
    with init_weights_on_device():
        with init_weights_on_device("cpu"):
            inner = nn.Linear(2, 2)
        with skip_model_initialization("cpu"):
            skipped = nn.Linear(2, 2)
        after = nn.Linear(2, 2)
    assert inner.weight.device.type == "cpu" and torch.isfinite(inner.weight).all()
    assert skipped.weight.device.type == "cpu" and after.weight.device.type == "meta"
    with init_weights_on_device("cpu"), init_weights_on_device("meta"):
        assert nn.Linear(2, 2).weight.device.type == "meta"
    assert nn.Module.register_parameter is register


def test_nested_blocks_with_and_without_include_buffers() -> None:
    """An inner block without include_buffers inside one with it puts the default device
    back: its parameters are made on the host, not made on meta and then uncopyable."""
    with init_weights_on_device("meta", include_buffers=True):
        with init_weights_on_device("cpu"):
            inner = WithBuffer()
            with init_weights_on_device("meta", include_buffers=True):
                deepest = WithBuffer()
                with init_weights_on_device("cpu"):
                    assert torch.zeros(1).device.type == "cpu"
        outer = WithBuffer()
    assert inner.linear.weight.device.type == "cpu" and inner.table.device.type == "cpu"
    assert torch.equal(inner.table, torch.arange(4.0))
    assert deepest.linear.weight.device.type == "meta" and deepest.table.device.type == "meta"
    assert outer.linear.weight.device.type == "meta" and outer.table.device.type == "meta"
    assert torch.zeros(1).device.type == "cpu"
