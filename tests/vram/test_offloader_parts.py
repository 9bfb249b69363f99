"""Offloaders exclude each other part by part: `offload_from_profile`, `enable_vram_management`
and layer-wise offload each refuse a submodule of a model another one manages (a layer, a
module inside a layer, a part kept on the device) and a container holding such a model, with a
one-line error naming that model and the fix, and leave everything unchanged. Once the other
offloader is removed, the same call succeeds."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, handle
from flextensor_runtime.errors import ConfigError, VramManagementError
from flextensor_runtime.layerwise import enable_layerwise_offload_on
from flextensor_runtime.profile import Profile
from flextensor_runtime.vram.copy_backend import ThreadCopyBackend
from flextensor_runtime.vram.enable import (
    enable_vram_management,
    enable_vram_management_recursively,
)
from tests.runtime.conftest import deploy
from tests.runtime.models import ScaledLinear, TinyLM, block_names
from tests.runtime.plans import build_profile, record_order

WRAPPERS = {ScaledLinear: AutoWrappedModule, nn.Linear: AutoWrappedLinear}
PARTS = ["blocks", "blocks.0", "blocks.0.up", "embed"]  # the stack, a layer, inside one, outside


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _model() -> tuple[TinyLM, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM(scaled=True).eval()
    with torch.no_grad():
        return model, model(_ids())


def _part_profile(part: nn.Module) -> Profile:
    """A valid profile for `part` alone: one trap (the part), every tensor resident."""
    return build_profile(part, [""], streamed=())


def _state(model: nn.Module) -> list[tuple[str, int, int]]:
    """Every module, parameter and buffer object by name, and each module's hooks."""
    hooks = [(n, id(m), len(m._forward_pre_hooks) + len(m._forward_hooks))
             for n, m in model.named_modules(remove_duplicate=False)]  # fmt: skip
    tensors = [(n, id(t), 0) for n, t in model.named_parameters(remove_duplicate=False)]
    return hooks + tensors + [(n, id(b), 0) for n, b in model.named_buffers()]


def _same_output(model: nn.Module, plain: torch.Tensor) -> None:
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain)


def _deploy_refused(model: nn.Module, target: nn.Module, profile: Profile, match: str,
                    plain: torch.Tensor) -> None:  # fmt: skip
    """Deploying `profile` on `target` raises ConfigError matching `match`, and changes nothing
    of `model` (which still computes `plain`)."""
    before = _state(model)
    with pytest.raises(ConfigError, match=match):
        deploy(target, profile)
    assert _state(model) == before and "_ft_handle" not in target.__dict__
    _same_output(model, plain)


# -- a model with an offload profile installed ------------------------------------------------


def _deployed_model() -> tuple[TinyLM, torch.Tensor]:
    model, plain = _model()
    deploy(model, build_profile(model, record_order(model, block_names(model), _ids())[0]))
    return model, plain


@pytest.mark.parametrize("part", PARTS)
def test_vram_management_on_a_part_of_a_deployed_model_is_refused(part: str) -> None:
    model, plain = _deployed_model()
    before = _state(model)
    sub = model.get_submodule(part)
    message = (
        rf"this {type(sub).__name__} cannot take VRAM management: it is part of a TinyLM that "
        rf"has an offload profile installed by offload_from_profile \(as '{part}'\); call "
        r"handle\(model\)\.remove\(\) on that TinyLM first"
    )
    with pytest.raises(VramManagementError, match=message):
        enable_vram_management(sub, WRAPPERS, {})
    with pytest.raises(VramManagementError, match=message):
        enable_vram_management_recursively(sub, WRAPPERS, {})
    assert _state(model) == before and not hasattr(sub, "vram_management_enabled")
    _same_output(model, plain)


def test_vram_management_on_a_container_of_a_deployed_model_is_refused() -> None:
    model, plain = _deployed_model()
    before = _state(model)
    holder = nn.Sequential(model)
    with pytest.raises(VramManagementError, match="its submodule '0' has an offload profile"):
        enable_vram_management(holder, WRAPPERS, {})
    assert _state(model) == before
    _same_output(model, plain)


