"""VRAM wrappers against bad input: placement configs naming devices or dtypes that cannot hold
weights, bad options, and inputs a wrapped Linear cannot compute. Every failure is one
`FlextensorError` line, raised before a module is wrapped, and the model is left unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from flextensor_runtime import (
    AutoTorchModule,
    AutoWrappedLinear,
    enable_vram_management,
    enable_vram_management_recursively,
    fill_vram_config,
)
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.cache_install import install_cache
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.errors import BackendUnavailableError, ConfigError, VramManagementError
from profiles.tiny_transformer import TinyTransformer, build_model, example_inputs
from tests.runtime.conftest import assert_same, snapshot
from tests.runtime.test_bad_input_runtime import PROFILE

LINEAR = {nn.Linear: AutoWrappedLinear}
CPU = dict(offload_device="cpu", computation_device="cpu")


@pytest.fixture
def bert() -> nn.Module:
    """A small transformers BERT with random weights (real Linear, LayerNorm, Embedding)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
    )  # fmt: skip
    return transformers.BertModel(config).eval()


def _out(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(8).reshape(1, 8)).last_hidden_state


BAD_CONFIGS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("meta offload", dict(offload_device="meta", computation_device="cpu"), ConfigError,
     "meta holds no data"),
    ("meta compute", dict(computation_device="meta"), ConfigError, "meta holds no data"),
    ("missing backend", dict(computation_device="xpu:9"), BackendUnavailableError,
     "'xpu:9' is not available on this machine"),
    ("int8 compute", dict(computation_dtype=torch.int8), ConfigError,
     "pass a floating torch.dtype"),
    ("bool offload", dict(offload_dtype=torch.bool), ConfigError, "pass a floating torch.dtype"),
    ("complex onload", dict(onload_dtype=torch.complex64), ConfigError,
     "pass a floating torch.dtype"),
]  # fmt: skip


@pytest.mark.parametrize(
    "config, error, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_placement_that_cannot_hold_weights_is_refused_and_model_unchanged(
    bert: nn.Module, config: dict[str, Any], error: type[Exception], message: str
) -> None:
    before, out = snapshot(bert), _out(bert)
    with pytest.raises(error, match=message):
        enable_vram_management(bert, LINEAR, config)
    assert_same(bert, before)
    assert torch.equal(_out(bert), out)
    assert not getattr(bert, "vram_management_enabled", False)


BAD_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("config_for not callable", dict(vram_config_for=5), "vram_config_for=5 is invalid"),
    ("config_for returns junk", dict(vram_config_for=lambda n, k: 5),
     "vram_config_for must be a dict"),
    ("vram_limit NaN", dict(vram_limit=float("nan")), "vram_limit=nan is invalid"),
    ("vram_limit negative", dict(vram_limit=-1.0), "vram_limit=-1.0 is invalid"),
]  # fmt: skip


@pytest.mark.parametrize(
    "options, message", [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS]
)
def test_bad_option_is_a_config_error_and_model_unchanged(
    bert: nn.Module, options: dict[str, Any], message: str
) -> None:
    before = snapshot(bert)
    with pytest.raises(ConfigError, match=message):
        enable_vram_management(bert, LINEAR, CPU, **options)
    assert_same(bert, before)


def test_fill_vram_config_needs_a_module() -> None:
    with pytest.raises(ConfigError, match=r"needs a torch\.nn\.Module, got str"):
        fill_vram_config("model", CPU)  # type: ignore[arg-type]


