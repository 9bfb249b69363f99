"""Manual traps through the documented observer hook (`offload_block_observer` in
flextensor_runtime.manual). `reported_block` below does exactly what the hook contract asks of
the runtime's `offload_block` while profiling observes it."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pytest
import torch
from torch import nn

from flextensor_compile.compile_api import collect_stats
from flextensor_compile.config import OffloadConfig
from flextensor_compile.discover import discover
from flextensor_compile.model_file import normalize_inputs
from tests.compile.models import DIM, Block


@pytest.fixture
def observer_var(monkeypatch) -> ContextVar:
    try:
        import flextensor_runtime.manual as manual
    except ImportError:
        manual = types.ModuleType("flextensor_runtime.manual")
        monkeypatch.setitem(sys.modules, "flextensor_runtime.manual", manual)
    var = getattr(manual, "offload_block_observer", None)
    if not isinstance(var, ContextVar):
        var = ContextVar("offload_block_observer", default=None)
        monkeypatch.setattr(manual, "offload_block_observer", var, raising=False)
    return var


@contextmanager
def reported_block(var: ContextVar, name: str) -> Iterator[None]:
    observer = var.get()
    if observer is not None:
        observer(name, True)
    try:
        yield
    finally:
        if observer is not None:
            observer(name, False)


class Manual(nn.Module):
    """Two hand-written regions around functional code, and a patched block between them."""

    def __init__(self, var: ContextVar) -> None:
        super().__init__()
        self.var = var
        self.w1 = nn.Parameter(torch.randn(DIM, DIM))
        self.w2 = nn.Parameter(torch.randn(DIM, DIM))
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with reported_block(self.var, "head_region"):
            x = torch.tanh(x @ self.w1)
        x = self.layers[0](x)
        x = self.layers[1](x)
        with reported_block(self.var, "tail_region"):
            x = x @ self.w2
            x = self.layers[1](x)  # a module trap called inside a manual region: nested
        return x


def test_manual_regions_become_traps_owning_what_they_read(observer_var):
    model = Manual(observer_var)
    d = discover(model, normalize_inputs((torch.ones(2, DIM),)), include=("layers.*",))
    assert d.plan.traps == ("head_region", "layers.0", "tail_region")
    assert d.report.nested == ("layers.1",)  # it also runs inside tail_region: no trap of its own
    assert d.plan.kinds["head_region"] == "manual" and d.report.manual == (
        "head_region",
        "tail_region",
    )
    assert [t.name for t in d.tensors["head_region"]] == ["w1"]
    assert d.tensors["head_region"][0].offloadable
    assert [t.name for t in d.tensors["tail_region"]] == ["w2"]
    # layers.1's weights are read outside traps and inside tail_region: untrapped, resident
    assert {t.name for t in d.untrapped} >= {"layers.1.fc1.weight", "layers.1.norm.bias"}


def test_manual_regions_are_timed(observer_var):
    model = Manual(observer_var)
    cfg = OffloadConfig(
        include_patterns=("layers.*",), profiling_iters=1, warmup_iters=0, device="cpu"
    )
    c = collect_stats(model, (torch.ones(2, DIM),), cfg)
    times = {t.name: t.compute_ms for t in c.stats.traps}
    assert times["head_region"] > 0 and times["tail_region"] > 0
    assert {t.name: t.kind for t in c.stats.traps}["tail_region"] == "manual"
