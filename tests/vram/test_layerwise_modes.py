"""Layer-wise offload under `torch.inference_mode()`, `torch.no_grad()` and autograd, in any
mix across requests: the CPU backend's copies run on a worker thread (outside inference mode),
and a layer prefetched during one request serves the next. Outputs are bit-identical."""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch
from torch import nn

from flextensor_runtime.layerwise import enable_layerwise_offload_on
from flextensor_runtime.vram.copy_backend import CudaCopyBackend, ThreadCopyBackend

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
MODES: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
}


class Stack(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _pair(device: str) -> tuple[Stack, Stack, torch.Tensor]:
    torch.manual_seed(4)
    model = Stack().eval()
    return model, copy.deepcopy(model).to(device), torch.randn(3, 4, device=device)


def _backend(device: str) -> ThreadCopyBackend | CudaCopyBackend:
    return ThreadCopyBackend() if device == "cpu" else CudaCopyBackend(device)


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("reuse_buffers", [False, True])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_forwards_under_each_mode_are_bit_identical(
    mode: str, reuse_buffers: bool, device: str
) -> None:
    model, plain, x = _pair(device)
    handle = enable_layerwise_offload_on(model, _backend(device), reuse_buffers=reuse_buffers)
    with MODES[mode]():
        expected = plain(x)
        for _ in range(3):
            assert torch.equal(model(x), expected)
    assert handle.report().sync_materializations == 0


@pytest.mark.parametrize("device", BACKENDS)
def test_modes_mixed_across_requests(device: str) -> None:
    model, plain, x = _pair(device)
    enable_layerwise_offload_on(model, _backend(device))
    with torch.no_grad():
        expected = plain(x)
    with torch.inference_mode():
        assert torch.equal(model(x), expected)  # leaves layer 0 prefetched under inference mode
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    with torch.inference_mode():
        assert torch.equal(model(x), expected)
    inp = x.clone().requires_grad_(True)
    out = model(inp)  # autograd: the copy prefetched under inference mode is saved for backward
    assert torch.equal(out.detach(), expected)
    out.sum().backward()
    ref_inp = x.clone().requires_grad_(True)
    plain(ref_inp).sum().backward()
    assert inp.grad is not None and ref_inp.grad is not None
    assert torch.equal(inp.grad, ref_inp.grad)


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_enabled_inside_inference_mode(reuse_buffers: bool) -> None:
    model, plain, x = _pair("cpu")
    with torch.inference_mode():
        handle = enable_layerwise_offload_on(
            model, ThreadCopyBackend(), reuse_buffers=reuse_buffers
        )
        assert torch.equal(model(x), plain(x))
    with torch.no_grad():
        assert torch.equal(model(x), plain(x))
    assert not any(t.is_inference() for t in model.parameters())
    handle.disable()
    assert not any(t.is_inference() for t in model.parameters())
    with torch.no_grad():
        model.layers[0].weight.mul_(1.0)  # the user's weights stay editable outside the mode
