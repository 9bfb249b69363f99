"""Layer-wise offload and VRAM management refuse a model that already runs an offload profile
(its traps stream the same weights), and leave it exactly as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoWrappedLinear, enable_layerwise_cpu_offload, handle
from flextensor_runtime.errors import ConfigError, VramManagementError
from flextensor_runtime.layerwise import enable_layerwise_offload_on
from flextensor_runtime.vram.copy_backend import ThreadCopyBackend
from flextensor_runtime.vram.enable import enable_vram_management
from tests.runtime.conftest import Snapshot, assert_same, deploy, snapshot
from tests.runtime.models import TinyLM, block_names
from tests.runtime.plans import build_profile, record_order


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _deployed() -> tuple[nn.Module, torch.Tensor, Snapshot]:
    """A TinyLM with an offload profile installed (CPU backend), its plain output and its state
    before the install (its scaled blocks' weights carry an inner tensor field `weight.scale`)."""
    torch.manual_seed(0)
    model, ids = TinyLM(scaled=True).eval(), _ids()
    order, _ = record_order(model, block_names(model), ids)
    profile = build_profile(model, order)
    with torch.no_grad():
        plain = model(ids)
    before = snapshot(model)
    deploy(model, profile)
    return model, plain, before


def _installed_state(model: nn.Module) -> dict[str, tuple[int, torch.device]]:
    return {n: (id(p), p.device) for n, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_layerwise_on_a_profile_installed_model_is_refused(reuse_buffers: bool) -> None:
    model, plain, _ = _deployed()
    before = _installed_state(model)
    hooks = [(m._forward_pre_hooks.copy(), m._forward_hooks.copy()) for m in model.modules()]
    with pytest.raises(
        ConfigError, match=r"offload profile installed.*handle\(model\)\.remove\(\)"
    ):
        enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=reuse_buffers)
    with pytest.raises(ConfigError, match="offload profile installed"):
        enable_layerwise_cpu_offload(model)  # refused on any machine, before the CUDA gate
    _assert_unchanged(model, before, hooks, plain)


def _assert_unchanged(model: nn.Module, before: object, hooks: list, plain: torch.Tensor) -> None:
    """The deployed model kept its install state and hooks, and computes `plain`."""
    assert _installed_state(model) == before
    assert hooks == [(m._forward_pre_hooks, m._forward_hooks) for m in model.modules()]
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain)


def test_a_container_holding_a_deployed_model_is_refused() -> None:
    model, _, _ = _deployed()
    outer = nn.Module()
    outer.inner = model
    with pytest.raises(ConfigError, match="its submodule 'inner' has an offload profile"):
        enable_layerwise_offload_on(outer, ThreadCopyBackend(), layer_container="inner.blocks")


def test_layerwise_after_the_profile_is_removed() -> None:
    model, plain, before = _deployed()
    handle(model).remove()
    assert_same(model, before)
    enable_layerwise_offload_on(model, ThreadCopyBackend())
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain)


def test_vram_management_on_a_profile_installed_model_is_refused() -> None:
    model, plain, _ = _deployed()
    installed = _installed_state(model)
    with pytest.raises(VramManagementError, match=r"offload_from_profile.*handle\(model\)"):
        enable_vram_management(model, {nn.Linear: AutoWrappedLinear}, {})
    assert _installed_state(model) == installed
    assert not any(isinstance(m, AutoWrappedLinear) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain)


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_layerwise_on_a_submodule_of_a_deployed_model_is_refused(reuse_buffers: bool) -> None:
    model, plain, _ = _deployed()
    before = _installed_state(model)
    hooks = [(m._forward_pre_hooks.copy(), m._forward_hooks.copy()) for m in model.modules()]
    message = r"it is part of a TinyLM that has an offload profile installed.*handle\(model\)"
    with pytest.raises(ConfigError, match=message):  # the block list is the layer stack itself
        enable_layerwise_offload_on(model.blocks, ThreadCopyBackend(), reuse_buffers=reuse_buffers)
    with pytest.raises(ConfigError, match=message):
        enable_layerwise_cpu_offload(model.blocks)  # refused on any machine, before the CUDA gate
    holder = nn.Module()  # a new container around a part of the deployed model
    holder.part = model.blocks
    with pytest.raises(ConfigError, match="its submodule 'part' is part of a TinyLM"):
        enable_layerwise_offload_on(holder, ThreadCopyBackend(), layer_container="part")
    _assert_unchanged(model, before, hooks, plain)


def test_a_submodule_takes_layerwise_once_the_profile_is_removed() -> None:
    model, plain, before = _deployed()
    handle(model).remove()
    assert_same(model, before)
    assert not any("_ft_profile_member" in m.__dict__ for m in model.modules())
    enable_layerwise_offload_on(model.blocks, ThreadCopyBackend())
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain)


@pytest.mark.parametrize("on_blocks", [False, True])
def test_a_profile_on_a_model_with_layerwise_inside_is_refused(on_blocks: bool) -> None:
    torch.manual_seed(0)
    model, ids = TinyLM(scaled=True).eval(), _ids()
    profile = build_profile(model, record_order(model, block_names(model), ids)[0])
    with torch.no_grad():
        plain = model(ids)
    enable_layerwise_offload_on(model.blocks if on_blocks else model, ThreadCopyBackend())
    before = _installed_state(model)
    where = "its submodule 'blocks' has" if on_blocks else "it has"
    with pytest.raises(ConfigError, match=f"{where} layer-wise CPU offload; call disable"):
        deploy(model, profile)
    assert _installed_state(model) == before and "_ft_handle" not in model.__dict__
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
