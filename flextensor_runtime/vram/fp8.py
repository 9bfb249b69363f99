"""FP8 matrix multiplication with row-wise scales for wrapped Linear layers.

Owns: row-wise quantisation of activations and weights to a float8 dtype, the `torch._scaled_mm`
path, the dequantise path (the same quantised values multiplied in higher precision) used where
the device has no FP8 matmul, and the capability check choosing between them.
Must not know: wrappers, placements or LoRA.
"""

from __future__ import annotations

import functools

import torch

from flextensor_runtime.errors import ConfigError

__all__ = [
    "FP8_BACKENDS",
    "FP8_DTYPES",
    "fp8_matmul",
    "fp8_max",
    "is_float8",
    "quantize_rowwise",
    "scaled_mm_out_dtype",
    "scaled_mm_supported",
]

FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
FP8_BACKENDS = ("auto", "scaled_mm", "dequantize")
_SCALE_FLOOR = 1e-12


def is_float8(dtype: torch.dtype | None) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of `dtype` (e4m3fnuz: half of e4m3fn's, baked in here)."""
    return float(torch.finfo(dtype).max)


def quantize_rowwise(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (q [R, K] in `dtype`, scale [R, 1] float32) with x ≈ q * scale per row."""
    amax = x.detach().abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / fp8_max(dtype)).clamp(min=_SCALE_FLOOR)  # [R, 1]
    q = (x.float() / scale).clamp(-fp8_max(dtype), fp8_max(dtype)).to(dtype)
    return q, scale


@functools.cache
def _probe_scaled_mm(device_type: str, device_index: int, dtype: torch.dtype) -> torch.dtype | None:
    """The output dtype row-wise `_scaled_mm` accepts on this device (float32 preferred;
    some CUDA builds accept only bfloat16), or None when it does not run."""
    device = torch.device(device_type, device_index) if device_index >= 0 else device_type
    a = torch.ones(16, 16, device=device).to(dtype)
    one = torch.ones(16, 1, device=device)
    for out_dtype in (torch.float32, torch.bfloat16):
        try:
            torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one.t(), out_dtype=out_dtype)
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        return out_dtype
    return None


def scaled_mm_out_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """Output dtype of `torch._scaled_mm` with row-wise scales on `device`; None if unsupported."""
    if device.type == "cuda" and (
        not torch.cuda.is_available() or torch.cuda.get_device_capability(device) < (8, 9)
    ):
        return None
    index = -1 if device.index is None else device.index
    return _probe_scaled_mm(device.type, index, dtype)


def scaled_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch._scaled_mm` with row-wise scales runs on `device` for `dtype`."""
    return scaled_mm_out_dtype(device, dtype) is not None


def _use_scaled_mm(backend: str, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    if backend != "auto":
        return backend == "scaled_mm"
    if x.device.type == "cuda" and (x.shape[-1] % 16 or weight.shape[0] % 16):
        return False  # CUDA FP8 GEMMs need K and N to be multiples of 16
    return scaled_mm_supported(x.device, dtype)


def fp8_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    backend: str = "auto",
) -> torch.Tensor:
    """x [..., K] · weight[N, K]ᵀ (+ bias) computed from row-wise scaled `dtype` operands.

    The activation is quantised per row; the weight per output row unless it is already in a
    float8 dtype (then its scale is 1, the stored values being the weights). The result has x's
    dtype. `backend`: "scaled_mm", "dequantize", or "auto" (scaled_mm where the device runs it
    and, on CUDA, K and N are multiples of 16; the dequantise path otherwise).
    """
    if backend not in FP8_BACKENDS:
        raise ConfigError(f"invalid fp8_backend {backend!r}: use one of {FP8_BACKENDS}")
    out_dtype = x.dtype if x.is_floating_point() and not is_float8(x.dtype) else torch.float32
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    xq, scale_a = quantize_rowwise(x2, dtype)  # [M, K], [M, 1]
    if is_float8(weight.dtype):
        wq = weight if weight.dtype == dtype else weight.float().to(dtype)
        scale_b = torch.ones(weight.shape[0], 1, device=weight.device)  # [N, 1]
    else:
        wq, scale_b = quantize_rowwise(weight, dtype)
    if _use_scaled_mm(backend, x, weight, dtype):
        mm_dtype = scaled_mm_out_dtype(x.device, dtype) or torch.float32
        # the GEMM takes mat1 row-major and mat2 column-major: a strided activation or weight
        # (quantising keeps the input's strides) is laid out so first
        out = torch._scaled_mm(
            xq.contiguous(),
            wq.contiguous().t(),
            scale_a=scale_a,
            scale_b=scale_b.t(),
            out_dtype=mm_dtype,
        ).float()  # [M, N]
    else:
        out = (xq.float() * scale_a) @ (wq.float() * scale_b).t()  # [M, N]
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])
