"""Per-trap-call overhead on CPU: plain model vs flextensor traps vs accelerate's `cpu_offload`
hooks vs diffusers group offloading (leaf and block level), same model, one process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.runtime.models import Stack, stack, stack_profile
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, offload_from_profile


@dataclass(frozen=True)
class OverheadRow:
    name: str
    forward_us: float  # median forward time
    per_call_us: float  # (forward - plain) / trap or hook calls per forward


def _median_us(fn: Callable[[], object], iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def _variants(depth: int, dim: int) -> dict[str, Callable[[], Stack]]:
    def ft(streamed: bool) -> Callable[[], Stack]:
        def make() -> Stack:
            m = stack(depth, dim)
            offload_from_profile(
                m, stack_profile(m, streamed), backend=CpuBackend(), log_events=False
            )
            return m

        return make

    def ft_split() -> Stack:
        """Two copies per trap, the second issued on the trap's own entry (ring-style plans)."""
        from tests.runtime.split_plans import on_entry, split_profile

        m = stack(depth, dim)
        order = [f"blocks.{i}" for i in range(depth)]
        copies = on_entry(m, range(depth - depth % 3), order)  # its three blocks cycle evenly
        profile = split_profile(m, order, copies, "allocation_block_transfer")
        offload_from_profile(m, profile, backend=CpuBackend(), log_events=False)
        return m

    def accelerate_hooks() -> Stack:
        from accelerate import cpu_offload

        m = stack(depth, dim)
        cpu_offload(m, execution_device=torch.device("cpu"))
        return m

    def group(kind: str) -> Callable[[], Stack]:
        def make() -> Stack:
            from diffusers.hooks import apply_group_offloading

            m = stack(depth, dim)
            extra = {"num_blocks_per_group": 1} if kind == "block_level" else {}
            apply_group_offloading(
                m, onload_device="cpu", offload_device="cpu", offload_type=kind, **extra
            )
            return m

        return make

    return {
        "plain": lambda: stack(depth, dim),
        "flextensor traps (resident)": ft(False),
        "flextensor traps (streamed, 2 blocks)": ft(True),
        "flextensor traps (2 copies/trap)": ft_split,
        "accelerate cpu_offload": accelerate_hooks,
        "diffusers group offload (leaf)": group("leaf_level"),
        "diffusers group offload (block)": group("block_level"),
    }


def measure(
    depth: int = 64, dim: int = 64, iters: int = 300, warmup: int = 30
) -> list[OverheadRow]:
    x = torch.randn(1, dim)
    reference = stack(depth, dim)(x)
    rows: list[OverheadRow] = []
    plain_us = 0.0
    for name, make in _variants(depth, dim).items():
        model = make()
        with torch.inference_mode():
            assert torch.equal(model(x), reference), f"{name} changed the output"
            us = _median_us(lambda m=model: m(x), iters, warmup)
        if name == "plain":
            plain_us = us
        rows.append(OverheadRow(name, us, (us - plain_us) / depth))
        if "flextensor" in name:
            handle(model).remove()
    return rows
