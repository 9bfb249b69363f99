"""Compile every Triton kernel for sm_90 and sm_80 GPUs without needing one (run as a module).

`python -m tests.kernels.ptx_compile` must run without TRITON_INTERPRET so the kernels are real
JIT functions; Triton then lowers them to PTX and cubin for each target. This catches what the
CPU interpreter accepts but the GPU compiler rejects (dot shapes, dtypes, control flow), and
checks that no kernel needs more shared memory than a consumer GPU (sm_86/89) has per block.
"""

from __future__ import annotations

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flextensor_runtime.kernels import triton_moe, triton_rows

TARGETS = (GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32))
MAX_SHARED_BYTES = 99 * 1024  # per-block opt-in limit of sm_86 / sm_89


def compile_kernel(
    fn, pointers: dict[str, str], constexprs: dict[str, object], num_warps: int = 4
) -> None:
    scalars = {"eps": "fp32"}  # every other non-pointer argument is an int32 size or stride
    signature = {
        name: pointers.get(name) or scalars.get(name, "constexpr" if name in constexprs else "i32")
        for name in fn.arg_names
    }
    consts = {(fn.arg_names.index(name),): value for name, value in constexprs.items()}
    for target in TARGETS:
        source = ASTSource(fn=fn, signature=signature, constexprs=consts)
        kernel = triton.compile(source, target=target, options={"num_warps": num_warps})
        assert "ptx" in kernel.asm and "cubin" in kernel.asm
        shared = kernel.metadata.shared
        assert shared <= MAX_SHARED_BYTES, f"{fn.__name__} needs {shared} bytes of shared memory"
        print(fn.__name__, f"sm_{target.arch}", constexprs, f"shared={shared}", flush=True)


def main() -> int:
    if not isinstance(triton_moe._gate_up_kernel, triton.runtime.JITFunction):
        print("TRITON_INTERPRET is set; run without it", file=sys.stderr)
        return 2
    for dtype, precision, block_m in (
        ("bf16", "tf32", 64),
        ("fp32", "ieee", 16),
        ("fp16", "tf32", 32),
    ):
        act = f"*{dtype}"
        routes = {"routes_ptr": "*i64", "block_expert_ptr": "*i64"}
        blocks = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64, "DOT_PRECISION": precision}
        compile_kernel(
            triton_moe._gate_up_kernel,
            {"x_ptr": act, "wg_ptr": act, "wu_ptr": act, "h_ptr": act, **routes},
            {**blocks, "DOT_FP32": False},
        )
        compile_kernel(
            triton_moe._down_kernel,
            {"h_ptr": act, "wd_ptr": act, "rw_ptr": "*fp32", "y_ptr": "*fp32", **routes},
            {**blocks, "DOT_FP32": False},
        )
    rows = {"x_ptr": "*bf16", "scale_ptr": "*bf16", "shift_ptr": "*fp32", "out_ptr": "*bf16"}
    for block_d, single in ((4096, True), (16384, True), (4096, False)):
        constexprs = {"BLOCK_D": block_d, "SINGLE_PASS": single}
        compile_kernel(triton_rows._ln_scale_shift_kernel, rows, constexprs, num_warps=8)
    gate = {"r_ptr": "*fp16", "u_ptr": "*fp16", "g_ptr": "*fp32", "out_ptr": "*fp32"}
    compile_kernel(triton_rows._residual_gate_kernel, gate, {"BLOCK_D": 1024})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    raise SystemExit(main())
