"""Measurements that need a fresh process: cold start and peak host RSS (run as subprocesses).

`python -m bench.runtime.child cold PROFILE DEPTH DIM [plain]` and
`python -m bench.runtime.child rss PROFILE CHECKPOINT DEPTH DIM [plain]` print one JSON line.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    # VmHWM belongs to this process image; ru_maxrss would carry over the parent's peak
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def cold(profile: str, depth: int, dim: int, plain: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    if not plain:
        from flextensor_runtime import offload_from_profile
    t2 = time.perf_counter()
    from bench.runtime.models import stack

    model = stack(depth, dim)
    x = torch.randn(1, dim)
    t3 = time.perf_counter()
    if not plain:
        offload_from_profile(model, profile, device="cpu")
    t4 = time.perf_counter()
    with torch.inference_mode():
        model(x)
    t5 = time.perf_counter()
    with torch.inference_mode():
        model(x)
    t6 = time.perf_counter()
    return {"import_torch_s": t1 - t0, "import_ft_s": t2 - t1, "install_s": t4 - t3,
            "first_forward_s": t5 - t4, "second_forward_s": t6 - t5}  # fmt: skip


def rss(profile: str, checkpoint: str, depth: int, dim: int, plain: bool) -> dict[str, float]:
    import torch
    from safetensors.torch import load_file

    from bench.runtime.models import stack
    from flextensor_runtime import offload_from_profile

    base = _rss_bytes()
    if plain:
        model = stack(depth, dim)
        model.load_state_dict(load_file(checkpoint))
    else:
        with torch.device("meta"):
            model = stack(depth, dim)
        offload_from_profile(model, profile, device="cpu", checkpoint=checkpoint)
    with torch.inference_mode():
        model(torch.randn(1, dim))
    peak = _peak_rss_bytes()
    return {"base_bytes": base, "peak_bytes": peak, "added_bytes": peak - base}


if __name__ == "__main__":
    kind, args = sys.argv[1], sys.argv[2:]
    plain = args[-1] == "plain"
    if kind == "cold":
        out = cold(args[0], int(args[1]), int(args[2]), plain)
    else:
        out = rss(args[0], args[1], int(args[2]), int(args[3]), plain)
    print(json.dumps(out))
