"""Kernel errors name the argument that fixes them; a bad MoE workspace is a ConfigError."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime.errors import BackendUnavailableError, ConfigError
from flextensor_runtime.kernels import layer_norm_scale_shift, routed_swiglu_moe
from flextensor_runtime.kernels.backend import triton_installed


def _moe_args(requires_grad: bool = False, dtype: torch.dtype = torch.float32) -> tuple:
    gen = torch.Generator().manual_seed(0)
    t, k, e, d, i = 4, 2, 3, 8, 16
    x = torch.randn(t, d, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    weights = torch.rand(t, k, generator=gen, dtype=dtype)
    experts = torch.randint(0, e, (t, k), generator=gen)
    gate, up = (torch.randn(e, i, d, generator=gen, dtype=dtype) for _ in range(2))
    down = torch.randn(e, d, i, generator=gen, dtype=dtype)
    return x, weights, experts, gate, up, down


@pytest.mark.parametrize(
    ("requires_grad", "dtype"), [(True, torch.float32), (False, torch.float64)]
)
def test_forced_triton_moe_errors_name_allow_triton_not_backend(requires_grad, dtype) -> None:
    """routed_swiglu_moe has no `backend` argument, yet its errors said "use backend='torch'"."""
    with pytest.raises(BackendUnavailableError, match="allow_triton=False") as caught:
        routed_swiglu_moe(*_moe_args(requires_grad, dtype), allow_triton=True)
    assert "backend=" not in str(caught.value)


def test_kernels_with_a_backend_argument_still_name_it() -> None:
    x = torch.zeros(1, 2, 8, requires_grad=True)
    with pytest.raises(BackendUnavailableError, match="use backend='torch'"):
        layer_norm_scale_shift(x, torch.zeros(8), torch.zeros(8), backend="triton")


@pytest.mark.parametrize("allow_triton", [False, True])
def test_a_workspace_entry_that_is_not_a_tensor_is_a_config_error(allow_triton) -> None:
    """It used to reach the Triton path's buffer reuse: AttributeError 'str' ... is_inference."""
    with pytest.raises(ConfigError, match="workspace entry 'intermediate' holds str"):
        routed_swiglu_moe(*_moe_args(), workspace={"intermediate": "x"}, allow_triton=allow_triton)


@pytest.mark.skipif(not triton_installed(), reason="the factory is called on the Triton path")
def test_a_workspace_factory_returning_a_bad_entry_is_a_config_error() -> None:
    args = _moe_args()
    if torch.cuda.is_available():
        args = tuple(a.cuda() for a in args)
    with pytest.raises(ConfigError, match="workspace entry 'expert_out' holds int"):
        routed_swiglu_moe(*args, workspace=lambda: {"expert_out": 3}, allow_triton=True)
