"""The three transfer modes: how a transfer's bytes reach the device and how its tensors see them.

Owns: `allocation_block_transfer` (blocks allocated once; streamed tensors are permanent typed
views into their block; one packed copy per transfer), `raw_block_transfer` (byte blocks; the
typed views are made at each trap entry and dropped at exit; one packed copy per transfer; no
tensors shared between traps), and `strategy` (per-tensor copies into memory allocated per use
and freed after the last reader). Each mode yields the copy, bind, unbind and free callables
the `Runtime` drives.
Must not know: profiles on disk, models beyond the tensor refs, the trap state machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flextensor_runtime.backend import DeviceBackend
from flextensor_runtime.bind import TensorRef
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.schedule import Tables
from flextensor_runtime.views import placeholder, typed_view

__all__ = ["TRANSFER_MODES", "ModeHooks", "StreamedTensor", "make_mode"]

TRANSFER_MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")


@dataclass(frozen=True)
class StreamedTensor:
    """A streamed tensor of one transfer: offset inside the transfer, its refs, host view."""

    rel_offset: int
    entry: Any  # TensorEntry
    refs: tuple[TensorRef, ...]
    host: torch.Tensor  # typed view into the transfer's host buffer


@dataclass
class ModeHooks:
    copy_fns: list[Callable[[list[Any], Any], None]]
    bind_fn: Callable[[int], None] | None
    unbind_fn: Callable[[int], None] | None
    free_fn: Callable[[int], None] | None
    binds_at_install: bool  # streamed tensors become permanent views of their block at install


def check_mode(mode: str) -> None:
    if mode not in TRANSFER_MODES:
        raise ConfigError(
            f"transfer mode {mode!r} is not one of {', '.join(TRANSFER_MODES)}; recompile the "
            "profile with a supported --transfer-mode"
        )


def _block_copies(backend: DeviceBackend, regions: Sequence[torch.Tensor],
                  hosts: Sequence[torch.Tensor]) -> list[Callable[[list[Any], Any], None]]:  # fmt: skip
    return [backend.make_copy(regions[k], hosts[k]) for k in range(len(regions))]


def _rebinders(
    device: torch.device, streamed: Sequence[Sequence[StreamedTensor]],
    source: Callable[[int, int, StreamedTensor], torch.Tensor],
) -> tuple[Callable[[int], None], Callable[[int], None]]:  # fmt: skip
    holders = [[placeholder(s.entry, device) for s in group] for group in streamed]

    def bind(k: int) -> None:
        for j, s in enumerate(streamed[k]):
            data = source(k, j, s)
            for ref in s.refs:
                ref.set_data(data)

    def unbind(k: int) -> None:
        for j, s in enumerate(streamed[k]):
            for ref in s.refs:
                ref.set_data(holders[k][j])

    return bind, unbind


def make_mode(mode: str, backend: DeviceBackend, tables: Tables, regions: Sequence[torch.Tensor],
              hosts: Sequence[torch.Tensor], streamed: Sequence[Sequence[StreamedTensor]]) -> ModeHooks:  # fmt: skip
    """Hooks for `mode`; `regions[k]` is transfer k's uint8 block region (block modes only)."""
    check_mode(mode)
    if mode == "allocation_block_transfer":
        return ModeHooks(_block_copies(backend, regions, hosts), None, None, None, True)
    if mode == "raw_block_transfer":
        bind, unbind = _rebinders(
            backend.device, streamed, lambda k, _j, s: typed_view(regions[k], s.rel_offset, s.entry)
        )
        return ModeHooks(_block_copies(backend, regions, hosts), bind, unbind, None, False)
    temps: list[list[torch.Tensor]] = [[] for _ in streamed]

    def free(k: int) -> None:
        if temps[k]:
            backend.uncount(sum(s.entry.bytes for s in streamed[k]))
            temps[k] = []

    def make_copy(k: int) -> Callable[[list[Any], Any], None]:
        def copy(after: list[Any], done: Any) -> None:
            free(k)
            out = []
            for s in streamed[k]:
                e = s.entry
                dev = backend.empty_for_copy(tuple(e.shape), tuple(e.stride), s.host.dtype)
                backend.copy_async(dev, s.host, after, done)
                out.append(dev)
            temps[k] = out

        return copy

    bind, unbind = _rebinders(backend.device, streamed, lambda k, j, _s: temps[k][j])
    return ModeHooks([make_copy(k) for k in range(len(streamed))], bind, unbind, free, False)
