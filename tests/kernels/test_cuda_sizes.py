"""On a GPU: the Triton kernels at block-size regimes the interpreter tests do not reach."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime.kernels import (
    layer_norm_scale_shift,
    residual_gate_add,
    routed_swiglu_moe,
    routed_swiglu_moe_pytorch,
)
from tests.kernels.moe_problems import MOE_TOLERANCE, build_case
from tests.kernels.tensors import ROW_TOLERANCE, make

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("d", [3072, 20000])  # one register pass; three-loop rows
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_at_real_widths(d: int, dtype: torch.dtype) -> None:
    x = make((2, 64, d), dtype, 1, "strided", "cuda")
    scale, shift = make((2, d), dtype, 2, device="cuda"), make((2, 1, d), dtype, 3, device="cuda")
    out = layer_norm_scale_shift(x, scale, shift)  # auto: Triton on CUDA
    ref = layer_norm_scale_shift(x, scale, shift, upcast=True, backend="torch")
    torch.testing.assert_close(out, ref, **ROW_TOLERANCE[dtype])
    gated = residual_gate_add(x, x, scale)
    # the kernel computes in float32 and rounds once; x + x * scale in bfloat16 rounds twice
    once = (x.float() + x.float() * scale.float()[:, None]).to(dtype)
    torch.testing.assert_close(gated, once, **ROW_TOLERANCE[dtype])


@pytest.mark.parametrize("tokens", [3, 200, 2000])  # block_m 16, 32 and 64
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_moe_block_sizes(tokens: int, dtype: torch.dtype) -> None:
    case = build_case(tokens, 2, 8, 256, 512, dtype, seed=tokens, used_experts=7).to("cuda")
    out = routed_swiglu_moe(*case.args(), workspace={})
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*case.args()), **MOE_TOLERANCE[dtype])
