"""Fixtures for the VRAM wrapper tests: a fake free-memory reading and small checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import DiskMap


@dataclass
class FakeMemoryReader:
    """Reports a fixed number of used accelerator bytes, so tests can reach `vram_limit`."""

    used: int = 0

    def used_bytes(self, device: torch.device) -> int:
        return self.used


class TinyNet(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear, with a persistent and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.proj_out = nn.Linear(16, 4)
        self.register_buffer("offset", torch.linspace(-1, 1, 4))
        self.register_buffer("step", torch.tensor(0.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.norm(self.proj_in(x)))
        return self.proj_out(h) + self.offset * self.step


@pytest.fixture
def fake_reader() -> FakeMemoryReader:
    return FakeMemoryReader()


@pytest.fixture
def tiny_net() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()


@pytest.fixture
def tiny_checkpoint(tiny_net: TinyNet, tmp_path: Path) -> Path:
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_net.state_dict().items()}, str(path))
    return path


def small_block() -> nn.Sequential:
    """Linear(4, 4) -> LayerNorm(4), seeded: equal weights at every call."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).eval()


@pytest.fixture
def block_disk_map(tmp_path: Path) -> DiskMap:
    """A DiskMap over `small_block()`'s state dict saved under the prefix `blk.`."""
    path = tmp_path / "blk.safetensors"
    save_file({f"blk.{k}": v.contiguous() for k, v in small_block().state_dict().items()},
              str(path))  # fmt: skip
    return DiskMap(str(path), "cpu")
