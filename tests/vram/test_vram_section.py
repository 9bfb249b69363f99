"""The profile's `vram` section: data round trip, validation, installing it, disk-tier planning."""

from __future__ import annotations

import copy
import subprocess
import sys

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, ConfigError
from flextensor_runtime.vram.vram_section import (
    VramSection,
    install_vram_section,
    parse_vram_section,
    plan_disk_tier,
    vram_section_to_data,
)

SECTION = VramSection(
    module_map=(("Linear", "AutoWrappedLinear"), ("torch.nn.modules.normalization.LayerNorm", "AutoWrappedModule")),
    vram_config=(("offload_device", "cpu"), ("computation_dtype", "float32"), ("computation_device", "cpu")),
    vram_limit_gib=2.5,
)  # fmt: skip


def test_data_round_trip_through_msgpack() -> None:
    data = vram_section_to_data(SECTION)
    assert parse_vram_section(msgpack.unpackb(msgpack.packb(data))) == SECTION
    with_disk = VramSection(SECTION.module_map, SECTION.vram_config, None, ("a.weight",), "m.st")
    assert parse_vram_section(vram_section_to_data(with_disk)) == with_disk
    assert "vram_limit_gib" not in vram_section_to_data(with_disk)


def test_section_module_is_torch_free() -> None:
    code = "import sys, flextensor_runtime.vram.vram_section; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


GOOD = {
    "module_map": [["Linear", "AutoWrappedLinear"]],
    "vram_config": {"computation_device": "cpu"},
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "key 'extra'"),
        ({"module_map": []}, "module_map"),
        ({"module_map": [["Linear"]]}, "module_map entry"),
        ({"module_map": [["Linear", "Wrapper"]]}, "wrapper 'Wrapper'"),
        ({"vram_config": {"offload_dtype": "float7"}}, "offload_dtype 'float7'"),
        ({"vram_config": {"offload_device": "gpu"}}, "offload_device 'gpu'"),
        ({"vram_config": {"speed": "fast"}}, "vram_config key 'speed'"),
        ({"vram_config": []}, "vram_config"),
        ({"vram_limit_gib": -1}, "vram_limit_gib -1"),
        ({"vram_limit_gib": True}, "vram_limit_gib True"),
        ({"disk_tensors": ["a", "a"]}, "list each tensor once"),
        ({"disk_tensors": "a"}, "disk_tensors"),
        ({"checkpoint": 3}, "checkpoint 3"),
    ],
)
def test_invalid_sections_are_one_line_config_errors(change, message) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_vram_section({**GOOD, **change})
    assert "\n" not in str(info.value) and str(info.value).startswith("vram section:")


def test_missing_keys_and_non_map() -> None:
    with pytest.raises(ConfigError, match="missing key 'vram_config'"):
        parse_vram_section({"module_map": GOOD["module_map"]})
    with pytest.raises(ConfigError, match="section 'list'"):
        parse_vram_section([])


@torch.no_grad()
def test_install_with_a_disk_tier(tiny_net, tiny_checkpoint) -> None:
    x = torch.randn(3, 8)
    expected = tiny_net(x)
    section = VramSection(
        SECTION.module_map, SECTION.vram_config, None,
        ("proj_out.weight", "proj_out.bias"), str(tiny_checkpoint),
    )  # fmt: skip
    model = install_vram_section(
        copy.deepcopy(tiny_net), parse_vram_section(vram_section_to_data(section))
    )
    assert model.vram_management_enabled
    assert isinstance(model.proj_out, AutoWrappedLinear) and isinstance(
        model.norm, AutoWrappedModule
    )
    assert model.proj_out.weight.device.type == "meta" and model.proj_out.offload_device == "disk"
    assert model.proj_in.weight.device.type == "cpu"
    assert torch.equal(model(x), expected)


@pytest.mark.parametrize(
    ("disk_tensors", "checkpoint", "message"),
    [
        (("proj_out.weight",), True, "list all of its tensors"),
        (("proj_out.weight", "proj_out.bias", "offset"), True, "belongs to no wrapped module"),
        (("proj_out.weight", "proj_out.bias"), False, "no checkpoint is given"),
    ],
)
def test_install_errors(tiny_net, tiny_checkpoint, disk_tensors, checkpoint, message) -> None:
    section = VramSection(SECTION.module_map, SECTION.vram_config, None, disk_tensors,
                          str(tiny_checkpoint) if checkpoint else None)  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        install_vram_section(tiny_net, section)


