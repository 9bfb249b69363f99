"""A profile's `vram` section is installed on the modules the plan keeps resident, next to the
weight streaming; `remove()` and any failure restore the model exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, ConfigError
from flextensor_runtime.errors import InstallError
from flextensor_runtime.vram.vram_section import VramSection, parse_vram_spec, vram_section_to_data
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import TinyLM, block_names
from tests.runtime.plans import build_profile

SPEC = "map=Linear:linear,LayerNorm:module;offload_device=cpu;computation_device=cpu"


def _model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(scaled=False).eval()


def _checkpoint(model: TinyLM, folder: Path) -> str:
    path = folder / "tiny.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, path)
    return str(path)


def _profile(model: TinyLM, section: VramSection, cache: str | None = None):
    profile = build_profile(model, block_names(model), streamed={"blocks.0", "blocks.2"})
    ext = {"vram": vram_section_to_data(section)}
    if cache is not None:
        ext["caches"] = {"module": cache, "policy": "fixed-step", "skip_steps": [1]}
    return replace(profile, extensions=ext)


@torch.no_grad()
def test_vram_section_wraps_resident_modules_and_remove_restores(tmp_path) -> None:
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model = _model()
    expected = model(ids)
    before = snapshot(model)
    disk = ("blocks.1.up.weight", "blocks.1.up.bias", "blocks.3.down.weight", "blocks.3.down.bias")
    section = replace(parse_vram_spec(SPEC), disk_tensors=disk,
                      checkpoint=_checkpoint(model, tmp_path))  # fmt: skip
    h = deploy(model, _profile(model, section))
    assert h.vram is not None
    assert isinstance(model.blocks[1].up, AutoWrappedLinear)
    assert isinstance(model.blocks[3].norm, AutoWrappedModule)
    assert not isinstance(model.blocks[0].up, AutoWrappedLinear)  # streamed: left to the plan
    assert {"blocks.0.up", "blocks.2.norm"} <= set(h.vram.skipped)
    assert {"blocks.1.up", "blocks.3.down", "head", "norm"} <= set(h.vram.wrapped)
    assert set(h.vram.disk_modules) == {"blocks.1.up", "blocks.3.down"}
    assert model.blocks[1].up.weight.device.type == "meta"  # served from the checkpoint
    for _ in range(2):
        assert torch.equal(model(ids), expected)
    assert h.report().bytes_moved > 0  # blocks.0 and blocks.2 were streamed meanwhile
    assert "2 on disk" in h.vram.summary()
    h.remove()
    assert_same(model, before)
    assert "vram_management_enabled" not in model.__dict__
    assert torch.equal(model(ids), expected)


def test_failure_after_the_vram_install_leaves_the_model_unchanged() -> None:
    model = _model()
    before = snapshot(model)
    profile = _profile(model, parse_vram_spec(SPEC), cache="no.such.module")
    with pytest.raises(InstallError, match=r"module 'no\.such\.module'"):
        deploy(model, profile)
    assert_same(model, before)


@pytest.mark.parametrize(
    ("spec", "disk", "message"),
    [
        ("map=TinyLM:module", (), "matches the root TinyLM"),
        (SPEC, ("blocks.0.up.weight", "blocks.0.up.bias"), "belongs to no module the section"),
        (SPEC + ";checkpoint=missing.safetensors", ("head.weight",), "does not exist"),
        ("map=Conv2d:module", (), "'Conv2d' matches no module"),
    ],
)
def test_bad_sections_fail_before_any_change(spec, disk, message) -> None:
    model = _model()
    before = snapshot(model)
    profile = _profile(model, replace(parse_vram_spec(spec), disk_tensors=disk))
    with pytest.raises(ConfigError, match=message):
        deploy(model, profile)
    assert_same(model, before)


def test_wrapped_modules_weights_are_not_copied_to_the_device() -> None:
    # the streaming install leaves the parameters the wrappers manage in place, so the device
    # holds the plan's bytes minus those (the wrappers move them by their own placement)
    plain_model, vram_model = _model(), _model()
    plain = deploy(plain_model, build_profile(plain_model, block_names(plain_model),
                                              streamed={"blocks.0", "blocks.2"}))  # fmt: skip
    section = parse_vram_spec(SPEC)
    h = deploy(vram_model, _profile(vram_model, section))
    assert h.vram is not None
    wrapped_bytes = sum(
        p.numel() * p.element_size()
        for name, p in _model().named_parameters()
        if any(name.startswith(f"{m}.") for m in h.vram.wrapped)
    )
    assert wrapped_bytes > 0
    assert plain.backend.held_bytes - h.backend.held_bytes == wrapped_bytes
