"""layer_norm_scale_shift: reference vs naive float64, Triton (interpreter) vs reference, DiT."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels import layer_norm_scale_shift
from flextensor_runtime.kernels.broadcast import align_conditioning
from flextensor_runtime.kernels.triton_rows import layer_norm_scale_shift_triton
from tests.kernels.naive import naive_layer_norm_scale_shift
from tests.kernels.tensors import ROW_TOLERANCE, cond_as_3d, cond_shape, make, row_problems


def _inputs(p: dict, device: torch.device | str = "cpu"):
    b, t, d = p["b"], p["t"], p["d"]
    x = make((b, t, d), p["dtype"], p["seed"], p["layout"], device) * 3 + 1
    shape = cond_shape(p["form"], b, t, d)
    scale = make(shape, p["dtype"], p["seed"] + 1, device=device) * 0.5
    shift = make(shape, p["dtype"], p["seed"] + 2, device=device)
    return x, scale, shift


@settings(max_examples=25, deadline=None)
@given(p=row_problems())
def test_reference_matches_naive_float64(p: dict) -> None:
    x, scale, shift = _inputs(p)
    out = layer_norm_scale_shift(x, scale, shift, eps=1e-6, upcast=True, backend="torch")
    expected = naive_layer_norm_scale_shift(
        x, cond_as_3d(scale, p["form"]), cond_as_3d(shift, p["form"]), 1e-6
    )
    assert out.dtype == x.dtype and out.shape == x.shape
    # upcast: computed in fp32, so only the final rounding to x's dtype differs
    torch.testing.assert_close(out, expected.to(x.dtype), **ROW_TOLERANCE[p["dtype"]])


@settings(max_examples=20, deadline=None)
@given(p=row_problems())
def test_triton_matches_reference(p: dict, kernel_device: torch.device) -> None:
    x, scale, shift = _inputs(p, kernel_device)
    out = layer_norm_scale_shift(x, scale, shift, eps=1e-5, backend="triton")
    ref = layer_norm_scale_shift(x, scale, shift, eps=1e-5, upcast=True, backend="torch")
    assert out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out, ref, **ROW_TOLERANCE[p["dtype"]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_without_upcast_stays_close(dtype: torch.dtype) -> None:
    x = make((2, 7, 48), dtype, 3) * 4
    scale, shift = make((2, 48), dtype, 4) * 0.3, make((2, 48), dtype, 5)
    out = layer_norm_scale_shift(x, scale, shift, backend="torch")
    expected = naive_layer_norm_scale_shift(x, scale[:, None], shift[:, None], 1e-6)
    tol = 1e-5 if dtype == torch.float32 else 4e-2  # bf16: rounded after norm and after scale
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_triton_multi_chunk_rows_match_reference(kernel_device: torch.device) -> None:
    """Rows wider than the single-pass limit take the three-loop path of the kernel."""
    x = make((2, 3, 70), torch.float32, 7, "strided", kernel_device)
    scale = align_conditioning("t", "scale", make((2, 70), torch.float32, 8), x.shape)
    shift = align_conditioning("t", "shift", make((70,), torch.float32, 9), x.shape)
    scale, shift = scale.to(kernel_device), shift.to(kernel_device)
    out = layer_norm_scale_shift_triton(x, scale, shift, eps=1e-6, max_single_pass_d=16)
    ref = layer_norm_scale_shift(x, scale, shift, upcast=True, backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(5, 24), (24,), (2, 2, 3, 24)])
def test_other_ranks_follow_broadcasting(shape: tuple[int, ...], kernel_device) -> None:
    x = make(shape, torch.float32, 11, device=kernel_device)
    scale = make((24,), torch.float32, 12, device=kernel_device)
    shift = make((2, 24) if len(shape) == 4 else (24,), torch.float32, 13, device=kernel_device)
    out = layer_norm_scale_shift(x, scale, shift, backend="triton")
    shift_b = shift[:, None, None] if len(shape) == 4 else shift
    expected = naive_layer_norm_scale_shift(x.cpu(), scale.cpu(), shift_b.cpu(), 1e-6)
    torch.testing.assert_close(out.cpu().double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_diffusers_ada_layer_norm_zero(backend: str, kernel_device) -> None:
    # imported here so the other kernel tests still run where diffusers is absent
    normalization = pytest.importorskip("diffusers.models.normalization")
    torch.manual_seed(0)
    norm = normalization.AdaLayerNormZero(embedding_dim=32)
    x, emb = torch.randn(2, 6, 32), torch.randn(2, 32)
    with torch.no_grad():
        expected, *_ = norm(x, emb=emb)
        mod = norm.linear(norm.silu(emb))
        shift_msa, scale_msa = mod.chunk(6, dim=1)[:2]
        out = layer_norm_scale_shift(
            x.to(kernel_device),
            scale_msa.to(kernel_device),
            shift_msa.to(kernel_device),
            eps=norm.norm.eps,
            backend=backend,
        )
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_reference_gradients_match_naive() -> None:
    x = make((2, 3, 8), torch.float64, 1).requires_grad_()
    scale = make((2, 8), torch.float64, 2).requires_grad_()
    shift = make((8,), torch.float64, 3).requires_grad_()
    out = layer_norm_scale_shift(x, scale, shift)  # backend None on CPU: reference
    grads = torch.autograd.grad(out.square().sum(), (x, scale, shift))
    expected = naive_layer_norm_scale_shift(x, scale[:, None], shift, 1e-6)
    naive_grads = torch.autograd.grad(expected.square().sum(), (x, scale, shift))
    for got, want in zip(grads, naive_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("scale_shape", "fragment"),
    [((3, 16), "scale of shape (3, 16) does not broadcast"), ((2, 5, 16), "(2, 4, 16)")],
)
def test_bad_conditioning_shape_raises(scale_shape: tuple[int, ...], fragment: str) -> None:
    x = torch.zeros(2, 4, 16)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        layer_norm_scale_shift(x, torch.zeros(scale_shape), torch.zeros(16))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"eps": 0.0}, "eps must be a positive finite float"), ({"eps": True}, "got True"),
     ({"backend": "cuda"}, "unknown backend")],
)  # fmt: skip
def test_bad_options_raise(kwargs: dict, fragment: str) -> None:
    x = torch.zeros(2, 4, 16)
    with pytest.raises(ConfigError, match=fragment):
        layer_norm_scale_shift(x, torch.zeros(16), torch.zeros(16), **kwargs)
