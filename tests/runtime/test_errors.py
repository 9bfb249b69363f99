"""Precise errors, model left unchanged: another model, a changed shape, a wrong dtype, a budget
larger than the free device memory, a failure in the middle of install, misuse."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, load_profile, offload_from_profile
from flextensor_runtime.errors import (
    BudgetError,
    ConfigError,
    InferenceOnlyError,
    InstallError,
    ProfileFormatError,
    ProfileMismatchError,
)
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import SharedBlockNet, block_names, tiny_lm
from tests.runtime.plans import build_profile


def _profile():
    model = tiny_lm()
    return build_profile(model, block_names(model), num_blocks=2, prefetch=2)


def test_profile_for_another_model() -> None:
    profile = _profile()
    other = SharedBlockNet().eval()
    before = snapshot(other)
    with pytest.raises(ProfileMismatchError) as err:
        deploy(other, profile)
    msg = str(err.value)
    assert "missing: blocks.0.down.bias" in msg and "extra: inp.bias" in msg
    assert "\n" not in msg and "ftc profile" in msg
    assert_same(other, before)


def test_changed_layer_shape() -> None:
    profile = _profile()
    model = tiny_lm()
    model.blocks[2].down = nn.Linear(64, 48)
    before = snapshot(model)
    with pytest.raises(
        ProfileMismatchError, match=r"reshaped: blocks\.2\.down\.bias \[32\]->\[48\]"
    ):
        deploy(model, profile)
    assert_same(model, before)


def test_wrong_dtype() -> None:
    profile = _profile()
    model = tiny_lm()
    model.blocks[1].half()
    before = snapshot(model)
    with pytest.raises(
        ProfileMismatchError, match=r"re-typed: blocks\.1\.down\.bias float32->float16"
    ):
        deploy(model, profile)
    assert_same(model, before)


def test_trap_module_missing() -> None:
    with_extra = tiny_lm()
    with_extra.blocks[3].extra = nn.Identity()  # a module without tensors: same fingerprint
    profile = build_profile(with_extra, [*block_names(with_extra), "blocks.3.extra"])
    model = tiny_lm()
    before = snapshot(model)
    with pytest.raises(
        ProfileMismatchError, match=r"traps 1 module this model lacks: blocks\.3\.extra"
    ):
        deploy(model, profile)
    assert_same(model, before)


def test_budget_larger_than_free_memory() -> None:
    profile = _profile()
    model = tiny_lm()
    before = snapshot(model)
    peak = profile.predicted.peak_bytes
    with pytest.raises(BudgetError) as err:
        deploy(model, profile, backend=CpuBackend(free_bytes_override=peak - 1))
    assert f"peak of {peak} bytes" in str(err.value) and f"{peak - 1} bytes free" in str(err.value)
    assert_same(model, before)
    deploy(model, profile, backend=CpuBackend(free_bytes_override=peak))


class _FailingBackend(CpuBackend):
    """Runs out of host memory after `ok` buffers (fault injection on a real backend)."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        if self.ok == 0:
            raise InstallError(f"cannot allocate {nbytes} bytes of host memory; free host memory")
        self.ok -= 1
        return super().alloc_host(nbytes)


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_failure_midway_rolls_back(mode: str) -> None:
    model = tiny_lm()
    profile = build_profile(model, block_names(model), num_blocks=2, prefetch=2, mode=mode)
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        plain = model(ids)
    before = snapshot(model)
    backend = _FailingBackend(ok=2)
    with pytest.raises(InstallError, match="host memory"):
        offload_from_profile(model, profile, backend=backend)
    assert_same(model, before)
    assert backend.held_bytes == 0
    with torch.no_grad():
        assert torch.equal(model(ids), plain)


def test_damaged_profile_file(tmp_path) -> None:
    path = tmp_path / "bad.msgpack"
    path.write_bytes(b"\x81\xa3not a profile")
    with pytest.raises(ProfileFormatError, match=r"bad\.msgpack"):
        load_profile(path)
    model = tiny_lm()
    before = snapshot(model)
    with pytest.raises(ProfileFormatError):
        offload_from_profile(model, path, backend=CpuBackend())
    assert_same(model, before)


