"""Layer-wise offload with layers called in any order: repeated, out of order, and nested (a
layer that runs other layers of the stack inside its own forward). Outputs must be bit-identical
to the plain model for both `reuse_buffers` values (two reusable slots must never be
overwritten while a layer that holds one is running)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime.layerwise import LayerwiseOffloadHandle, enable_layerwise_offload_on
from flextensor_runtime.vram.copy_backend import CudaCopyBackend, ThreadCopyBackend

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def offload(model: nn.Module, device: str, reuse_buffers: bool) -> LayerwiseOffloadHandle:
    """Layer-wise offload on the CPU thread backend, or on CUDA (a side stream)."""
    backend = ThreadCopyBackend() if device == "cpu" else CudaCopyBackend(device)
    return enable_layerwise_offload_on(model, backend, reuse_buffers=reuse_buffers)


class Ordered(nn.Module):
    """Runs `layers[i]` for i in `order` (repeats and any order allowed)."""

    def __init__(self, order: list[int], depth: int = 4, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.order:
            x = torch.tanh(self.layers[i](x))
        return x


class Calls(nn.Module):
    """A layer that, after its own Linear, runs other layers of the same stack."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.inner: list[nn.Module] = []  # not registered: the stack owns them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.lin(x))
        for layer in self.inner:
            x = layer(x)
        return torch.tanh(self.lin(x))  # its own weights again, after the inner layers ran


ORDERS = [
    [0, 1, 2, 3],
    [0, 0, 1, 2, 3],
    [0, 1, 1, 2, 3],
    [0, 1, 2, 3, 3],
    [3, 2, 1, 0],
    [2, 0, 3, 1, 2, 0],
    [1, 1, 1, 0, 3, 3, 2],
    [0, 2, 0, 2, 1, 3, 1],
]


@torch.no_grad()
@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("reuse_buffers", [False, True])
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(map(str, o)))
def test_any_call_order_is_bit_identical(
    order: list[int], reuse_buffers: bool, device: str
) -> None:
    torch.manual_seed(0)
    model = Ordered(order).eval()
    plain = copy.deepcopy(model).to(device)
    x = torch.randn(4, 32, device=device)
    handle = offload(model, device, reuse_buffers)
    for _ in range(3):  # the prefetch left by one forward must serve the next one correctly
        assert torch.equal(model(x), plain(x))
    masters = [layer.weight for layer in model.layers]
    assert all(p.device.type == "cpu" for p in masters)  # the host masters are bound again
    handle.disable()
    assert torch.equal(model.to(device)(x), plain(x))


@torch.no_grad()
@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_direct_layer_calls_between_forwards(reuse_buffers: bool, device: str) -> None:
    torch.manual_seed(1)
    model = Ordered([0, 1, 2, 3]).eval()
    plain = copy.deepcopy(model).to(device)
    x = torch.randn(4, 32, device=device)
    offload(model, device, reuse_buffers)
    for index in (2, 2, 0, 3, 1):
        assert torch.equal(model.layers[index](x), plain.layers[index](x))
        assert torch.equal(model(x), plain(x))


def _nested(width: int = 16) -> nn.Module:
    """Layer 0 runs layers 1 and 2 inside its forward; layer 2 runs layer 3 inside its own.
    Up to three layers are running at once: more than the two reusable slots."""

    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Calls(width) for _ in range(5))
            self.layers[0].inner = [self.layers[1], self.layers[2]]
            self.layers[2].inner = [self.layers[3]]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for index in (0, 4, 1):
                x = self.layers[index](x)
            return x

    return Nested().eval()


@torch.no_grad()
@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_layers_running_inside_other_layers(reuse_buffers: bool, device: str) -> None:
    torch.manual_seed(2)
    model = _nested()
    plain = copy.deepcopy(model).to(device)
    x = torch.randn(3, 16, device=device)
    handle = offload(model, device, reuse_buffers)
    for _ in range(3):
        assert torch.equal(model(x), plain(x))
    window = handle._window
    assert window is not None and all(state.running == 0 for state in window.layers)
    assert all(p.device.type == "cpu" for p in model.parameters())


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_a_layer_that_calls_itself(reuse_buffers: bool) -> None:
    class Again(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
            x = torch.tanh(self.lin(x))
            return self(x, depth - 1) if depth else x

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Again() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(3)
    model = Model().eval()
    plain = copy.deepcopy(model)
    x = torch.randn(2, 8)
    handle = offload(model, "cpu", reuse_buffers)
    for _ in range(2):
        assert torch.equal(model(x), plain(x))
    report = handle.report()
    assert report.layer_runs == 2 * 3 * 3 and report.sync_materializations == 0
