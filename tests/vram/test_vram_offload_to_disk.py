"""`AutoWrappedModule.offload_to_disk(model)`: for the stored module a transition to the disk
tier (the next forward reads the weights back through the DiskMap), refused before anything
changes when they could not be read back; for any other module only its parameters go to meta.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import AutoWrappedModule, AutoWrappedNonRecurseModule, DiskMap
from flextensor_runtime.errors import ConfigError, DiskMapError
from tests.vram.conftest import small_block


@pytest.fixture
def disk_map(block_disk_map: DiskMap) -> DiskMap:
    return block_disk_map


def _run(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


CONFIGS = {
    "disk": dict(offload_device="disk", onload_device="disk", computation_device="cpu"),
    "cpu": dict(offload_device="cpu", computation_device="cpu"),
    "cpu-bf16": dict(
        offload_device="cpu",
        offload_dtype=torch.bfloat16,
        computation_device="cpu",
        computation_dtype=torch.float32,
    ),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("target", ["module", "wrapper"])
def test_the_stored_module_goes_to_disk_and_is_read_back(disk_map, config, target) -> None:
    x = torch.randn(2, 4)
    expected = _run(small_block(), x)
    w = AutoWrappedModule(small_block(), name="blk", disk_map=disk_map, **CONFIGS[config])
    w.keep()
    assert w.state == 2
    buffers = dict(w.module.named_buffers())
    w.offload_to_disk(w.module if target == "module" else w)
    assert w.stored.on_disk and w.state == 0
    assert all(p.device.type == "meta" for p in w.module.parameters())
    assert dict(w.module.named_buffers()) == buffers  # buffers are retained
    assert torch.equal(_run(w, x), expected)  # read back from the checkpoint, full precision
    w.keep()
    assert w.stored.device == "cpu" and w.state == 2
    assert torch.equal(_run(w, x), expected)
    w.offload()  # a cast offload placement rounds the weights again
    rounded = small_block()
    dtype = CONFIGS[config].get("offload_dtype")
    if dtype is not None:
        for param in rounded.parameters():
            param.data = param.data.to(dtype).float()
    assert w.state == 0 and torch.equal(_run(w, x), _run(rounded, x))


def test_without_a_disk_map_it_is_refused_and_nothing_changes() -> None:
    x = torch.randn(2, 4)
    w = AutoWrappedModule(small_block(), offload_device="cpu", computation_device="cpu", name="blk")
    w.keep()
    params = {n: (p, p.clone()) for n, p in w.module.named_parameters()}
    with pytest.raises(ConfigError, match=r"'blk' has no disk_map.*DiskMap\(checkpoint"):
        w.offload_to_disk(w.module)
    assert w.stored.device == "cpu" and w.state == 2
    for name, param in w.module.named_parameters():
        assert param is params[name][0] and torch.equal(param, params[name][1])
    assert torch.equal(_run(w, x), _run(small_block(), x))


def test_a_disk_map_without_the_tensors_is_refused(disk_map) -> None:
    w = AutoWrappedModule(small_block(), offload_device="cpu", name="other", disk_map=disk_map)
    weight = w.module[0].weight
    with pytest.raises(DiskMapError, match=r"no tensor 'other\.0\.weight'"):
        w.offload_to_disk(w.module)
    assert w.module[0].weight is weight and w.stored.device == "cpu"


def test_a_clone_goes_to_meta_and_the_wrapper_is_untouched(disk_map) -> None:
    x = torch.randn(2, 4)
    w = AutoWrappedModule(small_block(), name="blk", disk_map=disk_map, **CONFIGS["disk"])
    clone = w.load_from_disk(None, "cpu", copy_module=True)
    assert torch.equal(_run(clone, x), _run(small_block(), x))
    w.offload_to_disk(clone)
    assert all(p.device.type == "meta" for p in clone.parameters())
    assert w.stored.on_disk and w.state == 0
    assert torch.equal(_run(w, x), _run(small_block(), x))
    lone = copy.deepcopy(small_block())  # a module that is not the wrapper's: only it changes
    w.offload_to_disk(lone)
    assert all(p.device.type == "meta" for p in lone.parameters())


def test_part_of_the_stored_module_is_refused(disk_map) -> None:
    w = AutoWrappedModule(small_block(), offload_device="cpu", name="blk", disk_map=disk_map)
    weight = w.module[0].weight
    with pytest.raises(ConfigError, match=r"shares weights.*pass the wrapper's module"):
        w.offload_to_disk(w.module[0])
    assert w.module[0].weight is weight and w.module[0].weight.device.type == "cpu"


def test_non_recurse_wrapper_drops_only_its_direct_parameters(tmp_path: Path) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.rand(4) + 0.5)
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.gain

    torch.manual_seed(1)
    plain = Scaled().eval()
    path = tmp_path / "s.safetensors"
    save_file({f"s.{k}": v.contiguous() for k, v in plain.state_dict().items()}, str(path))
    w = AutoWrappedNonRecurseModule(
        copy.deepcopy(plain), offload_device="cpu", name="s", disk_map=DiskMap(str(path), "cpu")
    )
    w.keep()
    w.offload_to_disk(w.module)
    assert w.module.gain.device.type == "meta" and w.module.lin.weight.device.type == "cpu"
    x = torch.randn(2, 4)
    assert torch.equal(_run(w, x), _run(plain, x))
