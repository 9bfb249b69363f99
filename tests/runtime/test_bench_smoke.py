"""The GPU benchmark's CPU smoke mode runs end to end (slow: a fresh process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_gpu_smoke() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "bench.gpu", "--smoke"], check=True, cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600).stdout  # fmt: skip
    assert "flextensor 50% budget" in out and "diffusers group offload" in out
