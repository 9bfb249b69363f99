"""Layer-wise CPU offload: the CUDA gate, and the window logic on the CPU thread backend."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import (
    ConfigError,
    LayerwiseOffloadHandle,
    enable_layerwise_cpu_offload,
    layerwise_offload_mutation_scope,
)
from flextensor_runtime.errors import InferenceOnlyError
from flextensor_runtime.layerwise import enable_layerwise_offload_on
from flextensor_runtime.vram.copy_backend import ThreadCopyBackend


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.lin(x)))


class Stack(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(6, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


@pytest.fixture
def stack() -> Stack:
    torch.manual_seed(8)
    return Stack().eval()


def offload(model: nn.Module, **kwargs) -> LayerwiseOffloadHandle:
    return enable_layerwise_offload_on(model, ThreadCopyBackend(), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")
def test_without_cuda_returns_a_disabled_handle_with_reason(stack) -> None:
    handle = enable_layerwise_cpu_offload(stack)
    assert (
        not handle.enabled and handle.layer_count == 0 and "CUDA is not available" in handle.reason
    )
    report = handle.report()
    assert not report.enabled and not report.effective and report.reason == handle.reason
    assert handle.disable() is False
    assert (
        stack.layers[0].lin.weight.device.type == "cpu" and not stack.layers[0]._forward_pre_hooks
    )


@pytest.mark.cuda
def test_cuda_offload_matches_and_is_effective(stack) -> None:
    x = torch.randn(2, 6)
    expected = stack(x)
    model = copy.deepcopy(stack).cuda()  # layers come back to pinned host masters
    assert not enable_layerwise_cpu_offload(copy.deepcopy(stack), device="cpu").enabled
    handle = enable_layerwise_cpu_offload(model, device="cuda", reuse_buffers=True)
    with torch.no_grad():
        out = model(x.cuda())
    torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    assert handle.report().effective and model.layers[0].lin.weight.is_pinned()
    assert (
        model.embed.weight.device.type == "cuda" and model.layers[0].lin.weight.device.type == "cpu"
    )


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_window_binds_device_copies_and_prefetches_next(stack, reuse_buffers) -> None:
    x = torch.randn(5, 6)
    expected = stack(x)
    masters = [layer.lin.weight for layer in stack.layers]
    handle = offload(stack, reuse_buffers=reuse_buffers)
    window = handle._window
    seen = []
    for index, layer in enumerate(stack.layers):

        def probe(module, args, i=index):
            nxt = window.layers[i + 1].ticket is not None if i + 1 < len(window.layers) else None
            seen.append((module.lin.weight is not masters[i], nxt))

        layer.register_forward_pre_hook(probe)
    assert torch.equal(stack(x), expected)
    assert seen == [(True, True), (True, True), (True, True), (True, None)]
    assert all(layer.lin.weight is masters[i] for i, layer in enumerate(stack.layers))
    report = handle.report()
    assert report.effective and report.layer_runs == report.prefetch_hits == 4
    assert report.sync_materializations == 0 and report.forwards == 1 == report.lifetime_forwards
    assert report.reuse_buffers is reuse_buffers
    assert window.layers[0].ticket is not None  # prefetched for the next request


@torch.no_grad()
def test_a_disabled_handle_is_not_effective_but_keeps_its_counters(stack) -> None:
    handle = offload(stack)
    stack(torch.randn(2, 6))
    assert handle.report().effective
    assert handle.disable()
    report = handle.report()
    assert not report.enabled and not report.effective and report.forwards == 1


@torch.no_grad()
def test_reset_keeps_the_prefetched_layer(stack) -> None:
    x = torch.randn(2, 6)
    handle = offload(stack)
    stack(x)
    handle.reset()
    report = handle.report()
    assert report.forwards == 0 and report.layer_runs == 0 and report.lifetime_forwards == 1
    stack(x)
    assert handle.report().effective and handle.report().sync_materializations == 0


@torch.no_grad()
def test_out_of_order_layer_is_a_synchronous_materialization(stack) -> None:
    handle = offload(stack)
    stack.layers[2](torch.randn(1, 16))
    report = handle.report()
    assert report.sync_materializations == 1 and not report.effective


@torch.no_grad()
def test_pageable_host_tensors_are_surfaced(stack) -> None:
    class PageableBackend(ThreadCopyBackend):
        """As CUDA with pin_memory=False: host masters stay pageable."""

        def is_pageable(self, tensor: torch.Tensor) -> bool:
            return True

    handle = enable_layerwise_offload_on(stack, PageableBackend(), pin_memory=False)
    stack(torch.randn(1, 6))
    report = handle.report()
    assert len(report.pageable_tensors) == 4 * 4 and not report.effective
    assert report.sync_materializations == 0


def test_disable_restores_parameters_and_double_enable(stack) -> None:
    x = torch.randn(3, 6)
    expected = stack(x)
    handle = offload(stack)
    again = offload(stack)
    assert again.enabled and again.reason == "already enabled" and again.disable() is False
    assert handle.disable() is True
    assert not handle.enabled and handle.disable() is False
    assert not any(layer._forward_pre_hooks or layer._forward_hooks for layer in stack.layers)
    assert stack.layers[1].lin.weight.device.type == "cpu"
    assert torch.equal(stack(x), expected)
    assert offload(stack).enabled  # can be enabled again after disable


@torch.no_grad()
@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_mutation_scope_edits_reach_the_next_forward(stack, reuse_buffers) -> None:
    x = torch.randn(2, 6)
    edited = copy.deepcopy(stack)
    edited.layers[0].lin.weight.mul_(2)
    expected = edited(x)
    handle = offload(stack, reuse_buffers=reuse_buffers)
    stack(x)  # layer 0 is now prefetched with the old weights
    with layerwise_offload_mutation_scope(stack):
        stack.layers[0].lin.weight.mul_(2)
    assert torch.equal(stack(x), expected)
    assert handle.report().sync_materializations == 0  # re-prefetched after the edit


def test_reuse_buffers_is_inference_only_and_forbids_shared_storage(stack) -> None:
    offload(stack, reuse_buffers=True)
    with pytest.raises(InferenceOnlyError, match="inference-only"):
        stack(torch.randn(1, 6))
    shared = Stack()
    shared.layers[1].lin.weight = shared.layers[0].lin.weight
    with pytest.raises(ConfigError, match="share a parameter"):
        offload(shared, reuse_buffers=True)


@torch.no_grad()
def test_reuse_buffers_keeps_non_contiguous_weights_per_parameter(stack) -> None:
    layer = stack.layers[0]
    layer.lin.weight = nn.Parameter(layer.lin.weight.detach().t().contiguous().t())
    assert not layer.lin.weight.is_contiguous()
    x = torch.randn(2, 6)
    expected = stack(x)
    handle = offload(stack, reuse_buffers=True)
    packed = handle._window.layers[0].packed
    assert all(p is not layer.lin.weight for params in packed.values() for p in params)
    assert torch.equal(stack(x), expected)


@torch.no_grad()
def test_layer_container_selection() -> None:
    torch.manual_seed(9)
    seq = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    spare = copy.deepcopy(seq)
    x = torch.randn(2, 4)
    expected = seq(x)
    handle = offload(seq, layer_container="1")
    assert handle.layer_count == 2 and torch.equal(seq(x), expected)
    assert (
        not offload(nn.Linear(2, 2)).enabled
        and "layer_container" in offload(nn.Linear(2, 2)).reason
    )
    with pytest.raises(ConfigError, match="not a submodule"):
        offload(spare, layer_container="missing")
    with pytest.raises(ConfigError, match="name a ModuleList or Sequential"):
        offload(nn.Sequential(nn.Linear(2, 2)), layer_container="0")


@torch.no_grad()
def test_failing_layer_still_restores_masters(stack) -> None:
    offload(stack)
    master = stack.layers[0].lin.weight
    with pytest.raises(RuntimeError):
        stack.layers[0](torch.randn(1, 5))  # wrong width
    assert stack.layers[0].lin.weight is master


def test_bad_arguments_are_config_errors_even_without_cuda() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers, self.lin = nn.ModuleList(), nn.Linear(2, 2)

    for container, message in (
        ("nope", "is not a submodule"), ("lin", "is a Linear"), ("layers", "is an empty ModuleList"),
        (3, "layer_container=3 is invalid"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            enable_layerwise_cpu_offload(Net(), layer_container=container)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="device='gpux' is not a torch device"):
        enable_layerwise_cpu_offload(Net(), device="gpux")
    with pytest.raises(ConfigError, match=r"needs a torch\.nn\.Module, got NoneType"):
        enable_layerwise_offload_on(None, ThreadCopyBackend())  # type: ignore[arg-type]


def test_mutation_scope_on_a_non_module_is_a_config_error() -> None:
    scope = layerwise_offload_mutation_scope(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="got NoneType; pass the model or layer you edit"):
        scope.__enter__()


def test_resident_ties_stay_ties_and_device_parameters_stay_put() -> None:
    # what enable_layerwise_* does outside the layer stack, to a device ("meta": no GPU here):
    # a tied embedding / head moves once (one device copy, still tied) and a parameter
    # already on the device keeps its object
    from flextensor_runtime.layerwise import _move_resident

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 16)
            self.layers = nn.ModuleList(Block(16) for _ in range(2))
            self.head = nn.Linear(16, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    meta = torch.device("meta")
    _move_resident(model, list(model.layers), meta)
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.device == meta
    assert all(p.device.type == "cpu" for p in model.layers.parameters())
    kept = model.embed.weight
    _move_resident(model, list(model.layers), meta)
    assert model.embed.weight is kept