def _tiny_out(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(*example_inputs())


def _half_stored() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return enable_vram_management(model, LINEAR, dict(offload_dtype=torch.float16, **CPU))


BAD_INPUTS: list[tuple[str, Callable[[], torch.Tensor], str]] = [
    ("dtype", lambda: torch.randn(1, 4), "got a torch.float32 input but computes in torch.float16"),
    ("width", lambda: torch.randn(1, 5, dtype=torch.float16), r"got input \(1, 5\); pass a tensor"),
    ("scalar", lambda: torch.tensor(1.0, dtype=torch.float16), r"got input \(\); pass a tensor"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make, message", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_wrapped_linear_names_itself_for_an_input_it_cannot_compute(
    make: Callable[[], torch.Tensor], message: str
) -> None:
    model = _half_stored()
    with pytest.raises(VramManagementError, match=f"AutoWrappedLinear '0' {message}"):
        model(make())
    assert model(torch.randn(1, 4, dtype=torch.float16)).dtype == torch.float16  # still usable


def test_wrapped_linear_keeps_autocast_working() -> None:
    model = _half_stored()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randn(1, 4)).dtype == torch.bfloat16


def test_a_model_offloaded_from_a_profile_is_not_wrapped_again() -> None:
    """Wrappers would bypass the profile's traps and read weights it keeps elsewhere."""
    model = build_model()
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    expected = _tiny_out(model)
    with pytest.raises(VramManagementError, match="is offloaded by offload_from_profile"):
        enable_vram_management(model, LINEAR, CPU)
    with pytest.raises(VramManagementError, match=r"handle\(model\)\.remove\(\) first"):
        enable_vram_management_recursively(model, LINEAR, CPU)
    assert torch.equal(_tiny_out(model), expected)
    handle(model).remove()
    assert isinstance(enable_vram_management(model, LINEAR, CPU), TinyTransformer)
    assert torch.equal(_tiny_out(model), expected)


@pytest.mark.parametrize("vram_limit", [float("inf"), 10**400], ids=["inf", "huge int"])
def test_an_unbounded_vram_limit_promotes_instead_of_overflowing(vram_limit: float) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    expected = linear(x).detach()
    wrapped = AutoWrappedLinear(
        linear, offload_dtype=torch.float16, computation_dtype=torch.float32, vram_limit=vram_limit
    )
    assert wrapped.check_free_vram()
    out = wrapped(x)
    assert wrapped.state == 2 and wrapped.stored.dtype == torch.float32  # kept at compute
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)  # weights went via fp16


def test_install_cache_names_its_arguments() -> None:
    with pytest.raises(ConfigError, match="install_cache got str and dict; pass the model"):
        install_cache("model", {"policy": "fixed-step"})  # type: ignore[arg-type]


@pytest.mark.parametrize("transition", ["offload", "onload", "preparing", "keep"])
def test_the_bare_base_state_machine_says_it_manages_nothing(transition: str) -> None:
    base = AutoTorchModule(computation_device="cpu")
    with pytest.raises(VramManagementError, match="AutoTorchModule is the base state machine"):
        getattr(base, transition)()


class _LoadOnlyMap:
    """A disk map that only knows `load` (no names, no layout): checked by name at load time."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def load(
        self, name: str, dtype: torch.dtype | None = None, device: object = None
    ) -> torch.Tensor:
        tensor = self.state[name]
        return tensor.to(dtype=dtype or tensor.dtype, device=device or "cpu", copy=True)


def test_a_load_only_disk_map_still_works() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(2, 4)
    expected = model(x).detach()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    disk = dict(offload_device="disk", computation_device="cpu")
    enable_vram_management(model, LINEAR, disk, disk_map=_LoadOnlyMap(state))
    assert model[0].weight.device.type == "meta"
    assert torch.equal(model(x), expected)


def test_a_wrapped_model_is_not_offloaded_from_a_profile_too() -> None:
    """The reverse: the profile's traps would run beside wrappers keeping the weights elsewhere."""
    model = build_model()
    enable_vram_management(model, LINEAR, CPU)
    before = snapshot(model)
    expected = _tiny_out(model)
    with pytest.raises(ConfigError, match="has VRAM management wrappers"):
        offload_from_profile(model, PROFILE, backend=CpuBackend())
    assert_same(model, before)
    assert torch.equal(_tiny_out(model), expected)
