"""enable_vram_management(_recursively) and fill_vram_config."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    ConfigError,
    enable_vram_management,
    enable_vram_management_recursively,
    fill_vram_config,
)
from flextensor_runtime.errors import VramManagementError

CPU32 = dict(computation_dtype=torch.float32, computation_device="cpu")


class SubLinear(nn.Linear):
    """A Linear subclass, to test overlapping classes in module_map."""


def test_descendants_replaced_and_marker_set(tiny_net) -> None:
    x = torch.randn(2, 8)
    expected = tiny_net(x)
    model = enable_vram_management(copy.deepcopy(tiny_net), {nn.Linear: AutoWrappedLinear}, CPU32)
    assert model.vram_management_enabled is True
    assert isinstance(model.proj_in, AutoWrappedLinear) and model.proj_in.name == "proj_in"
    assert isinstance(model.norm, nn.LayerNorm)  # not in the map
    assert torch.equal(model(x), expected)


def test_second_call_is_a_clear_error(tiny_net) -> None:
    model = enable_vram_management(tiny_net, {nn.Linear: AutoWrappedLinear}, CPU32)
    with pytest.raises(VramManagementError, match="already enabled"):
        enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, CPU32)


def test_module_map_order_decides_overlapping_classes() -> None:
    model = nn.Sequential(SubLinear(3, 3), nn.Linear(3, 3))
    first = enable_vram_management(
        copy.deepcopy(model), {nn.Linear: AutoWrappedLinear, SubLinear: AutoWrappedModule}, CPU32
    )
    assert isinstance(first[0], AutoWrappedLinear)
    second = enable_vram_management(
        copy.deepcopy(model), {SubLinear: AutoWrappedModule, nn.Linear: AutoWrappedLinear}, CPU32
    )
    assert isinstance(second[0], AutoWrappedModule) and isinstance(second[1], AutoWrappedLinear)


def test_overflow_config_after_max_num_param() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))  # 20 elements each
    wrapped = enable_vram_management(
        model, {nn.Linear: AutoWrappedLinear}, dict(offload_dtype=torch.float16, **CPU32),
        max_num_param=40, overflow_vram_config=dict(offload_dtype=torch.bfloat16, **CPU32),
    )  # fmt: skip
    assert [layer.weight.dtype for layer in wrapped] == [
        torch.float16,
        torch.float16,
        torch.bfloat16,
    ]


def test_max_num_param_needs_overflow_config(tiny_net) -> None:
    with pytest.raises(ConfigError, match="overflow_vram_config"):
        enable_vram_management(tiny_net, {nn.Linear: AutoWrappedLinear}, CPU32, max_num_param=1)


def test_invalid_config_and_map_are_config_errors(tiny_net) -> None:
    with pytest.raises(ConfigError, match="unknown vram_config key"):
        enable_vram_management(tiny_net, {nn.Linear: AutoWrappedLinear}, {"gpu": "cuda"})
    with pytest.raises(ConfigError, match="module_map entry"):
        enable_vram_management(tiny_net, {nn.Linear: nn.Linear}, CPU32)


def test_recursive_returns_running_count_and_uses_prefix() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 1)))
    total = enable_vram_management_recursively(
        model, {nn.Linear: AutoWrappedLinear}, CPU32, name_prefix="net", total_num_param=5
    )
    assert total == 5 + 9 + 4
    assert model[1][0].name == "net.1.0"
    assert not hasattr(model, "vram_management_enabled")


def test_shared_module_is_wrapped_once() -> None:
    shared = nn.Linear(3, 3)
    model = nn.Module()
    model.a, model.b = shared, shared
    enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, CPU32)
    assert model.a is model.b and isinstance(model.a, AutoWrappedLinear)


def test_root_in_map_is_wrapped_whole_with_collapsed_config(tiny_net) -> None:
    x = torch.randn(2, 8)
    config = dict(offload_dtype=torch.bfloat16, onload_dtype=torch.float16, **CPU32)
    with pytest.warns(UserWarning, match="wrapped as one unit"):
        model = enable_vram_management(
            copy.deepcopy(tiny_net), {type(tiny_net): AutoWrappedModule}, config
        )
    assert isinstance(model, AutoWrappedModule) and model.vram_management_enabled
    assert model.onload_dtype == torch.float32 and model.offload_dtype == torch.bfloat16
    model.keep()
    rounded = copy.deepcopy(tiny_net)
    for param in rounded.parameters():
        param.data = param.data.to(torch.bfloat16).float()
    assert torch.equal(model(x), rounded(x))


def test_fill_vram_config_collapses_onload_and_preparing() -> None:
    config = dict(
        offload_device="disk", onload_device="cpu", preparing_dtype=torch.float16, **CPU32
    )
    with pytest.warns(UserWarning):
        filled = fill_vram_config(nn.Linear(1, 1), config)
    assert filled["offload_device"] == "disk"
    assert filled["onload_device"] == filled["preparing_device"] == "cpu"
    assert filled["onload_dtype"] == filled["preparing_dtype"] == torch.float32
    assert config["preparing_dtype"] == torch.float16  # input not mutated


def test_vram_config_for_overrides_single_modules(tiny_net) -> None:
    calls: list[tuple[str, frozenset[str]]] = []

    def choose(name: str, keys: frozenset[str]):
        calls.append((name, keys))
        return dict(offload_dtype=torch.float16, **CPU32) if name == "proj_out" else None

    model = enable_vram_management(
        tiny_net, {nn.Linear: AutoWrappedLinear}, CPU32, vram_config_for=choose
    )
    assert calls == [("proj_in", frozenset({"proj_in.weight", "proj_in.bias"})),
                     ("proj_out", frozenset({"proj_out.weight", "proj_out.bias"}))]  # fmt: skip
    assert model.proj_out.weight.dtype == torch.float16
    assert model.proj_in.weight.dtype == torch.float32


def test_root_non_recurse_wrapper_wraps_children_separately(tiny_net) -> None:
    from flextensor_runtime import AutoWrappedNonRecurseModule

    x = torch.randn(2, 8)
    expected = tiny_net(x)
    config = dict(offload_dtype=torch.float16, **CPU32)
    with pytest.warns(UserWarning):
        model = enable_vram_management(
            copy.deepcopy(tiny_net),
            {type(tiny_net): AutoWrappedNonRecurseModule, nn.Linear: AutoWrappedLinear}, config,
        )  # fmt: skip
    assert isinstance(model, AutoWrappedNonRecurseModule)
    inner = model.module.proj_in
    assert isinstance(inner, AutoWrappedLinear) and inner.weight.dtype == torch.float16
    rounded = copy.deepcopy(tiny_net)
    for layer in (rounded.proj_in, rounded.proj_out):
        for param in layer.parameters():
            param.data = param.data.half().float()
    assert torch.equal(model(x), rounded(x))
    assert not torch.equal(model(x), expected)


def test_bad_dtype_is_a_config_error_and_model_unchanged(tiny_net) -> None:
    children = list(tiny_net.children())
    for bad in ("float16", 3):
        with pytest.raises(ConfigError, match=f"invalid offload_dtype {bad!r}"):
            enable_vram_management(tiny_net, {nn.Linear: AutoWrappedLinear}, {"offload_dtype": bad})
    assert list(tiny_net.children()) == children
    assert not hasattr(tiny_net, "vram_management_enabled")


def test_failure_after_first_wrap_leaves_model_unchanged() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    children, weight = list(model.children()), model[0].weight
    with pytest.raises(ConfigError, match="invalid device 'bogus'"):
        enable_vram_management(
            model, {nn.Linear: AutoWrappedLinear}, CPU32,
            vram_config_for=lambda name, keys: {"offload_device": "bogus"} if name == "1" else None,
        )  # fmt: skip
    assert list(model.children()) == children and model[0].weight is weight
    assert not hasattr(model, "vram_management_enabled")
    assert isinstance(
        enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, CPU32)[0], AutoWrappedLinear
    )


@pytest.mark.parametrize("module_map", [{}, [(nn.Linear, AutoWrappedLinear)]])
def test_empty_or_non_dict_module_map_is_a_config_error(tiny_net, module_map) -> None:
    with pytest.raises(ConfigError, match="pass a non-empty dict mapping"):
        enable_vram_management(tiny_net, module_map, CPU32)
    assert not hasattr(tiny_net, "vram_management_enabled")  # a later real call still works
    enable_vram_management(tiny_net, {nn.Linear: AutoWrappedLinear}, CPU32)


@pytest.mark.parametrize(
    ("disk_map", "message"),
    [(None, "'disk' placement but no disk_map"), ("w.safetensors", "disk_map='w.safetensors'")],
)
def test_disk_tier_without_a_usable_disk_map_keeps_the_weights(disk_map, message) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    weight = model[0].weight
    with pytest.raises(ConfigError, match=message):
        enable_vram_management(
            model, {nn.Linear: AutoWrappedLinear}, {"offload_device": "disk"}, disk_map=disk_map
        )
    assert model[0].weight is weight and weight.device.type == "cpu"


def test_non_module_model_and_bad_max_num_param_are_config_errors() -> None:
    linear_map = {nn.Linear: AutoWrappedLinear}
    for call in (enable_vram_management, enable_vram_management_recursively):
        with pytest.raises(ConfigError, match=r"needs a torch\.nn\.Module, got NoneType"):
            call(None, linear_map, CPU32)  # type: ignore[arg-type]
    for bad in (-5, "5"):
        with pytest.raises(ConfigError, match=f"max_num_param={bad!r} is invalid"):
            enable_vram_management(
                nn.Sequential(nn.Linear(2, 2)), linear_map, CPU32, max_num_param=bad,
                overflow_vram_config=CPU32,
            )  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_placement_without_cuda_is_backend_unavailable_and_model_unchanged() -> None:
    from flextensor_runtime.errors import BackendUnavailableError

    model = nn.Sequential(nn.Linear(2, 2))
    linear = model[0]
    with pytest.raises(BackendUnavailableError, match="device 'cuda' needs CUDA"):
        enable_vram_management(
            model, {nn.Linear: AutoWrappedLinear}, {"computation_device": "cuda"}
        )
    assert model[0] is linear
    with pytest.warns(UserWarning, match="wrapped as one unit"):  # keys only: no device check
        filled = fill_vram_config(linear, {"computation_device": "cuda"})
    assert filled["onload_device"] == "cuda"


class OwnForwardLinear(nn.Linear):
    """A Linear subclass whose forward adds to the GEMM (as FP8 or LoRA-style layers do)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2.0


def test_a_linear_subclass_with_its_own_forward_is_refused_by_the_linear_wrapper() -> None:
    """AutoWrappedLinear runs the plain GEMM: wrapping it would silently drop the subclass's
    forward. The model is left unchanged; mapped to AutoWrappedModule it runs its own forward."""
    model = nn.Sequential(OwnForwardLinear(3, 3), nn.Linear(3, 3))
    x = torch.randn(2, 3)
    expected = model(x)
    with pytest.raises(ConfigError, match=r"OwnForwardLinear overrides forward.*map "
                       r"OwnForwardLinear to AutoWrappedModule in module_map, listed before "
                       r"nn\.Linear"):  # fmt: skip
        enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, CPU32)
    assert type(model[0]) is OwnForwardLinear and type(model[1]) is nn.Linear
    assert not getattr(model, "vram_management_enabled", False)
    mapped = {OwnForwardLinear: AutoWrappedModule, nn.Linear: AutoWrappedLinear}
    wrapped = enable_vram_management(model, mapped, CPU32)
    assert torch.equal(wrapped(x), expected)
