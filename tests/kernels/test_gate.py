"""residual_gate_add: reference vs a per-row loop, Triton (interpreter) vs reference, DiT."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels import residual_gate_add
from tests.kernels.tensors import ROW_TOLERANCE, cond_shape, make, row_problems


def _inputs(p: dict, device: torch.device | str = "cpu"):
    b, t, d = p["b"], p["t"], p["d"]
    residual = make((b, t, d), p["dtype"], p["seed"], device=device)
    update = make((b, t, d), p["dtype"], p["seed"] + 1, p["layout"], device)
    gate = make(cond_shape(p["form"], b, t, d), p["dtype"], p["seed"] + 2, device=device)
    return residual, update, gate


def _gate_row(gate: torch.Tensor, form: str, b: int, t: int) -> torch.Tensor:
    """The gate vector that applies to row (b, t), read by hand from each shape form."""
    if form == "bd":
        return gate[b]
    if form == "b1d":
        return gate[b, 0]
    if form == "d":
        return gate
    if form == "btd":
        return gate[b, t]
    return gate[0, 0]


@settings(max_examples=25, deadline=None)
@given(p=row_problems())
def test_reference_matches_row_loop(p: dict) -> None:
    residual, update, gate = _inputs(p)
    out = residual_gate_add(residual, update, gate, backend="torch")
    expected = torch.empty(residual.shape, dtype=torch.float64)
    for b in range(p["b"]):
        for t in range(p["t"]):
            row_gate = _gate_row(gate, p["form"], b, t).double()
            expected[b, t] = residual[b, t].double() + update[b, t].double() * row_gate
    assert out.shape == residual.shape and out.dtype == residual.dtype
    # the reference rounds the product and the sum to the input dtype: two roundings
    tol = {k: 2 * v for k, v in ROW_TOLERANCE[p["dtype"]].items()}
    torch.testing.assert_close(out.double(), expected, **tol)


@settings(max_examples=20, deadline=None)
@given(p=row_problems())
def test_triton_matches_reference(p: dict, kernel_device: torch.device) -> None:
    residual, update, gate = _inputs(p, kernel_device)
    out = residual_gate_add(residual, update, gate, backend="triton")
    ref = residual_gate_add(residual.float(), update.float(), gate.float(), backend="torch")
    assert out.shape == residual.shape and out.dtype == residual.dtype
    torch.testing.assert_close(out, ref.to(residual.dtype), **ROW_TOLERANCE[p["dtype"]])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_dit_gated_residual(backend: str, kernel_device: torch.device) -> None:
    hidden = make((2, 5, 40), torch.float32, 1, device=kernel_device)
    attn_output = make((2, 5, 40), torch.float32, 2, "transposed", kernel_device)
    gate_msa = make((2, 40), torch.float32, 3, device=kernel_device)
    expected = gate_msa.unsqueeze(1) * attn_output + hidden  # as in diffusers' DiT blocks
    out = residual_gate_add(hidden, attn_output, gate_msa, backend=backend)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


def test_output_dtype_is_promoted_like_the_expression(kernel_device: torch.device) -> None:
    residual = make((2, 3, 16), torch.bfloat16, 1, device=kernel_device)
    update = make((2, 3, 16), torch.bfloat16, 2, device=kernel_device)
    gate = make((2, 16), torch.float32, 3, device=kernel_device)
    ref = residual_gate_add(residual, update, gate, backend="torch")
    out = residual_gate_add(residual, update, gate, backend="triton")
    assert ref.dtype == out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_single_token_broadcast_update(kernel_device: torch.device) -> None:
    residual = make((1, 1, 33), torch.float16, 4, device=kernel_device)
    update = make((33,), torch.float16, 5, device=kernel_device)
    gate = make((1, 33), torch.float16, 6, device=kernel_device)
    out = residual_gate_add(residual, update, gate, backend="triton")
    expected = residual.float() + update.float() * gate.float()[:, None]
    torch.testing.assert_close(out, expected.half(), **ROW_TOLERANCE[torch.float16])


def test_reference_is_differentiable() -> None:
    residual, update = make((2, 3, 8), torch.float64, 1), make((2, 3, 8), torch.float64, 2)
    gate = make((2, 8), torch.float64, 3).requires_grad_()
    out = residual_gate_add(residual, update.requires_grad_(), gate)
    grad_gate, grad_update = torch.autograd.grad(out.sum(), (gate, update))
    torch.testing.assert_close(grad_gate, update.sum(dim=1).detach())
    torch.testing.assert_close(grad_update, gate.detach()[:, None].expand(2, 3, 8))


@pytest.mark.parametrize(
    ("update_shape", "gate_shape", "fragment"),
    [
        ((2, 4, 8), (3, 8), r"gate of shape \(3, 8\) does not broadcast"),
        ((2, 5, 8), (8,), r"update of shape \(2, 5, 8\) does not broadcast"),
    ],
)
def test_bad_shapes_raise(update_shape, gate_shape, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        residual_gate_add(torch.zeros(2, 4, 8), torch.zeros(update_shape), torch.zeros(gate_shape))
