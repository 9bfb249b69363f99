"""Triton kernels for the row-wise ops: LayerNorm + scale/shift, and the gated residual add.

Owns: the kernels and their launch (grid, block sizes, strides of the [B, T, D] views).
Imports triton at module import, so it is only imported lazily by `norm.py` / `gate.py`; with
TRITON_INTERPRET=1 set before that import the kernels run in Triton's CPU interpreter.
Both kernels accumulate in float32 and read inputs through strides (broadcast dims have
stride 0), so non-contiguous and broadcast inputs are never copied. Outputs are contiguous.
Kernels call only Triton builtins and jit functions of this package (no `tl.sum`/`tl.sigmoid`,
which are jit functions of triton's own library): those are interpreted only if triton itself
was imported after TRITON_INTERPRET=1, which a test process cannot always guarantee.
Must not know: argument validation or backend choice (done by the callers).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from flextensor_runtime.kernels.broadcast import as_rows3d

__all__ = ["layer_norm_scale_shift_triton", "residual_gate_add_triton"]

_MAX_SINGLE_PASS_D = 16384  # rows up to this width stay in registers (one read of x)
_LOOP_BLOCK_D = 4096
_GATE_BLOCK_D = 1024


@triton.jit
def _add(a, b):  # combine function of the row sums (see module docstring)
    return a + b


@triton.jit
def _ln_scale_shift_kernel(  # type: ignore[no-untyped-def]
    x_ptr, scale_ptr, shift_ptr, out_ptr, T, D, eps,
    sxb, sxt, sxd, ssb, sst, ssd, shb, sht, shd,
    BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # one program per row of x [B, T, D]
    b = row // T
    t = row % T
    x_row = x_ptr + b * sxb + t * sxt
    sc_row = scale_ptr + b * ssb + t * sst
    sh_row = shift_ptr + b * shb + t * sht
    out_row = out_ptr + row * D
    if SINGLE_PASS:
        offs = tl.arange(0, BLOCK_D)
        mask = offs < D
        x = tl.load(x_row + offs * sxd, mask=mask, other=0.0).to(tl.float32)
        mean = tl.reduce(x, 0, _add) / D
        diff = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.reduce(diff * diff, 0, _add) / D + eps)
        sc = tl.load(sc_row + offs * ssd, mask=mask, other=0.0).to(tl.float32)
        sh = tl.load(sh_row + offs * shd, mask=mask, other=0.0).to(tl.float32)
        y = diff * rstd * (1.0 + sc) + sh
        tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.full([BLOCK_D], 0.0, dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            offs = start + tl.arange(0, BLOCK_D)
            acc += tl.load(x_row + offs * sxd, mask=offs < D, other=0.0).to(tl.float32)
        mean = tl.reduce(acc, 0, _add) / D
        acc = tl.full([BLOCK_D], 0.0, dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            offs = start + tl.arange(0, BLOCK_D)
            mask = offs < D
            x = tl.load(x_row + offs * sxd, mask=mask, other=0.0).to(tl.float32)
            diff = tl.where(mask, x - mean, 0.0)
            acc += diff * diff
        rstd = tl.rsqrt(tl.reduce(acc, 0, _add) / D + eps)
        for start in range(0, D, BLOCK_D):
            offs = start + tl.arange(0, BLOCK_D)
            mask = offs < D
            x = tl.load(x_row + offs * sxd, mask=mask, other=0.0).to(tl.float32)
            sc = tl.load(sc_row + offs * ssd, mask=mask, other=0.0).to(tl.float32)
            sh = tl.load(sh_row + offs * shd, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * (1.0 + sc) + sh
            tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _residual_gate_kernel(  # type: ignore[no-untyped-def]
    r_ptr, u_ptr, g_ptr, out_ptr, T, D,
    srb, srt, srd, sub, sut, sud, sgb, sgt, sgd,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # grid: (rows of [B, T, D], column blocks of D)
    b = row // T
    t = row % T
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = offs < D
    r = tl.load(r_ptr + b * srb + t * srt + offs * srd, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + b * sub + t * sut + offs * sud, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b * sgb + t * sgt + offs * sgd, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + offs, (r + u * g).to(out_ptr.dtype.element_ty), mask=mask)


def _on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on the tensors' GPU (Triton launches on the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _launch_block_d(d: int, max_single_pass_d: int) -> tuple[int, bool]:
    if d <= max_single_pass_d:
        return max(triton.next_power_of_2(d), 16), True
    return min(_LOOP_BLOCK_D, triton.next_power_of_2(max_single_pass_d)), False


def layer_norm_scale_shift_triton(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    max_single_pass_d: int = _MAX_SINGLE_PASS_D,
) -> torch.Tensor:
    """Launch the fused LayerNorm kernel; scale/shift aligned to x. Returns x's shape/dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    x3, sc3, sh3 = (as_rows3d(t, x.shape) for t in (x, scale, shift))
    n_b, n_t, d = x3.shape
    block_d, single_pass = _launch_block_d(d, max_single_pass_d)
    num_warps = 4 if block_d <= 2048 else 8
    with _on_device(x.device):
        _ln_scale_shift_kernel[(n_b * n_t,)](
            x3, sc3, sh3, out, n_t, d, eps,
            *x3.stride(), *sc3.stride(), *sh3.stride(),
            BLOCK_D=block_d, SINGLE_PASS=single_pass, num_warps=num_warps,
        )  # fmt: skip
    return out


def residual_gate_add_triton(
    residual: torch.Tensor, update: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """Launch the gated residual kernel; update/gate broadcastable to residual (gate aligned)."""
    out_dtype = torch.promote_types(torch.promote_types(residual.dtype, update.dtype), gate.dtype)
    out = torch.empty(residual.shape, dtype=out_dtype, device=residual.device)
    if residual.numel() == 0:
        return out
    r3, u3, g3 = (as_rows3d(t, residual.shape) for t in (residual, update, gate))
    n_b, n_t, d = r3.shape
    block_d = min(_GATE_BLOCK_D, max(triton.next_power_of_2(d), 16))
    grid = (n_b * n_t, triton.cdiv(d, block_d))
    with _on_device(residual.device):
        _residual_gate_kernel[grid](
            r3, u3, g3, out, n_t, d, *r3.stride(), *u3.stride(), *g3.stride(), BLOCK_D=block_d
        )
    return out