def test_inference_only_guard() -> None:
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8))
    deploy(model, _profile())
    with pytest.raises(InferenceOnlyError, match=r"torch\.inference_mode"):
        model(ids)  # autograd on, weights require grad
    model.train()
    with pytest.raises(InferenceOnlyError, match="training mode"), torch.no_grad():
        model(ids)
    model.eval()
    with torch.inference_mode():
        model(ids)
    model.requires_grad_(False)
    model(ids)  # no weight needs a gradient: allowed


def test_not_a_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"needs a torch\.nn\.Module, got str; pass the model"):
        offload_from_profile("model", _profile())  # type: ignore[arg-type]


def test_stats_file_given_as_profile_is_named_as_json(tmp_path) -> None:
    model = tiny_lm()
    before = snapshot(model)
    stats = tmp_path / "stats.json"
    stats.write_text('{"traps": []}\n')
    with pytest.raises(ProfileFormatError, match=r"is a JSON text file \(a stats file\?\)"):
        offload_from_profile(model, stats)
    assert_same(model, before)


def test_bad_device_path_and_handle_arguments_are_config_errors() -> None:
    model = tiny_lm()
    before = snapshot(model)
    with pytest.raises(ConfigError, match=r"device 'tpu' is not a torch device; pass 'cuda'"):
        offload_from_profile(model, _profile(), device="tpu")
    with pytest.raises(ConfigError, match=r"needs a profile path or a Profile, got int"):
        offload_from_profile(model, 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"str has no offload profile installed"):
        handle("model")  # type: ignore[arg-type]
    assert_same(model, before)


def test_non_bool_flags_and_a_non_backend_are_config_errors() -> None:
    model = tiny_lm()
    before = snapshot(model)
    for kwargs in ({"strict": "no"}, {"log_events": 1}):
        with pytest.raises(ConfigError, match=r"=.* is invalid; pass True or False"):
            offload_from_profile(model, _profile(), backend=CpuBackend(), **kwargs)
    with pytest.raises(ConfigError, match=r"backend='cpu' is invalid; pass a DeviceBackend"):
        offload_from_profile(model, _profile(), backend="cpu")  # type: ignore[arg-type]
    assert_same(model, before)
    with pytest.raises(ConfigError, match=r"no offload profile installed"):
        handle(model)


@pytest.mark.parametrize("path", [None, 3, b"", ""])
def test_load_profile_without_a_path_is_the_same_config_error(path) -> None:
    """`load_profile(None)` used to be a raw TypeError from os.path.exists."""
    with pytest.raises(
        ConfigError, match=r"^load_profile (needs a profile path, got|got an empty)"
    ):
        load_profile(path)
    if path is not None:
        return
    with pytest.raises(ConfigError, match=r"^offload_from_profile needs a profile path or a "):
        offload_from_profile(tiny_lm(), path)  # type: ignore[arg-type]


@pytest.mark.parametrize("free", ["lots", -1, 1.5, True])
def test_cpu_backend_free_bytes_override_is_checked_when_made(free) -> None:
    """A string used to be accepted and fail at install with a raw TypeError; -1 gave a
    BudgetError suggesting `--budget -1`."""
    with pytest.raises(ConfigError, match=r"free_bytes_override=.* is invalid; pass a number of "):
        CpuBackend(free_bytes_override=free)
    assert CpuBackend(free_bytes_override=0).free_bytes() == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
@pytest.mark.parametrize("strict", [True, False])
def test_a_torch_compiled_model_is_named_with_the_fix(strict) -> None:
    """The mismatch used to list `_orig_mod.` names and say to recompile the profile."""
    model = tiny_lm()
    profile = _profile()
    compiled = torch.compile(model)
    with pytest.raises(ProfileMismatchError, match=r"torch\.compile wrapper .* deploy on the "
                       r"model before compiling it .* `compiled\._orig_mod`"):  # fmt: skip
        offload_from_profile(compiled, profile, backend=CpuBackend(), strict=strict)
    offload_from_profile(compiled._orig_mod, profile, backend=CpuBackend())
    handle(model).remove()
