"""A profile measured on one GPU and deployed on another device says so (`PlannedDeviceWarning`);
plans made for a named target, an emulated or a CPU device deploy without a note."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

import flextensor_runtime
from flextensor_runtime.planned_device import PlannedDeviceWarning, planned_device_note
from flextensor_runtime.profile import DeviceSpec
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile

H100 = DeviceSpec("NVIDIA H100 80GB HBM3", 80 << 30, 25e9, kind="cuda")


def test_a_profile_measured_on_a_gpu_warns_on_another_device() -> None:
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(ids)
    profile = replace(build_profile(model, block_names(model)), device=H100)
    with pytest.warns(PlannedDeviceWarning, match=r"measured on 'NVIDIA H100 80GB HBM3' and is "
                      r"deployed on 'cpu'.*run ftc profile on this device"):  # fmt: skip
        h = deploy(model, profile)
    with torch.no_grad():
        assert torch.equal(model(ids), plain)  # a note, not a refusal
    h.remove()


@pytest.mark.parametrize("kind", ["cpu", "emulated", "target"])
def test_other_planned_devices_deploy_quietly(kind: str) -> None:
    model = tiny_lm()
    profile = build_profile(model, block_names(model))
    profile = replace(profile, device=replace(H100, kind=kind))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        deploy(model, profile).remove()


def test_the_same_gpu_name_has_no_note() -> None:
    assert planned_device_note(H100, "nvidia h100 80GB HBM3 ") is None
    assert planned_device_note(H100, "NVIDIA A100-SXM4-80GB") is not None


def test_the_warning_is_public() -> None:
    assert flextensor_runtime.PlannedDeviceWarning is PlannedDeviceWarning
