"""`python -m bench.diskmap`: DiskMap read throughput vs `safe_open`, and RSS over forwards.

Throughput: a safetensors file of `--size-mb` MB (default 1024) is written to a temp folder and
read tensor by tensor into owned host memory, alternating DiskMap and `safe_open` (whose
`get_tensor` returns a lazily mapped view, so the baseline clones it: both sides make one copy).
Reads are interleaved tensor by tensor; the page cache is warm for both. RSS: a stack of Linear+LayerNorm modules on the disk tier runs
`--forwards` forwards; host RSS is sampled along the way, with DiskMap reopening its file every
`buffer_size` elements and, for comparison, never reopening.
Must not know: anything but the public DiskMap and wrapper API (no private state is read).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import psutil
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, DiskMap, enable_vram_management

TENSOR_MB = 16


def write_checkpoint(folder: Path, size_mb: int) -> Path:
    path = folder / "bench.safetensors"
    count = max(1, size_mb // TENSOR_MB)
    numel = TENSOR_MB * 2**20 // 4
    save_file({f"t{i:04d}": torch.randn(numel) for i in range(count)}, str(path))
    return path


def throughput(path: Path, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` GB/s for DiskMap and safe_open (+ clone).

    Reads are interleaved tensor by tensor, alternating which reader goes first, so both see
    the same page cache and the same load from other processes.
    """
    disk_map = DiskMap(path, "cpu")
    handle = safe_open(str(path), framework="pt", device="cpu")
    readers = (lambda name: disk_map[name], lambda name: handle.get_tensor(name).clone())
    names = list(disk_map)
    for name in names:  # warm the page cache
        readers[0](name)
    best = [float("inf"), float("inf")]
    for repeat in range(repeats):
        spent = [0.0, 0.0]
        for i, name in enumerate(names):
            for which in (0, 1) if (i + repeat) % 2 == 0 else (1, 0):
                start = time.perf_counter()
                readers[which](name)
                spent[which] += time.perf_counter() - start
        best = [min(b, s) for b, s in zip(best, spent, strict=True)]
    size_gb = path.stat().st_size / 1e9
    return size_gb / best[0], size_gb / best[1]


def build_model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width)) for _ in range(depth)]
    return nn.Sequential(*blocks).eval()


def rss_marks(forwards: int) -> list[int]:
    return sorted(m for m in {1, 10, 50, forwards} if m <= forwards)


def rss_run(folder: Path, forwards: int, buffer_size: int, width: int, depth: int) -> list[int]:
    """RSS (bytes) at the start and after each forward in `rss_marks`."""
    model = build_model(width, depth)
    path = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    config = dict(offload_device="disk", onload_device="disk", computation_dtype=torch.float32,
                  computation_device="cpu")  # fmt: skip
    wrapped = enable_vram_management(
        copy.deepcopy(model), {nn.Linear: AutoWrappedLinear, nn.LayerNorm: AutoWrappedModule},
        config, disk_map=DiskMap(path, "cpu", buffer_size=buffer_size),
    )  # fmt: skip
    del model
    x = torch.randn(8, width)
    process = psutil.Process()
    samples = [process.memory_info().rss]
    marks = set(rss_marks(forwards))
    with torch.no_grad():
        for step in range(1, forwards + 1):
            wrapped(x)
            if step in marks:
                samples.append(process.memory_info().rss)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.diskmap", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024, help="checkpoint size for reads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--forwards", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024, help="Linear width of the RSS model")
    parser.add_argument("--depth", type=int, default=8, help="layers of the RSS model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_checkpoint(folder, args.size_mb)
        disk_gbs, base_gbs = throughput(path, args.repeats)
        path.unlink()
        print(f"read throughput, {args.size_mb} MB safetensors file (warm page cache, best of "
              f"{args.repeats})")  # fmt: skip
        print(f"  {'reader':<28}{'GB/s':>8}")
        print(f"  {'safetensors safe_open':<28}{base_gbs:>8.2f}")
        print(f"  {'DiskMap':<28}{disk_gbs:>8.2f}")
        print(f"  {'ratio DiskMap / safe_open':<28}{disk_gbs / base_gbs:>8.2f}  (target >= 0.90)")
        layer_mb = args.width * args.width * 4 / 2**20
        print(f"\nhost RSS over {args.forwards} disk-offloaded forwards "
              f"({args.depth} x Linear {args.width} + LayerNorm, {args.depth * layer_mb:.0f} MB "
              "of weights)")  # fmt: skip
        header = ["start", *(f"fwd {m}" for m in rss_marks(args.forwards)), "1->last"]
        print(f"  {'DiskMap buffer_size':<24}" + "".join(f"{h:>10}" for h in header))
        for label, buffer_size in (("2 layers (reopen)", 2 * args.width**2), ("never", 10**15)):
            rss = rss_run(folder, args.forwards, buffer_size, args.width, args.depth)
            cells = [f"{r / 2**20:.0f} MB" for r in rss] + [f"{(rss[-1] - rss[1]) / 2**20:+.1f} MB"]
            print(f"  {label:<24}" + "".join(f"{c:>10}" for c in cells))


if __name__ == "__main__":
    main()