def test_a_part_takes_vram_management_once_the_profile_is_removed() -> None:
    model, plain = _deployed_model()
    handle(model).remove()
    enable_vram_management(model.blocks[0], WRAPPERS, {})
    assert isinstance(model.blocks[0].up, AutoWrappedModule)
    _same_output(model, plain)


@pytest.mark.parametrize("part", ["blocks.0", "blocks.0.up", "embed"])
def test_a_profile_on_a_part_of_a_deployed_model_is_refused(part: str) -> None:
    model, plain = _model()
    sub = model.get_submodule(part)
    part_profile = _part_profile(sub)
    deploy(model, build_profile(model, record_order(model, block_names(model), _ids())[0]))
    _deploy_refused(
        model,
        sub,
        part_profile,
        rf"this {type(sub).__name__} cannot take an offload profile: it is part of a TinyLM "
        rf"that has an offload profile installed by offload_from_profile \(as '{part}'\); call "
        r"handle\(model\)\.remove\(\) on that TinyLM first",
        plain,
    )
    handle(model).remove()
    deploy(sub, part_profile)  # the part alone takes it now
    _same_output(model, plain)


def test_a_profile_on_a_container_of_a_deployed_model_is_refused() -> None:
    model, plain = _model()
    holder = nn.Sequential(model)
    holder_profile = _part_profile(holder)
    deploy(model, build_profile(model, record_order(model, block_names(model), _ids())[0]))
    _deploy_refused(
        model,
        holder,
        holder_profile,
        r"this Sequential cannot take an offload profile: its submodule '0' has an offload "
        r"profile installed by offload_from_profile; call handle\(model\)\.remove\(\) on that "
        "submodule first",
        plain,
    )


# -- a model with layer-wise offload ----------------------------------------------------------


@pytest.mark.parametrize("part", PARTS)
def test_a_profile_on_a_part_of_a_layerwise_model_is_refused(part: str) -> None:
    model, plain = _model()
    sub = model.get_submodule(part)
    part_profile = _part_profile(sub)
    offload = enable_layerwise_offload_on(model, ThreadCopyBackend())
    _deploy_refused(
        model,
        sub,
        part_profile,
        rf"this {type(sub).__name__} cannot take an offload profile: it is part of a TinyLM "
        rf"that has layer-wise CPU offload \(as '{part}'\); call disable\(\) on that TinyLM's "
        "LayerwiseOffloadHandle first",
        plain,
    )
    assert offload.disable()
    assert not any("_flextensor_layerwise_member" in m.__dict__ for m in model.modules())
    deploy(sub, part_profile)
    _same_output(model, plain)


@pytest.mark.parametrize("part", PARTS)
def test_other_installers_on_a_part_of_a_layerwise_model_are_refused(part: str) -> None:
    model, plain = _model()
    enable_layerwise_offload_on(model, ThreadCopyBackend())
    before = _state(model)
    sub = model.get_submodule(part)
    where = rf"it is part of a TinyLM that has layer-wise CPU offload \(as '{part}'\)"
    with pytest.raises(VramManagementError, match=rf"cannot take VRAM management: {where}"):
        enable_vram_management(sub, WRAPPERS, {})
    with pytest.raises(ConfigError, match=rf"cannot take layer-wise offload: {where}"):
        enable_layerwise_offload_on(sub, ThreadCopyBackend(), layer_container=None)
    holder = nn.Sequential(model)  # a second layer-wise offload around the first
    with pytest.raises(ConfigError, match="its submodule '0' has layer-wise CPU offload"):
        enable_layerwise_offload_on(holder, ThreadCopyBackend())
    assert _state(model) == before
    _same_output(model, plain)


def test_a_copy_of_a_part_of_a_layerwise_model_is_free() -> None:
    model, _ = _model()
    enable_layerwise_offload_on(model, ThreadCopyBackend())
    part = copy.deepcopy(model.blocks[1].down)  # a plain Linear: nothing manages the copy
    deploy(part, _part_profile(part))
    assert "_ft_handle" in part.__dict__
