"""The public names of this area resolve lazily from `flextensor_runtime` to their modules."""

from __future__ import annotations

import importlib

import pytest

import flextensor_runtime

NAMES = {
    "AutoTorchModule": "vram.autotorch",
    "AutoWrappedLinear": "vram.linear",
    "AutoWrappedModule": "vram.module",
    "AutoWrappedNonRecurseModule": "vram.module",
    "enable_vram_management": "vram.enable",
    "enable_vram_management_recursively": "vram.enable",
    "fill_vram_config": "vram.enable",
    "DiskMap": "diskmap",
    "enable_layerwise_cpu_offload": "layerwise",
    "LayerwiseOffloadHandle": "layerwise",
    "layerwise_offload_mutation_scope": "layerwise",
    "init_weights_on_device": "meta_init",
    "skip_model_initialization": "meta_init",
}


@pytest.mark.parametrize(("name", "module"), sorted(NAMES.items()))
def test_public_name_is_defined_where_the_export_table_says(name: str, module: str) -> None:
    defining = importlib.import_module(f"flextensor_runtime.{module}")
    assert name in defining.__all__
    assert getattr(flextensor_runtime, name) is getattr(defining, name)