def test_install_unknown_class_name(tiny_net) -> None:
    section = VramSection((("Conv3d", "AutoWrappedModule"),), SECTION.vram_config)
    with pytest.raises(ConfigError, match="'Conv3d' matches no module"):
        install_vram_section(tiny_net, section)


# -- plan_disk_tier -------------------------------------------------------------------------
def test_plan_disk_tier_first_fit_in_order() -> None:
    sizes = {"a": 40, "b": 50, "c": 30, "d": 10, "e": 5}
    # a+b = 90; c (30) does not fit; d (10) fills the budget; e (omitted from order) does not
    assert plan_disk_tier(sizes, 100, ["a", "b", "c", "d"]) == {"c", "e"}
    assert plan_disk_tier(sizes, 0, []) == set(sizes)
    assert plan_disk_tier(sizes, 10**9, ["e"]) == set()
    assert plan_disk_tier({"x": 1, "y": 1}, 1, []) == {"y"}  # omitted names: sorted


def test_plan_disk_tier_errors() -> None:
    with pytest.raises(ConfigError, match="negative"):
        plan_disk_tier({}, -1, [])
    with pytest.raises(ConfigError, match="no size"):
        plan_disk_tier({"a": 1}, 1, ["b"])
    with pytest.raises(ConfigError, match="twice"):
        plan_disk_tier({"a": 1}, 1, ["a", "a"])
    with pytest.raises(ConfigError, match="byte counts"):
        plan_disk_tier({"a": -3}, 1, [])


@given(
    st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 1000), max_size=12),
    st.integers(0, 5000),
    st.randoms(use_true_random=False),
)
def test_plan_disk_tier_properties(sizes, budget, rng) -> None:
    order = sorted(sizes)
    rng.shuffle(order)
    order = order[: len(order) // 2 + 1] if order else []
    disk = plan_disk_tier(sizes, budget, order)
    assert disk <= set(sizes)
    assert sum(s for n, s in sizes.items() if n not in disk) <= budget
    walk = order + sorted(n for n in sizes if n not in order)
    left = budget
    for name in walk:  # every disk tensor did not fit when its turn came
        if name in disk:
            assert sizes[name] > left
        else:
            left -= sizes[name]


def test_cli_spec_builds_the_same_section() -> None:
    from flextensor_runtime.vram.vram_section import parse_vram_spec

    spec = (
        "map=Linear:linear, torch.nn.modules.normalization.LayerNorm:AutoWrappedModule;"
        " offload_device=cpu; computation_dtype=float32; computation_device=cpu;"
        " vram_limit_gib=2.5"
    )
    assert parse_vram_spec(spec) == SECTION
    with_checkpoint = parse_vram_spec("map=Linear:nonrecurse;checkpoint=m.safetensors")
    assert with_checkpoint.module_map == (("Linear", "AutoWrappedNonRecurseModule"),)
    assert with_checkpoint.checkpoint == "m.safetensors" and with_checkpoint.vram_config == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("map=Linear:linear;offload_device", "--vram item 'offload_device'"),
        ("map=Linear", "--vram map entry 'Linear'"),
        ("map=Linear:linear;vram_limit_gib=lots", "vram_limit_gib 'lots'"),
        ("map=Linear:linear;map=Conv2d:module", "--vram key 'map'"),
        ("offload_device=cpu", "module_map"),
        ("map=Linear:gpu", "wrapper 'gpu'"),
    ],
)
def test_cli_spec_errors(spec, message) -> None:
    from flextensor_runtime.vram.vram_section import parse_vram_spec

    with pytest.raises(ConfigError, match=message) as info:
        parse_vram_spec(spec)
    assert "\n" not in str(info.value)


def test_section_from_profile_extensions() -> None:
    from flextensor_runtime.vram.vram_section import vram_section_from_extensions

    assert vram_section_from_extensions({"caches": {}}) is None
    assert vram_section_from_extensions({"vram": vram_section_to_data(SECTION)}) == SECTION
