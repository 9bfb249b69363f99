"""Every public name of the runtime resolves to an object defined where the export table says."""

from __future__ import annotations

import importlib

import pytest

import flextensor_runtime

SEED_004_NAMES = {
    "AdaptiveResidualCache", "AutoTorchModule", "AutoWrappedLinear", "AutoWrappedModule",
    "AutoWrappedNonRecurseModule", "BaseMemory", "DiskMap", "enable_layerwise_cpu_offload",
    "enable_vram_management", "enable_vram_management_recursively", "fill_vram_config",
    "FixedStepCache", "init_weights_on_device", "layer_norm_scale_shift",
    "layerwise_offload_mutation_scope", "LayerwiseOffloadHandle", "MemoryStore", "prune_tokens",
    "residual_gate_add", "restore_tokens", "routed_swiglu_moe", "routed_swiglu_moe_pytorch",
    "select_token_indices", "skip_model_initialization", "TokenPruner", "TokenPruneState",
}  # fmt: skip


def test_the_26_reference_names_are_public() -> None:
    assert len(SEED_004_NAMES) == 26
    assert set(flextensor_runtime.__all__) >= SEED_004_NAMES


@pytest.mark.parametrize("name", flextensor_runtime.__all__)
def test_public_name_resolves(name: str) -> None:
    # import the defining module first: a submodule named like a public name would then shadow it
    module = importlib.import_module(f"flextensor_runtime.{flextensor_runtime._EXPORTS[name]}")
    value = getattr(flextensor_runtime, name)
    assert getattr(module, name) is value


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = flextensor_runtime.nope  # type: ignore[attr-defined]


def test_every_error_class_is_public() -> None:
    # a caller catches what the public API raises without reaching into the errors module
    errors = importlib.import_module("flextensor_runtime.errors")
    raised = {
        name for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.FlextensorError)
    }  # fmt: skip
    missing = sorted(raised - set(flextensor_runtime.__all__))
    assert not missing, missing
