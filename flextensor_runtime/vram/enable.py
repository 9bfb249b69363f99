"""Installing VRAM wrappers on a model: which modules, with which placement configuration.

Owns: matching modules against `module_map` (first matching class in map order wins), the
`max_num_param` switch to the overflow configuration, the once-only marker
`vram_management_enabled`, and collapsing a configuration when the root is wrapped whole.
Must not know: what the wrappers do inside, profile files.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from flextensor_runtime.deploy import _HANDLE_ATTR as PROFILE_MARK
from flextensor_runtime.deploy import profile_conflict
from flextensor_runtime.errors import ConfigError, VramManagementError
from flextensor_runtime.fused_paths import call_submodules
from flextensor_runtime.layerwise import _HANDLE_ATTR as LAYERWISE_MARK
from flextensor_runtime.layerwise import layerwise_conflict
from flextensor_runtime.module_state import unchanged_on_error
from flextensor_runtime.vram.autotorch import AutoTorchModule
from flextensor_runtime.vram.module import AutoWrappedNonRecurseModule
from flextensor_runtime.vram.placement import resolve_stages
from flextensor_runtime.vram.tensor_slots import managed_parameters
from flextensor_runtime.vram.tied_keys import with_tied_keys

__all__ = [
    "VRAM_CONFIG_KEYS",
    "enable_vram_management",
    "enable_vram_management_recursively",
    "fill_vram_config",
]

VRAM_CONFIG_KEYS = tuple(
    f"{stage}_{part}"
    for stage in ("offload", "onload", "preparing", "computation")
    for part in ("dtype", "device")
)


def _check_config(config: Mapping[str, Any], what: str, *, values: bool = True) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ConfigError(f"{what} must be a dict of placement keys, got {type(config).__name__}")
    unknown = sorted(set(config) - set(VRAM_CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}: use {list(VRAM_CONFIG_KEYS)}")
    if values:  # bad devices and dtypes fail here, before any module is wrapped
        resolve_stages(**config)
    return dict(config)


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"VRAM management needs a torch.nn.Module, got {type(model).__name__}; pass the model"
        )


def _check_not_offloaded(model: nn.Module) -> None:
    """Wrappers would replace modules whose weights another offloader streams (its traps or
    hooks would no longer run, and the wrappers would read weights it keeps elsewhere): on the
    model, on one of its submodules, or on a model it is part of."""
    if PROFILE_MARK in model.__dict__:
        raise VramManagementError(
            f"this {type(model).__name__} is offloaded by offload_from_profile: call "
            "handle(model).remove() first, or put the wrappers in the profile's vram section"
        )
    if LAYERWISE_MARK in model.__dict__:
        raise VramManagementError(
            f"this {type(model).__name__} has layer-wise CPU offload: call disable() on its "
            "LayerwiseOffloadHandle first"
        )
    profile = profile_conflict(model)
    if profile is not None:
        raise VramManagementError(
            f"this {type(model).__name__} cannot take VRAM management: {profile}, or put the "
            "wrappers in the profile's vram section"
        )
    layered = layerwise_conflict(model)
    if layered is not None:
        raise VramManagementError(
            f"this {type(model).__name__} cannot take VRAM management: {layered}"
        )


def _check_module_map(module_map: Mapping[Any, Any]) -> None:
    if not isinstance(module_map, Mapping) or not module_map:
        raise ConfigError(
            f"module_map={module_map!r} is invalid: pass a non-empty dict mapping nn.Module "
            "classes to wrapper classes, e.g. {nn.Linear: AutoWrappedLinear}"
        )
    for source, wrapper in module_map.items():
        ok = isinstance(source, type) and issubclass(source, nn.Module)
        if not ok or not (isinstance(wrapper, type) and issubclass(wrapper, AutoTorchModule)):
            raise ConfigError(
                f"module_map entry {source!r}: {wrapper!r} is invalid: map nn.Module classes to "
                "wrapper classes such as AutoWrappedLinear"
            )


def _match(module: nn.Module, module_map: Mapping[Any, Any]) -> Any:
    """The wrapper of the first class in `module_map` order that `module` is an instance of."""
    for source, wrapper in module_map.items():
        if isinstance(module, source):
            return wrapper
    return None


def fill_vram_config(model: nn.Module, vram_config: Mapping[str, Any]) -> dict[str, Any]:
    """Collapse a placement policy when the root module is wrapped as one unit.

    A module wrapped whole has no finer unit to stream, so its onload and preparing stages
    become the computation placement; the offload stage is kept. Warns when that changes it.
    """
    _check_model(model)
    filled = _check_config(vram_config, "vram_config", values=False)  # keys only: no device check
    for stage in ("onload", "preparing"):
        filled[f"{stage}_dtype"] = filled.get("computation_dtype")
        filled[f"{stage}_device"] = filled.get("computation_device")
    if any(filled.get(k) != vram_config.get(k) for k in filled):
        warnings.warn(
            f"{type(model).__name__} is wrapped as one unit: onload and preparing placement "
            "set to the computation placement",
            stacklevel=2,
        )
    return filled


# (module name, checkpoint keys of the tensors its wrapper will manage) -> config or None
ConfigFor = Callable[[str, frozenset[str]], Mapping[str, Any] | None]


@dataclass(frozen=True)
class _WrapPlan:
    module_map: Mapping[Any, Any]
    vram_config: Mapping[str, Any]
    overflow_vram_config: Mapping[str, Any] | None
    max_num_param: int | None
    vram_limit: float | None
    disk_map: Any
    options: Mapping[str, Any]
    config_for: ConfigFor | None = None

    def wrap(self, module: nn.Module, wrapper: Any, name: str, total: int) -> tuple[Any, int]:
        direct_only = issubclass(wrapper, AutoWrappedNonRecurseModule)
        params = managed_parameters(module, not direct_only)
        numel = sum(p.numel() for p in params.values())
        config = self.vram_config
        if self.max_num_param is not None and total + numel > self.max_num_param:
            assert self.overflow_vram_config is not None
            config = self.overflow_vram_config
        if self.config_for is not None:
            keys = frozenset(f"{name}.{n}" if name else n for n in params)
            override = self.config_for(name, keys)
            config = config if override is None else _check_config(override, "vram_config_for")
        wrapped = wrapper(
            module, **config, vram_limit=self.vram_limit, name=name, disk_map=self.disk_map,
            **self.options,
        )  # fmt: skip
        return wrapped, total + numel


def _wrap_children(
    model: nn.Module, plan: _WrapPlan, prefix: str, total: int, memo: dict[int, nn.Module]
) -> int:
    for child_name, child in list(model._modules.items()):
        if child is None or isinstance(child, AutoTorchModule):
            continue
        name = f"{prefix}.{child_name}" if prefix else child_name
        if id(child) in memo:  # the same module reached twice: share its wrapper
            setattr(model, child_name, memo[id(child)])
            continue
        wrapper = _match(child, plan.module_map)
        if wrapper is None:
            total = _wrap_children(child, plan, name, total, memo)
            continue
        wrapped, total = plan.wrap(child, wrapper, name, total)
        _check_called(model, child_name, wrapped, name)
        memo[id(child)] = wrapped
        setattr(model, child_name, wrapped)
        if isinstance(wrapped, AutoWrappedNonRecurseModule):
            total = _wrap_children(wrapped.module, plan, name, total, memo)
    return total


def _check_called(parent: nn.Module, key: str, wrapped: AutoTorchModule, name: str) -> None:
    """Refuse a wrapper whose parent reads its weights without calling it (MultiheadAttention
    passes `out_proj.weight` and `.bias` to its attention op): they would be used wherever the
    wrapper stores them, not at the computation placement."""
    if not isinstance(parent, nn.MultiheadAttention) or key != "out_proj":
        return
    if wrapped.holds(wrapped.stages.computation):
        return  # stored at the computation placement: what the parent reads is right
    raise ConfigError(
        f"module_map wraps {name!r} ({type(parent._modules[key]).__name__}), but its parent "
        "MultiheadAttention reads its weight and bias without calling it, so they would be used "
        "at the offload placement; map nn.MultiheadAttention to AutoWrappedModule before "
        "nn.Linear in module_map (it then manages out_proj too)"
    )


def _turn_off_fused_paths(model: nn.Module) -> None:
    """Fused fast paths (`nn.TransformerEncoderLayer`) would read the stored weights of the
    wrappers inside them without calling the wrappers: turn them off (see `fused_paths`)."""
    call_submodules(model, {id(m) for m in model.modules() if isinstance(m, AutoTorchModule)})


def _make_plan(
    module_map: Mapping[Any, Any],
    vram_config: Mapping[str, Any],
    vram_limit: float | None,
    disk_map: Any,
    max_num_param: int | None,
    overflow_vram_config: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> _WrapPlan:
    _check_module_map(module_map)
    config = _check_config(vram_config, "vram_config")
    overflow = None
    if max_num_param is not None:
        if (
            isinstance(max_num_param, bool)
            or not isinstance(max_num_param, int)
            or max_num_param < 0
        ):
            raise ConfigError(
                f"max_num_param={max_num_param!r} is invalid; pass a parameter count >= 0 or None"
            )
        if overflow_vram_config is None:
            raise ConfigError(
                f"max_num_param={max_num_param} needs overflow_vram_config: pass the placement "
                "for modules past the limit"
            )
        overflow = _check_config(overflow_vram_config, "overflow_vram_config")
    options = dict(options)
    config_for = options.pop("vram_config_for", None)
    if config_for is not None and not callable(config_for):
        raise ConfigError(
            f"vram_config_for={config_for!r} is invalid; pass a callable (module name, "
            "checkpoint keys) -> placement dict or None"
        )
    return _WrapPlan(
        module_map, config, overflow, max_num_param, vram_limit, disk_map, options, config_for
    )


def enable_vram_management_recursively(
    model: nn.Module,
    module_map: dict,
    vram_config: dict,
    vram_limit: float | None = None,
    name_prefix: str = "",
    disk_map: Any = None,
    max_num_param: int | None = None,
    overflow_vram_config: dict | None = None,
    total_num_param: int = 0,
    **kwargs: Any,
) -> int:
    """Replace matching descendants with lifecycle-aware wrappers; return the running count
    of wrapped parameter elements (`total_num_param` plus those wrapped here)."""
    _check_model(model)
    _check_not_offloaded(model)
    disk_map = with_tied_keys(model, disk_map, name_prefix)
    plan = _make_plan(
        module_map, vram_config, vram_limit, disk_map, max_num_param, overflow_vram_config, kwargs
    )
    with unchanged_on_error(model):
        total = _wrap_children(model, plan, name_prefix, total_num_param, {})
    _turn_off_fused_paths(model)
    return total


def enable_vram_management(
    model: nn.Module,
    module_map: dict,
    vram_config: dict,
    vram_limit: float | None = None,
    disk_map: Any = None,
    max_num_param: int | None = None,
    overflow_vram_config: dict | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Install staged VRAM management on a model and return that model.

    If the root's class is in `module_map` the root is wrapped whole (see `fill_vram_config`)
    and the wrapper is returned; otherwise matching descendants are replaced in place. The
    returned model has `vram_management_enabled = True`; a second call raises
    `VramManagementError`. Other keyword options go to every wrapper (`memory_reader`,
    `fp8_backend`), except `vram_config_for`: a callable (module name, checkpoint keys of the
    tensors its wrapper manages) -> a placement config for that module, or None for the default.
    """
    _check_model(model)
    if getattr(model, "vram_management_enabled", False):
        raise VramManagementError(
            f"VRAM management is already enabled on this {type(model).__name__}: call "
            "enable_vram_management once, on a freshly built model"
        )
    _check_not_offloaded(model)
    disk_map = with_tied_keys(model, disk_map)  # a tie saved once answers to its other names
    plan = _make_plan(
        module_map, vram_config, vram_limit, disk_map, max_num_param, overflow_vram_config, kwargs
    )
    with unchanged_on_error(model):
        model = _install(model, plan)
    _turn_off_fused_paths(model)
    # the returned model's own marker (on a wrapper, `setattr` would write the wrapped module's)
    model.__dict__["vram_management_enabled"] = True
    return model


def _install(model: nn.Module, plan: _WrapPlan) -> nn.Module:
    wrapper = _match(model, plan.module_map)
    if wrapper is not None:
        root_plan = _WrapPlan(
            plan.module_map, fill_vram_config(model, plan.vram_config), None, None,
            plan.vram_limit, plan.disk_map, plan.options, plan.config_for,
        )  # fmt: skip
        model, _ = root_plan.wrap(model, wrapper, "", 0)
        if isinstance(model, AutoWrappedNonRecurseModule):
            _wrap_children(model.module, plan, "", 0, {})
    else:
        _wrap_children(model, plan, "", 0, {})
    return model
