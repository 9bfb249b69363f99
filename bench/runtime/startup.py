"""Cold start (import + install + first forward) and peak host RSS when deploying from
safetensors, each measured in fresh subprocesses so imports and page tables start cold."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.runtime.models import stack, stack_profile
from flextensor_runtime.profile import save

_ROOT = Path(__file__).resolve().parents[2]


def _child(*args: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(_ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "bench.runtime.child", *args], check=True,
                         capture_output=True, text=True, env=env, cwd=_ROOT)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_start(depth: int = 64, dim: int = 64, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Median of `repeats` fresh processes, plain model vs offloaded (all traps streamed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(save(stack_profile(stack(depth, dim), streamed=True), Path(tmp) / "p.msgpack"))
        runs = {
            "plain": [_child("cold", path, str(depth), str(dim), "plain") for _ in range(repeats)],
            "flextensor": [_child("cold", path, str(depth), str(dim)) for _ in range(repeats)],
        }
    return {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}


def peak_rss(depth: int = 16, dim: int = 2048) -> dict[str, float]:
    """Added peak RSS over the weight bytes: lazy deploy from safetensors vs load_state_dict."""
    from safetensors.torch import save_file

    model = stack(depth, dim)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.safetensors"
        save_file(model.state_dict(), str(ckpt))
        path = str(save(stack_profile(model, streamed=True, num_blocks=2), Path(tmp) / "p.msgpack"))
        del model
        lazy = _child("rss", path, str(ckpt), str(depth), str(dim))
        plain = _child("rss", path, str(ckpt), str(depth), str(dim), "plain")
    return {
        "weight_bytes": weight_bytes,
        "flextensor_ratio": lazy["added_bytes"] / weight_bytes,
        "load_state_dict_ratio": plain["added_bytes"] / weight_bytes,
    }
