"""The two-layer window of layer-wise offload: host masters, prefetch, bind and release.

Owns: per-layer host master copies (pinned where the backend pins; optionally packed into one
flat host tensor per dtype with two reusable device slots), prefetching the next layer while the
current one runs, binding device copies as the layer's parameters for its forward only, and the
request-local counters behind the offload report. A parameter's inner tensor fields (an FP8
`weight.scale`) are tensors of its layer like the parameter: host masters, copied with it, and
carried by the device copy bound for the forward.
Must not know: how layers are found or hooks registered (see `layerwise`), CUDA specifics
(see `copy_backend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from flextensor_runtime.errors import InferenceOnlyError
from flextensor_runtime.vram.copy_backend import CopyBackend, CopyTicket
from flextensor_runtime.vram.field_moves import carried_fields, with_fields

__all__ = ["LayerWindow", "WindowCounters"]


@dataclass
class WindowCounters:
    """Request-local execution evidence (reset between requests)."""

    forwards: int = 0
    layer_runs: int = 0
    prefetch_hits: int = 0
    async_copies: int = 0
    sync_materializations: int = 0


@dataclass
class _Layer:
    slots: list[tuple[nn.Module, str, nn.Parameter]]  # owner, local name, host master
    masters: dict[int, torch.Tensor]  # id -> master (parameters and inner fields), each once
    packed: dict[torch.dtype, list[torch.Tensor]] = field(default_factory=dict)
    flat: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # host, per dtype
    device: dict[int, torch.Tensor] | None = None  # id(master) -> device copy
    ticket: CopyTicket | None = None
    slot: int | None = None  # reusable device slot holding the packed copy (None: own memory)
    running: int = 0  # forwards of this layer in progress (a layer may call itself)


def _collect(layer: nn.Module) -> _Layer:
    slots: list[tuple[nn.Module, str, nn.Parameter]] = []
    masters: dict[int, torch.Tensor] = {}
    for owner in layer.modules():
        for local, param in owner._parameters.items():
            if param is not None:
                slots.append((owner, local, param))
                masters.setdefault(id(param), param)
                for _, inner in carried_fields(param):
                    masters.setdefault(id(inner), inner)
    return _Layer(slots, masters)


class LayerWindow:
    """Runs layers with at most two of them on the device: the current and the next."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        backend: CopyBackend,
        pin_memory: bool,
        reuse_buffers: bool,
    ) -> None:
        self.backend = backend
        self.reuse_buffers = reuse_buffers
        self.layers = [_collect(layer) for layer in layers]
        self.counters = WindowCounters()
        self.lifetime_forwards = 0
        self.pageable: list[str] = []
        self._slot_devices: list[dict[torch.dtype, torch.Tensor]] = [{}, {}]
        self._slot_owner: list[int | None] = [None, None]
        self._slot_free: list[CopyTicket | None] = [None, None]
        for index, state in enumerate(self.layers):
            self._make_masters(index, state, pin_memory)
        if reuse_buffers:
            self._allocate_slots()

    # -- set-up ---------------------------------------------------------------------------
    def _make_masters(self, index: int, state: _Layer, pin_memory: bool) -> None:
        if self.reuse_buffers:
            self._pack(state, pin_memory)  # packed masters: views of one pinned flat tensor
        packed = {id(p) for params in state.packed.values() for p in params}
        for key, master in state.masters.items():
            if key not in packed:
                host = master.data.to("cpu")
                master.data = self.backend.pin(host) if pin_memory else host
            if self.backend.is_pageable(master.data):
                shape = tuple(master.shape)
                self.pageable.append(f"layer {index}: {shape} {master.dtype}")

    def _pack(self, state: _Layer, pin_memory: bool) -> None:
        """Contiguous masters become views into one flat host tensor per dtype."""
        for master in state.masters.values():
            if type(master.data) is torch.Tensor and master.data.is_contiguous():  # no subclass
                state.packed.setdefault(master.dtype, []).append(master)
        for dtype, params in state.packed.items():
            flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device="cpu")
            flat = self.backend.pin(flat) if pin_memory else flat
            offset = 0
            for p in params:
                flat[offset : offset + p.numel()].copy_(p.data.reshape(-1))
                p.data = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            state.flat[dtype] = flat

    def _allocate_slots(self) -> None:
        sizes: dict[torch.dtype, int] = {}
        for state in self.layers:
            for dtype, flat in state.flat.items():
                sizes[dtype] = max(sizes.get(dtype, 0), flat.numel())
        for slot in self._slot_devices:
            for dtype, numel in sizes.items():
                slot[dtype] = self.backend.empty_like(
                    torch.empty(numel, dtype=dtype, device="meta")
                )

    # -- the window -----------------------------------------------------------------------
    def prefetch(self, index: int) -> None:
        """Start copying layer `index` to the device (no-op when already in flight).

        With reuse_buffers a prefetch takes a slot no running layer holds; when both slots are
        held by running layers (a layer that calls another) there is nothing to prefetch into
        and the layer is fetched when it runs.
        """
        state = self.layers[index]
        if state.ticket is None and (not state.packed or self._free_slot() is not None):
            self._fetch(index, state)

    def _fetch(self, index: int, state: _Layer) -> None:
        """Copy layer `index` to the device: into a reusable slot where one is free of running
        layers, otherwise (reuse_buffers with both slots busy) into memory of its own."""
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        device: dict[int, torch.Tensor] = {}
        packed_ids = {id(p) for params in state.packed.values() for p in params}
        after = self._claim_slot(index, state) if state.packed else None
        for dtype, params in state.packed.items():
            numel = state.flat[dtype].numel()
            if state.slot is not None:
                dst = self._slot_devices[state.slot][dtype][:numel]
            else:
                dst = self.backend.empty_like(state.flat[dtype])
            pairs.append((dst, state.flat[dtype]))
            offset = 0
            for p in params:
                device[id(p)] = dst[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        for key, master in state.masters.items():
            if key not in packed_ids:
                dst = self.backend.empty_like(master.data)
                pairs.append((dst, master.data))
                device[key] = dst
        state.device = device
        state.ticket = self.backend.copy_async(pairs, after)
        self.counters.async_copies += len(pairs)

    def _free_slot(self) -> int | None:
        """A slot to copy into: an empty one first, else one holding a prefetched layer that is
        not running (its copy is dropped); never the slot of a running layer."""
        for slot, owner in enumerate(self._slot_owner):
            if owner is None:
                return slot
        for slot, owner in enumerate(self._slot_owner):
            if owner is not None and not self.layers[owner].running:
                return slot
        return None

    def _claim_slot(self, index: int, state: _Layer) -> CopyTicket | None:
        """Take a slot for layer `index` (None when every slot is held by a running layer:
        the layer then gets device memory of its own). Returns what the copy must wait for."""
        slot = self._free_slot()
        if slot is None:
            state.slot = None
            return None
        owner = self._slot_owner[slot]
        if owner is not None:
            self.invalidate(owner)  # a prefetch that was never used gives its slot back
        self._slot_owner[slot] = index
        state.slot = slot
        return self._slot_free[slot]

    def invalidate(self, index: int) -> None:
        """Drop layer `index`'s device copy (after its copy finished); masters are unchanged.

        A running layer keeps the copy it computes with (it is released when the layer returns).
        """
        state = self.layers[index]
        if state.ticket is not None:
            state.ticket.wait()
        if not state.running:
            self._release(index, None)

    def _release(self, index: int, slot_free: CopyTicket | None) -> None:
        """Forget layer `index`'s device copy and give its slot back; the next copy into the
        slot waits for `slot_free` (the compute that read it) when given."""
        state = self.layers[index]
        if state.slot is not None and self._slot_owner[state.slot] == index:
            self._slot_owner[state.slot] = None
            if slot_free is not None:
                self._slot_free[state.slot] = slot_free
        state.ticket, state.device, state.slot = None, None, None

    def before(self, index: int) -> None:
        """Forward pre-hook: make layer `index` present and start prefetching the next one."""
        if self.reuse_buffers and torch.is_grad_enabled():
            raise InferenceOnlyError(
                "layer-wise offload with reuse_buffers=True is inference-only: run under "
                "torch.no_grad() or torch.inference_mode(), or use reuse_buffers=False"
            )
        if index == 0:
            self.counters.forwards += 1
            self.lifetime_forwards += 1
        state = self.layers[index]
        self.counters.layer_runs += 1
        if state.running:  # called from its own forward: its device copy is bound already
            state.running += 1
            self.counters.prefetch_hits += 1
            return
        if state.ticket is None:
            self._fetch(index, state)
            self.counters.sync_materializations += 1  # not prefetched: the copy is on the path
        else:
            self.counters.prefetch_hits += 1
        assert state.ticket is not None and state.device is not None
        try:
            state.ticket.wait()
        except BaseException:
            self._release(index, None)  # a failed copy is not kept for the next call
            raise
        for owner, local, master in state.slots:
            owner._parameters[local] = with_fields(state.device[id(master)], master, state.device)
        state.running = 1
        if index + 1 < len(self.layers):
            self.prefetch(index + 1)

    def after(self, index: int) -> None:
        """Forward hook (also on exceptions): when the layer's outermost call returns, rebind
        the host masters and release the device copy."""
        state = self.layers[index]
        if not state.running:  # the pre-hook failed: nothing was bound
            return
        state.running -= 1
        if state.running:
            return
        for owner, local, master in state.slots:
            owner._parameters[local] = master
        self._release(index, self.backend.compute_done())
        if index == len(self.layers) - 1:
            self.prefetch(0)  # the next request starts with a prefetched layer

    def close(self) -> None:
        """Drop every device copy; masters stay bound."""
        for index in range(len(self.layers)):
            self.invalidate(index)
