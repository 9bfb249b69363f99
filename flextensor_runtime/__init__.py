"""flextensor runtime: deploy a compiled offload profile, plus a toolkit for memory-limited inference.

Public names are exported lazily (PEP 562): `import flextensor_runtime` is cheap and does not
import torch; the defining module is imported on first attribute access. The runtime never
imports `flextensor_compile`, typer or rich.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> defining module (relative to this package)
_EXPORTS: dict[str, str] = {
    # errors
    "FlextensorError": "errors",
    "ProfileError": "errors",
    "ProfileFormatError": "errors",
    "ProfileVersionError": "errors",
    "ProfileMismatchError": "errors",
    "BudgetError": "errors",
    "ConfigError": "errors",
    "InstallError": "errors",
    "InferenceOnlyError": "errors",
    "StatsFormatError": "errors",
    "ModelFileError": "errors",
    "BackendUnavailableError": "errors",
    "DiskMapError": "errors",
    "VramManagementError": "errors",
    "CacheUsageError": "errors",
    "TokenPruneError": "errors",
    # the profile artifact
    "Profile": "profile",
    "load_profile": "deploy",
    # deployment (profile -> installed model)
    "offload_from_profile": "deploy",
    "handle": "deploy",
    "PlannedDeviceWarning": "planned_device",
    "offload_block": "manual",
    "replan": "strategy_replan",
    # cross-step caches
    "FixedStepCache": "caches",
    "AdaptiveResidualCache": "caches",
    "CacheEvent": "caches",
    # token pruning
    "select_token_indices": "tokens",
    "prune_tokens": "tokens",
    "restore_tokens": "tokens",
    "TokenPruneState": "tokens",
    "TokenPruner": "tokens",
    "TokenScoreMethod": "tokens",
    # world-model memory records (not VRAM)
    "MemoryRecord": "memory_records",
    "MemoryQuery": "memory_records",
    "MemoryStore": "memory_records",
    "BaseMemory": "memory_records",
    # VRAM lifecycle wrappers
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
    # fused kernels
    "layer_norm_scale_shift": "kernels",
    "residual_gate_add": "kernels",
    "routed_swiglu_moe": "kernels",
    "routed_swiglu_moe_pytorch": "kernels",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flextensor_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
