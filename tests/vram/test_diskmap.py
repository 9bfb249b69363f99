"""DiskMap: single, sharded and PyTorch checkpoints, renaming, reopening, errors, host RSS."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, DiskMap, enable_vram_management
from flextensor_runtime.errors import ConfigError, DiskMapError

TENSORS = {
    "a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "a.bias": torch.tensor([1.5, -2.0, 0.25]),
    "b.ids": torch.arange(5),
}


@pytest.fixture
def single(tmp_path: Path) -> Path:
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors"


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    save_file({"a.weight": TENSORS["a.weight"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    rest = {k: v for k, v in TENSORS.items() if k != "a.weight"}
    save_file(rest, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {"a.weight": "model-00001-of-00002.safetensors"}
    weight_map.update(dict.fromkeys(rest, "model-00002-of-00002.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def assert_all_tensors(disk_map: DiskMap) -> None:
    assert sorted(disk_map) == sorted(TENSORS) and len(disk_map) == 3
    for name, expected in TENSORS.items():
        assert torch.equal(disk_map[name], expected)


def test_single_file_sharded_index_and_folder(single, sharded, tmp_path) -> None:
    assert_all_tensors(DiskMap(single, "cpu"))
    assert_all_tensors(DiskMap(sharded, "cpu"))
    assert_all_tensors(DiskMap(tmp_path, "cpu"))  # the folder: index.json is preferred


def test_torch_bin_through_weights_only(tmp_path) -> None:
    torch.save(TENSORS, tmp_path / "pytorch_model.bin")
    assert_all_tensors(DiskMap(tmp_path / "pytorch_model.bin", "cpu"))
    torch.save({"a": nn.Linear(1, 1)}, tmp_path / "pickled.pt")  # not weights-only loadable
    with pytest.raises(DiskMapError, match="weights_only=True"):
        DiskMap(tmp_path / "pickled.pt", "cpu")


def test_dtype_and_device_conversion(single) -> None:
    disk_map = DiskMap(single, "cpu", torch_dtype=torch.bfloat16)
    assert disk_map["a.weight"].dtype == torch.bfloat16
    assert disk_map["b.ids"].dtype == torch.int64  # integer tensors keep their dtype
    assert disk_map.load("a.bias", torch.float64, "meta").device.type == "meta"


def test_state_dict_converter_renames_and_drops(single) -> None:
    def converter(state: dict[str, str]) -> dict[str, str]:
        return {k.replace("a.", "layer."): v for k, v in state.items() if not k.startswith("b.")}

    disk_map = DiskMap(single, "cpu", state_dict_converter=converter)
    assert sorted(disk_map) == ["layer.bias", "layer.weight"] and "a.weight" not in disk_map
    assert torch.equal(disk_map["layer.weight"], TENSORS["a.weight"])
    with pytest.raises(DiskMapError, match="may only rename or drop"):
        DiskMap(single, "cpu", state_dict_converter=lambda state: {"x": "nowhere"})


def test_reopens_after_buffer_size_elements(single) -> None:
    disk_map = DiskMap(single, "cpu", buffer_size=15)
    disk_map["a.weight"]  # 12 elements
    assert disk_map.reopen_count == 0
    disk_map["a.bias"]  # 15 reached
    disk_map["b.ids"]  # next lookup reopens first
    assert disk_map.reopen_count == 1 and disk_map.materialized_elements == 5
    assert torch.equal(disk_map["a.weight"], TENSORS["a.weight"])


def test_errors_name_the_value_and_the_fix(single, tmp_path) -> None:
    with pytest.raises(DiskMapError, match="no checkpoint at"):
        DiskMap(tmp_path / "missing.safetensors", "cpu")
    with pytest.raises(DiskMapError, match=r"tensor 'c\.weight' is not in checkpoint"):
        DiskMap(single, "cpu")["c.weight"]
    (tmp_path / "weights.npz").write_bytes(b"x")
    with pytest.raises(DiskMapError, match="unsupported checkpoint file"):
        DiskMap(tmp_path / "weights.npz", "cpu")
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(DiskMapError, match="cannot open"):
        DiskMap(tmp_path / "broken.safetensors", "cpu")
    assert isinstance(DiskMapError("x"), KeyError)


def test_disk_offloaded_forwards_keep_host_rss_flat(tmp_path) -> None:
    torch.manual_seed(7)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256)) for _ in range(4)]
    )
    model.eval()
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors")
    )
    disk_map = DiskMap(tmp_path / "m.safetensors", "cpu", buffer_size=2 * 256 * 256)
    wrapped = enable_vram_management(
        copy.deepcopy(model), {nn.Linear: AutoWrappedLinear, nn.LayerNorm: AutoWrappedModule},
        dict(offload_device="disk", onload_device="disk", computation_dtype=torch.float32,
             computation_device="cpu"),
        disk_map=disk_map,
    )  # fmt: skip
    x = torch.randn(4, 256)
    expected = model(x)
    process = psutil.Process()
    with torch.no_grad():
        for _ in range(10):  # warm-up: allocator pools and mapped pages settle
            wrapped(x)
        start = process.memory_info().rss
        for _ in range(100):
            out = wrapped(x)
        grown = process.memory_info().rss - start
    assert torch.equal(out, expected)
    assert disk_map.reopen_count > 0
    # a leak of one layer's weights per forward would add 26 MB; allow allocator noise only
    assert grown < 16 * 2**20, f"host RSS grew by {grown} bytes over 100 forwards"


def test_copies_of_a_model_share_the_disk_map(tiny_net, tiny_checkpoint) -> None:
    disk_map = DiskMap(tiny_checkpoint, "cpu")
    disk_map["proj_in.weight"]  # files are open now
    wrapped = enable_vram_management(
        copy.deepcopy(tiny_net), {nn.Linear: AutoWrappedLinear},
        dict(offload_device="disk", computation_dtype=torch.float32, computation_device="cpu"),
        disk_map=disk_map,
    )  # fmt: skip
    twin = copy.deepcopy(wrapped)
    assert twin.proj_in.disk_map is disk_map and copy.copy(disk_map) is disk_map
    x = torch.randn(2, 8)
    assert torch.equal(twin(x), tiny_net(x))


def test_meta_model_on_the_host_tier_loads_from_disk_once(tiny_net, tiny_checkpoint) -> None:
    from flextensor_runtime import init_weights_on_device

    with init_weights_on_device():
        model = type(tiny_net)().eval()  # parameters on meta, buffers built on the host
    disk_map = DiskMap(tiny_checkpoint, "cpu")
    wrapped = enable_vram_management(
        model, {nn.Linear: AutoWrappedLinear, nn.LayerNorm: AutoWrappedModule},
        dict(offload_dtype=torch.float32, offload_device="cpu", computation_dtype=torch.float32,
             computation_device="cpu"),
        disk_map=disk_map,
    )  # fmt: skip
    assert wrapped.proj_in.weight.device.type == "cpu"  # read from disk at wrap time
    read = disk_map.materialized_elements
    x = torch.randn(2, 8)
    assert torch.equal(wrapped(x), tiny_net(x))
    assert disk_map.materialized_elements == read  # the host tier does not touch the disk again


def test_missing_shard_bad_path_and_bad_device_fail_at_construction(single, tmp_path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "gone.safetensors"}}))
    with pytest.raises(DiskMapError, match=r"names 1 missing shard, e\.g\. .*gone"):
        DiskMap(index, "cpu")
    with pytest.raises(ConfigError, match="DiskMap path 3 of type int is invalid"):
        DiskMap(3, "cpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="DiskMap device 'gpux' is not a torch device"):
        DiskMap(single, "gpux")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"buffer_size": "x"}, "buffer_size='x'"), ({"buffer_size": 0}, "buffer_size=0"),
     ({"buffer_size": 1.5}, "buffer_size=1.5 is invalid; pass a whole"),
     ({"torch_dtype": "float16"}, "torch_dtype='float16'"),
     ({"state_dict_converter": 3}, "state_dict_converter=3"),
     ({"state_dict_converter": lambda names: 5}, "state_dict_converter returned int")],
)  # fmt: skip
def test_bad_options_are_config_errors(single, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        DiskMap(single, "cpu", **kwargs)
    assert DiskMap(single, "cpu", buffer_size=1e9).buffer_size == 10**9


def test_a_name_in_two_files_is_refused_naming_both(tmp_path) -> None:
    """The later file used to win silently."""
    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(DiskMapError, match=r"tensor 'w' is in both .*a\.safetensors and .*b\."):
        DiskMap([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], "cpu")
    with pytest.raises(DiskMapError, match="pass the files of one checkpoint"):
        DiskMap(tmp_path, "cpu")  # the folder's *.safetensors
    same = [tmp_path / "a.safetensors", str(tmp_path / "a.safetensors")]
    assert list(DiskMap(same, "cpu")) == ["w"]  # one file named twice is not a conflict


def test_lightning_checkpoint_reads_its_nested_state_dict(tmp_path) -> None:
    """{"state_dict": {...}, "epoch": 3} used to give an empty map and no error."""
    torch.save({"state_dict": TENSORS, "epoch": 3}, tmp_path / "model.ckpt")
    assert_all_tensors(DiskMap(tmp_path / "model.ckpt", "cpu"))
    torch.save({**TENSORS, "state_dict": {"x": torch.ones(1)}}, tmp_path / "top.pt")
    assert_all_tensors(DiskMap(tmp_path / "top.pt", "cpu"))  # top-level tensors come first


def test_a_torch_file_without_tensors_is_an_error(tmp_path) -> None:
    torch.save({"epoch": 3, "model": {"inner": {"w": torch.ones(1)}}}, tmp_path / "x.ckpt")
    with pytest.raises(DiskMapError, match=r"x\.ckpt holds no tensors .*\['epoch', 'model'\]"):
        DiskMap(tmp_path / "x.ckpt", "cpu")


def test_equality_is_identity_and_reads_nothing(single) -> None:
    """Mapping's `==` compared tensor values: 'Boolean value of Tensor ... is ambiguous'."""
    disk_map = DiskMap(single, "cpu")
    assert disk_map == disk_map and disk_map != DiskMap(single, "cpu") and disk_map != {}
    assert disk_map.materialized_elements == 0 and {disk_map: 1}[disk_map] == 1
