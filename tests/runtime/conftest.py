"""Runtime test fixtures: deploying with the CPU backend, snapshots proving a model unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import OffloadHandle, handle, offload_from_profile
from flextensor_runtime.profile import Profile


@dataclass(frozen=True)
class Snapshot:
    """Identity, values and layout of every tensor, and which modules carry an own forward."""

    tensors: dict[str, tuple[int, torch.Tensor, torch.device, tuple[int, ...], bool]]
    forwards: dict[str, object | None]


def snapshot(model: nn.Module) -> Snapshot:
    tensors = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:  # fmt: skip
        tensors[name] = (id(t), t.detach().clone(), t.device, tuple(t.stride()), t.requires_grad)
        for attr, inner in vars(t).items():
            if isinstance(inner, torch.Tensor) and not attr.startswith("_"):
                tensors[f"{name}.{attr}"] = (
                    id(inner),
                    inner.clone(),
                    inner.device,
                    tuple(inner.stride()),
                    False,
                )
    forwards = {n: m.__dict__.get("forward") for n, m in model.named_modules()}
    return Snapshot(tensors, forwards)


def assert_same(model: nn.Module, before: Snapshot) -> None:
    after = snapshot(model)
    assert after.tensors.keys() == before.tensors.keys()
    for name, (ident, value, device, stride, grad) in before.tensors.items():
        a_ident, a_value, a_device, a_stride, a_grad = after.tensors[name]
        assert a_ident == ident, f"{name} is a different object"
        assert a_device == device and a_stride == stride and a_grad == grad, name
        assert torch.equal(a_value, value), f"{name} changed value"
    assert after.forwards == before.forwards
    assert "_ft_handle" not in model.__dict__


def deploy(model: nn.Module, profile: Profile, **kwargs) -> OffloadHandle:
    kwargs.setdefault("backend", CpuBackend())
    offload_from_profile(model, profile, **kwargs)
    return handle(model)


def deploy_runs_unchanged(model: nn.Module, profile: Profile, inputs: tuple, plain: torch.Tensor,
                          runs: int = 3) -> tuple[OffloadHandle, Snapshot]:  # fmt: skip
    """Deploy `profile` on `model` and check `runs` forwards of `inputs` give `plain` without a
    stall; the handle, and the model's snapshot from before (for `assert_same` after remove)."""
    before = snapshot(model)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(runs):
            assert torch.equal(model(*inputs), plain)
    assert h.report().stalls == 0
    return h, before


@pytest.fixture
def cpu_backend() -> CpuBackend:
    return CpuBackend()
