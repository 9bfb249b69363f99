"""Backend choice: auto, forced, and the errors when Triton cannot run; imports without triton."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flextensor_runtime.errors import BackendUnavailableError, ConfigError
from flextensor_runtime.kernels import backend as backend_module
from flextensor_runtime.kernels import layer_norm_scale_shift, residual_gate_add, routed_swiglu_moe
from flextensor_runtime.kernels.backend import resolve_allow_triton, resolve_backend
from tests.kernels.moe_problems import build_case


def test_auto_uses_the_reference_for_cpu_tensors() -> None:
    x = torch.zeros(2, 3)
    assert resolve_backend("op", None, x) == "torch"
    assert resolve_allow_triton("op", None, x) == "torch"
    assert resolve_allow_triton("op", False, x) == "torch"


def test_auto_uses_the_reference_when_grad_is_needed() -> None:
    x = torch.zeros(2, 3, requires_grad=True)
    assert resolve_backend("op", None, x) == "torch"
    out = layer_norm_scale_shift(x, torch.zeros(3), torch.zeros(3))
    assert out.grad_fn is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter only matters without CUDA")
def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    x = torch.zeros(1, 2, 8)
    with pytest.raises(BackendUnavailableError, match="set TRITON_INTERPRET=1"):
        residual_gate_add(x, x, torch.zeros(8), backend="triton")


def test_forced_triton_refuses_inputs_that_need_grad(kernel_device: torch.device) -> None:
    x = torch.zeros(1, 2, 8, device=kernel_device, requires_grad=True)
    with pytest.raises(BackendUnavailableError, match=r"forward-only .* torch.no_grad\(\)"):
        layer_norm_scale_shift(x, torch.zeros(8, device=kernel_device), x, backend="triton")


def test_forced_triton_without_triton_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `triton` unimportable
    case = build_case(tokens=2, top_k=1, experts=2, hidden=4, inter=4)
    with pytest.raises(BackendUnavailableError, match="triton is not installed; install it"):
        routed_swiglu_moe(*case.args(), allow_triton=True)
    assert resolve_backend("op", None, torch.zeros(2)) == "torch"


def test_bad_allow_triton_raises() -> None:
    case = build_case(tokens=2, top_k=1, experts=2, hidden=4, inter=4)
    with pytest.raises(ConfigError, match="allow_triton must be None, True or False"):
        routed_swiglu_moe(*case.args(), allow_triton="yes")  # type: ignore[arg-type]


def test_runtime_imports_and_runs_without_triton() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # as if triton were not installed
        import torch
        from flextensor_runtime import layer_norm_scale_shift, routed_swiglu_moe_pytorch
        from flextensor_runtime.errors import BackendUnavailableError
        x = torch.randn(2, 3, 8)
        out = layer_norm_scale_shift(x, torch.zeros(2, 8), torch.zeros(8))
        assert torch.allclose(out, torch.nn.functional.layer_norm(x, (8,), eps=1e-6), atol=1e-6)
        try:
            layer_norm_scale_shift(x, torch.zeros(8), torch.zeros(8), backend="triton")
        except BackendUnavailableError as err:
            print(err)
        """
    )
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([repo_root, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=repo_root,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "triton is not installed" in done.stdout


def test_float64_stays_on_the_reference(kernel_device: torch.device) -> None:
    x = torch.zeros(1, 2, 8, dtype=torch.float64, device=kernel_device)
    assert resolve_backend("op", None, x) == "torch"
    with pytest.raises(BackendUnavailableError, match=r"support float32, bfloat16 and float16"):
        residual_gate_add(x, x, x, backend="triton")


@pytest.mark.parametrize(("dtype", "expected"), [(torch.float64, "torch"),
                                                (torch.float32, "triton")])  # fmt: skip
def test_auto_choice_on_cuda_follows_the_dtype(monkeypatch, dtype, expected) -> None:
    # the automatic choice as it runs on a GPU (device type and triton faked): a dtype the
    # kernels do not support keeps the reference instead of computing in float32
    monkeypatch.setattr(backend_module, "_one_device_type", lambda tensors: "cuda")
    monkeypatch.setattr(backend_module, "triton_installed", lambda: True)
    assert resolve_backend("op", None, torch.zeros(2, dtype=dtype)) == expected


def test_inputs_on_different_devices_are_a_config_error() -> None:
    x, cond = torch.randn(2, 3, 8), torch.randn(2, 8)
    meta = torch.randn(2, 8, device="meta")
    with pytest.raises(ConfigError, match=r"different devices \['cpu', 'meta'\]"):
        layer_norm_scale_shift(x, meta, cond)
    with pytest.raises(ConfigError, match=r"different devices \['cpu', 'meta'\]"):
        residual_gate_add(x, x, meta)
    experts = torch.randn(4, 6, 8)
    with pytest.raises(ConfigError, match=r"different devices \['cpu', 'meta'\]"):
        routed_swiglu_moe(
            torch.randn(5, 8), torch.rand(5, 2), torch.zeros(5, 2, dtype=torch.long),
            experts.to("meta"), experts, torch.randn(4, 8, 6), allow_triton=False,
        )  # fmt: skip
