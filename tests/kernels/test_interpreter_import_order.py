"""The interpreter runs the kernels even when triton was imported before TRITON_INTERPRET=1.

In a shared test process another module (torch._inductor, diffusers) may import triton first;
triton's own jit library functions then stay compiled-only, so the kernels must not call them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os
    import triton.language  # first, without the interpreter flag
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from flextensor_runtime.kernels import (
        layer_norm_scale_shift, residual_gate_add, routed_swiglu_moe, routed_swiglu_moe_pytorch,
    )
    from flextensor_runtime.kernels.triton_rows import layer_norm_scale_shift_triton
    from tests.kernels.moe_problems import build_case

    x, s = torch.randn(2, 5, 40), torch.randn(2, 1, 40)
    ref = layer_norm_scale_shift(x, s, s, upcast=True, backend="torch")
    torch.testing.assert_close(layer_norm_scale_shift(x, s, s, backend="triton"), ref)
    torch.testing.assert_close(layer_norm_scale_shift_triton(x, s, s, 1e-6, 16), ref)
    torch.testing.assert_close(residual_gate_add(x, x, s, backend="triton"), x + x * s)
    case = build_case(9, 2, 3, 24, 40, torch.bfloat16)
    out = routed_swiglu_moe(*case.args(), allow_triton=True)
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*case.args()), atol=3e-2, rtol=3e-2)
    print("ok")
    """
)


def test_kernels_run_when_triton_was_imported_first() -> None:
    repo_root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=repo_root,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
