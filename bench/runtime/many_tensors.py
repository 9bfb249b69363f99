"""`python -m bench.runtime.many_tensors [--layers L] [--experts E] [--repeats N]`: compiling
and installing a model of many small modules (a mixture of experts: each layer `E` experts of
three bias-free `Linear(16, 16)`, four of them run per layer), so the per-tensor cost of
discovery, planning and installation shows, and any cost that grows faster than the tensor
count. Prints the tensor count, the wall time of `compile_profile` (discovery, CPU timing,
solve, emit) and of `offload_from_profile` (least of `--repeats` installs on fresh copies),
and checks the first forward matches the plain model.
Must not know: how discovery, the solver or the installer work.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

from flextensor_compile.compile_api import compile_profile
from flextensor_compile.config import OffloadConfig
from flextensor_runtime import offload_from_profile

__all__ = ["main", "moe"]

_DIM = 16


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(_DIM, _DIM, bias=False)
        self.up = nn.Linear(_DIM, _DIM, bias=False)
        self.down = nn.Linear(_DIM, _DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate(x) * self.up(x))


class _MoE(nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(_Expert() for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum((e(x) for e in self.experts[:4]), torch.zeros_like(x))


def moe(layers: int, experts: int) -> nn.Module:
    """`layers` MoE layers of `experts` experts (3 weight tensors each), in eval mode."""
    torch.manual_seed(0)
    return nn.Sequential(*(_MoE(experts) for _ in range(layers))).eval()


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(prog="python -m bench.runtime.many_tensors")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    model, x = moe(args.layers, args.experts), torch.randn(2, _DIM)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    start = time.perf_counter()
    profile = compile_profile(model, (x,), OffloadConfig(budget_bytes=weights // 2))
    compiled = time.perf_counter() - start
    with torch.no_grad():
        expected = model(x)
    install, same = float("inf"), True
    for _ in range(max(1, args.repeats)):
        fresh = copy.deepcopy(model)
        start = time.perf_counter()
        offload_from_profile(fresh, profile)
        install = min(install, time.perf_counter() - start)
        with torch.no_grad():
            same = same and torch.equal(fresh(x), expected)
    tensors = sum(len(t.tensors) for t in profile.traps) + len(profile.untrapped)
    print(f"{args.layers} layers x {args.experts} experts: {tensors} tensors")
    print(f"compile_profile   {compiled:8.2f} s")
    print(f"install (least)   {install:8.2f} s ({install / tensors * 1e6:.0f} us a tensor)")
    print(f"first forward matches the plain model: {same}")
    return {"tensors": tensors, "compile_s": compiled, "install_s": install, "same": float(same)}


if __name__ == "__main__":
    main()
