"""`python -m bench.kernels --smoke` runs end to end and reports every kernel and variant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_bench_smoke_reports_all_variants(tmp_path: Path) -> None:
    repo_root = Path(__file__).resolve().parents[2]
    report = tmp_path / "bench.json"
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench.kernels", "--smoke", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=repo_root,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(report.read_text())["rows"]
    seen = {(row["kernel"], row["variant"]) for row in rows}
    kernels = {"layer_norm_scale_shift", "residual_gate_add", "routed_swiglu_moe"}
    variants = {"reference", "torch.compile(eager)", "triton"}
    assert seen == {(k, v) for k in kernels for v in variants}
    for row in rows:  # every variant agrees with the reference within bf16 rounding
        assert row["time_ms"] > 0 and row["max_abs_err"] < 0.1, row
