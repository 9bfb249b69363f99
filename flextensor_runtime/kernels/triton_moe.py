"""Triton kernels for the token-routed SwiGLU MoE (grouped GEMMs over expert row blocks).

Owns: two kernels and their launch. Routes are grouped by expert into row blocks
(`moe_routing.align_routes`); then
  1. gate/up: per (row block, I tile): h = silu(x @ gate[e].T) * (x @ up[e].T)  -> [rows, I]
  2. down:    per (row block, D tile): y[route] = w[route] * (h @ down[e].T)    -> [T*K, D] fp32
and out = sum over k of y.view(T, K, D). Each route row is written once (no atomics), so the
result is deterministic. Matmuls accumulate in float32 (IEEE for float32 inputs).
Imports triton at module import; imported lazily by `moe.py`. Like `triton_rows.py`, the kernels
call no jit function of triton's own library (silu is written out), so the interpreter works
even when triton was imported before TRITON_INTERPRET=1 was set.
Must not know: argument validation or backend choice (done by the caller).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from flextensor_runtime.kernels.moe import MoeShape
from flextensor_runtime.kernels.moe_routing import RouteBlocks, align_routes, take_buffer

__all__ = ["routed_swiglu_moe_triton"]


@triton.jit
def _gate_up_kernel(  # type: ignore[no-untyped-def]
    x_ptr, wg_ptr, wu_ptr, h_ptr, routes_ptr, block_expert_ptr,
    n_experts, n_routes, top_k, n_hidden, n_inter,
    sxt, sxd, sge, sgi, sgd, sue, sui, sud,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= n_experts:
        return
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(routes_ptr + offs_m)  # [BM] route ids t * K + k
    row_ok = routes < n_routes
    token = routes // top_k
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_inter
    acc_g = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    acc_u = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    for k0 in range(0, n_hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < n_hidden
        a = tl.load(
            x_ptr + token[:, None] * sxt + offs_k[None, :] * sxd,
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        w_mask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(
            wg_ptr + expert * sge + offs_n[None, :] * sgi + offs_k[:, None] * sgd,
            mask=w_mask, other=0.0,
        )  # fmt: skip
        wu = tl.load(
            wu_ptr + expert * sue + offs_n[None, :] * sui + offs_k[:, None] * sud,
            mask=w_mask, other=0.0,
        )  # fmt: skip
        if DOT_FP32:
            a, wg, wu = a.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        acc_g = tl.dot(a, wg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, wu, acc_u, input_precision=DOT_PRECISION)
    h = acc_g * (1.0 / (1.0 + tl.exp(-acc_g))) * acc_u
    h_ptrs = h_ptr + offs_m[:, None] * n_inter + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=n_ok[None, :])


@triton.jit
def _down_kernel(  # type: ignore[no-untyped-def]
    h_ptr, wd_ptr, rw_ptr, y_ptr, routes_ptr, block_expert_ptr,
    n_experts, n_routes, top_k, n_hidden, n_inter,
    sde, sdd, sdi, srt, srk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert > n_experts:  # unused block
        return
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(routes_ptr + offs_m)
    row_ok = routes < n_routes
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_hidden
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    if expert < n_experts:  # expert == n_experts: invalid routes contribute zeros
        for k0 in range(0, n_inter, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < n_inter
            a = tl.load(
                h_ptr + offs_m[:, None] * n_inter + offs_k[None, :], mask=k_ok[None, :], other=0.0
            )
            w = tl.load(
                wd_ptr + expert * sde + offs_n[None, :] * sdd + offs_k[:, None] * sdi,
                mask=k_ok[:, None] & n_ok[None, :], other=0.0,
            )  # fmt: skip
            if DOT_FP32:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        rw_ptrs = rw_ptr + (routes // top_k) * srt + (routes % top_k) * srk
        acc = acc * tl.load(rw_ptrs, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    y_ptrs = y_ptr + routes[:, None] * n_hidden + offs_n[None, :]
    tl.store(y_ptrs, acc, mask=row_ok[:, None] & n_ok[None, :])


# True when TRITON_INTERPRET=1 was set before triton decorated the kernels (CPU interpreter)
_INTERPRETED = not isinstance(_gate_up_kernel, triton.runtime.JITFunction)


def _on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on the tensors' GPU (Triton launches on the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _tile(n: int, cap: int) -> int:
    return min(cap, max(16, triton.next_power_of_2(n)))


def _block_m(shape: MoeShape) -> int:
    routes_per_expert = shape.tokens * shape.top_k / max(shape.experts, 1)
    return 16 if routes_per_expert <= 16 else (32 if routes_per_expert <= 64 else 64)


def _launch(
    x: torch.Tensor,
    rw: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    blocks: RouteBlocks,
    shape: MoeShape,
    workspace: dict[str, torch.Tensor],
) -> torch.Tensor:
    gate_w, up_w, down_w = weights
    n_routes = shape.tokens * shape.top_k
    n_blocks = blocks.block_expert.numel()
    rows = n_blocks * blocks.block_m
    h = take_buffer(workspace, "intermediate", rows * shape.intermediate, x.dtype, x.device)
    y = take_buffer(workspace, "expert_out", n_routes * shape.hidden, torch.float32, x.device)
    # the CPU interpreter multiplies bfloat16 tiles as raw integers: feed it exact fp32 copies
    dot_fp32 = _INTERPRETED and x.dtype == torch.bfloat16
    precision = "ieee" if x.dtype == torch.float32 or dot_fp32 else "tf32"
    common = (blocks.sorted_routes, blocks.block_expert, shape.experts, n_routes, shape.top_k)
    tile_k = _tile(shape.hidden, 64)
    tile_i = _tile(shape.intermediate, 64)
    _gate_up_kernel[(n_blocks, triton.cdiv(shape.intermediate, tile_i))](
        x, gate_w, up_w, h, *common, shape.hidden, shape.intermediate,
        *x.stride(), *gate_w.stride(), *up_w.stride(),
        BLOCK_M=blocks.block_m, BLOCK_N=tile_i, BLOCK_K=tile_k, DOT_PRECISION=precision, DOT_FP32=dot_fp32,
    )  # fmt: skip
    tile_d = _tile(shape.hidden, 64)
    _down_kernel[(n_blocks, triton.cdiv(shape.hidden, tile_d))](
        h, down_w, rw, y, *common, shape.hidden, shape.intermediate,
        *down_w.stride(), *rw.stride(),
        BLOCK_M=blocks.block_m, BLOCK_N=tile_d, BLOCK_K=tile_i, DOT_PRECISION=precision, DOT_FP32=dot_fp32,
    )  # fmt: skip
    return y.view(shape.tokens, shape.top_k, shape.hidden)


def routed_swiglu_moe_triton(
    hidden_states: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shape: MoeShape,
    workspace: dict[str, torch.Tensor],
) -> torch.Tensor:
    """Run the MoE with the Triton kernels; buffers come from (and grow in) `workspace`."""
    if min(shape.tokens, shape.top_k, shape.hidden, shape.intermediate) == 0:
        return torch.zeros_like(hidden_states)
    x = hidden_states.reshape(shape.tokens, shape.hidden)  # [T, D], any strides
    blocks = align_routes(selected_experts, shape.experts, _block_m(shape), workspace)
    with _on_device(x.device):
        y = _launch(x, routing_weights, weights, blocks, shape, workspace)  # [T, K, D] fp32
    return y.sum(dim=1).to(hidden_states.dtype).reshape(hidden_states.shape)
