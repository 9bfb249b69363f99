"""Installing a bound profile on a model, transactionally, and undoing it exactly.

Owns: the order of installation (device blocks once; per transfer a host buffer filled from the
model or the checkpoint, then the originals released; resident weights moved once; traps
patched onto module forwards; the weight guard; the call guard on owners of streamed weights
without a trap of their own; the cyclic prologue issued) and an undo stack, so a failure at any
step, or `remove()`, restores parameters, forwards and devices.
Must not know: profile files, the trap state machine's internals, report formatting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from flextensor_runtime.backend import DeviceBackend
from flextensor_runtime.bind import Binding, TensorRef
from flextensor_runtime.call_guard import guard_owner_calls
from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import InstallError, ModelFileError
from flextensor_runtime.events import EventLog
from flextensor_runtime.fused_paths import call_submodules
from flextensor_runtime.lazy_load import Checkpoint
from flextensor_runtime.model_tensors import owner_path
from flextensor_runtime.profile import Profile, TensorEntry
from flextensor_runtime.schedule import Tables, build_tables
from flextensor_runtime.transfer_modes import StreamedTensor, check_mode, make_mode
from flextensor_runtime.traps import Runtime
from flextensor_runtime.views import placeholder, torch_dtype, typed_view
from flextensor_runtime.weight_guard import guard_weights

__all__ = ["Deployment", "install"]


@dataclass
class Deployment:
    """An installed profile: what runs it and what undoes it."""

    model: nn.Module
    profile: Profile
    binding: Binding
    backend: DeviceBackend
    log: EventLog | None
    runtime: Runtime | None = None
    tables: Tables | None = None
    hosts: list[torch.Tensor] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    # resident tensors that stay where they are (a `vram` section's wrappers manage them)
    leave_in_place: frozenset[str] = frozenset()
    # each streamed tensor (tied ones too) with the host view holding its true value
    host_views: list[tuple[TensorRef, torch.Tensor]] = field(default_factory=list)

    def uninstall(self) -> None:
        """Run the undo stack (last step first). Outside inference mode even when called inside
        it: the restored weights must stay normal tensors (trainable after `remove()`)."""
        with torch.inference_mode(False):
            while self.undo:
                self.undo.pop()()


def _groups(profile: Profile, binding: Binding) -> dict[str, list[TensorRef]]:
    """canonical name -> distinct refs of it and of every tensor tied to it."""
    groups: dict[str, list[TensorRef]] = {}
    for e in profile.all_tensors():
        canon = e.tie or e.name
        refs = groups.setdefault(canon, [])
        ref = binding.refs[e.name]
        if all(r is not ref for r in refs):
            refs.append(ref)
    return groups


def _source_name(
    canon: str, profile_names: dict[str, list[str]], ckpt: Checkpoint | None
) -> str | None:
    if ckpt is None:
        return None
    for name in profile_names[canon]:
        if name in ckpt:
            return name
    return None


class _Installer:
    def __init__(self, dep: Deployment, checkpoint: Checkpoint | None, mode: str) -> None:
        self.dep, self.ckpt, self.mode = dep, checkpoint, mode
        self.groups = _groups(dep.profile, dep.binding)
        self.names: dict[str, list[str]] = {}
        self.entries: dict[str, TensorEntry] = {}  # name -> entry (looked up per tensor)
        for e in dep.profile.all_tensors():
            self.names.setdefault(e.tie or e.name, []).append(e.name)
            self.entries[e.name] = e

    def check_sources(self) -> None:
        """Before any change: every meta tensor has a source, every source has the right shape."""
        if self.ckpt is not None:
            for canon in self.groups:
                src = _source_name(canon, self.names, self.ckpt)
                if src is not None:
                    self.ckpt.check_shape(src, self.entries[canon].shape)
        missing = [c for c, refs in self.groups.items()
                   if refs[0].tensor.device.type == "meta" and _source_name(c, self.names, self.ckpt) is None]  # fmt: skip
        if missing:
            more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            are = "is" if len(missing) == 1 else "are"
            raise ModelFileError(
                f"{count_of(len(missing), 'tensor')} {are} on the meta device and not in the "
                "checkpoint: "
                f"{', '.join(missing[:3])}{more}; pass checkpoint= with every weight, or build "
                "those tensors on a real device"
            )

    def fill(self, canon: str, dst: torch.Tensor) -> None:
        src = _source_name(canon, self.names, self.ckpt)
        if src is not None:
            assert self.ckpt is not None
            self.ckpt.read_into(src, dst)
        else:
            dst.copy_(self.groups[canon][0].tensor.detach())

    def _set(
        self, refs: list[TensorRef], data: torch.Tensor, restore: Callable[[], torch.Tensor]
    ) -> None:
        origin = refs[0].tensor.device
        back_to = torch.device("cpu") if origin.type == "meta" else origin
        for ref in refs:
            ref.set_data(data)

        def undo() -> None:
            restored = restore().to(back_to)
            for ref in refs:
                if not ref.replaced_by_user():  # data the user set while installed stays
                    ref.set_data(restored)

        self.dep.undo.append(undo)

    def streamed(self, tables: Tables, regions: list[torch.Tensor]) -> list[list[StreamedTensor]]:
        dep, out = self.dep, []
        for plan in tables.transfers:
            t = plan.transfer
            host = dep.backend.alloc_host(t.bytes)
            dep.hosts.append(host)
            group = []
            for e in plan.entries:
                assert e.offset is not None  # streamed entries have offsets (check_profile)
                rel = e.offset - t.offset
                view = typed_view(host, rel, e)
                self.fill(e.name, view)
                refs = self.groups[e.name]
                if self.mode == "allocation_block_transfer":
                    data = typed_view(regions[plan.index], rel, e)
                else:
                    data = placeholder(e, dep.backend.device)
                self._set(refs, data, partial(torch.Tensor.clone, view))
                group.append(StreamedTensor(rel, e, tuple(refs), view))
            out.append(group)
        return out

    def resident(self) -> None:
        backend = self.dep.backend
        for canon, refs in self.groups.items():
            e = self.entries[canon]
            if e.placement != "resident":
                continue
            current = refs[0].tensor
            if canon in self.dep.leave_in_place and current.device.type != "meta":
                continue
            if current.device.type == "meta" or _source_name(canon, self.names, self.ckpt):
                data = backend.empty_device(tuple(e.shape), tuple(e.stride), torch_dtype(e.dtype))
                self.fill(canon, data)
            else:
                data = backend.to_device(current.detach())
            nbytes = e.bytes
            self._set(refs, data, partial(_same, data))
            self.dep.undo.append(partial(backend.uncount, nbytes))


def _free_all(free: Callable[[int], None], count: int) -> None:
    for k in range(count):
        free(k)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _alloc_blocks(dep: Deployment, tables: Tables) -> list[torch.Tensor]:
    backend = dep.backend
    blocks = {}
    for b in dep.profile.blocks:
        blocks[b.id] = backend.alloc_device(b.bytes)
        dep.undo.append(partial(backend.uncount, b.bytes))
    return [
        blocks[p.transfer.block][p.transfer.offset : p.transfer.offset + p.transfer.bytes]
        for p in tables.transfers
    ]


def _patch(dep: Deployment, runtime: Runtime) -> None:
    seen: dict[int, str] = {}
    for i, trap in enumerate(dep.profile.traps):
        module = dep.binding.modules.get(trap.name)
        if module is None:
            continue
        if id(module) in seen:
            raise InstallError(
                f"traps {seen[id(module)]!r} and {trap.name!r} are the same module object; "
                "recompile the profile with one trap per module"
            )
        seen[id(module)] = trap.name
        runtime.modules[i] = module
        had = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        module.forward = _trap_forward(runtime, i, module.forward)  # type: ignore[method-assign]
        module.__dict__["_ft_offload_name"] = trap.name

        def undo(m: nn.Module = module, had: bool = had, previous: object = previous) -> None:
            del m.__dict__["forward"]
            del m.__dict__["_ft_offload_name"]
            if had:
                m.__dict__["forward"] = previous

        dep.undo.append(undo)


def _trap_forward(runtime: Runtime, i: int, original: Callable) -> Callable:
    enter, exit_ = runtime.enter, runtime.exit
    compiling = torch.compiler.is_compiling

    def forward(*args, **kwargs):
        if compiling():  # a constant to torch.compile's tracer; about 60 ns a call otherwise
            return _outside_graph(runtime, i, original, args, kwargs)
        enter(i)
        try:
            return original(*args, **kwargs)
        finally:
            exit_(i)

    forward._ft_original_forward_func = original  # type: ignore[attr-defined]
    forward.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature: the original's
    return forward


def _outside_graph(runtime: Runtime, i: int, original: Callable, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """A trap's call while `torch.compile` traces the model: its entry and exit run eagerly,
    outside the graph (a graph break each), and the module's forward is traced between them
    with its weights as the entry left them. Traced through, the strategy and raw modes'
    one-element placeholders reached inductor, which failed on their stride."""
    disable = torch.compiler.disable
    disable(runtime.enter)(i)
    try:
        return original(*args, **kwargs)
    finally:
        disable(runtime.exit)(i)


def _watch_slots(dep: Deployment, runtime: Runtime) -> None:
    """Give each trap the slots of the streamed tensors it lists (ties under their own names),
    for the check at its entry that they still hold the tensors the runtime fills."""
    model = dep.model
    for i, trap in enumerate(dep.profile.traps):
        slots, names = [], []
        for e in trap.tensors:
            if e.placement == "resident":
                continue
            tensor = dep.binding.refs[e.name].tensor
            owner = model.get_submodule(owner_path(e.name, e.kind))
            if e.kind == "inner":
                holder = vars(owner.get_parameter(e.name.split(".")[-2]))
            else:
                holder = owner._parameters if e.kind == "parameter" else owner._buffers
            slots.append((holder, e.name.rsplit(".", 1)[-1], tensor))
            names.append(e.name)
        runtime.slots[i], runtime.slot_names[i] = tuple(slots), tuple(names)


def _host_copies(profile: Profile, streamed: list[list[StreamedTensor]]) -> dict[str, torch.Tensor]:
    """Parameter / buffer name -> the host view holding its true value (tied names too)."""
    by_canon = {s.entry.name: s.host for group in streamed for s in group}
    return {e.name: by_canon[e.tie or e.name] for e in profile.all_tensors()
            if e.kind != "inner" and (e.tie or e.name) in by_canon}  # fmt: skip


def _manual_owners(dep: Deployment) -> set[int]:
    """Ids of the modules that own a streamed tensor of a manual trap (no forward loads it)."""
    model = dep.model
    return {id(model.get_submodule(owner_path(e.name, e.kind)))
            for t in dep.profile.traps if t.kind == "manual"
            for e in t.tensors if e.placement != "resident"}  # fmt: skip


def install(dep: Deployment, checkpoint: Checkpoint | None) -> None:
    """Install `dep.profile` on `dep.model`; on any failure undo every step and re-raise.
    Buffers and weights are made outside inference mode, even when called inside it."""
    with torch.inference_mode(False):
        _install(dep, checkpoint)


def _install(dep: Deployment, checkpoint: Checkpoint | None) -> None:
    mode = dep.profile.config.transfer_mode
    check_mode(mode)
    profile = dep.profile
    virtual = {i for i, t in enumerate(profile.traps)
               if t.kind == "gap" and t.name not in dep.binding.modules}  # fmt: skip
    tables = build_tables(profile, virtual)
    inst = _Installer(dep, checkpoint, mode)
    inst.check_sources()
    try:
        regions = _alloc_blocks(dep, tables) if mode != "strategy" else []
        streamed = inst.streamed(tables, regions)
        dep.host_views = [(r, s.host) for group in streamed for s in group for r in s.refs]
        dep.undo.append(dep.host_views.clear)
        inst.resident()
        hooks = make_mode(mode, dep.backend, tables, regions, dep.hosts, streamed)
        runtime = Runtime(tables, [t.name for t in profile.traps], dep.backend, hooks.copy_fns,
                          hooks.bind_fn, hooks.unbind_fn, hooks.free_fn,
                          dep.log.raw if dep.log is not None else None)  # fmt: skip
        runtime.calls = [t.calls for t in profile.traps]
        for i, trap in enumerate(profile.traps):
            params = {id(r.tensor): r.tensor for e in trap.tensors
                      for r in [dep.binding.refs[e.name]] if isinstance(r.tensor, nn.Parameter)}  # fmt: skip
            runtime.grad_tensors[i] = tuple(params.values())
        _patch(dep, runtime)
        _watch_slots(dep, runtime)
        refs = list(dep.binding.refs.values())
        hosts = _host_copies(profile, streamed)
        dep.undo.append(guard_weights(dep.model, lambda: [r.tensor for r in refs], hosts))
        trapped = {id(m) for m in dep.binding.modules.values()}
        dep.undo.append(guard_owner_calls(dep.model, profile, tables, runtime, trapped))
        dep.undo.append(call_submodules(dep.model, trapped | _manual_owners(dep)))
        dep.runtime, dep.tables = runtime, tables
        runtime.prologue()
        free = hooks.free_fn
        if free is not None:
            dep.undo.append(partial(_free_all, free, len(streamed)))
    except BaseException:
        dep.uninstall()
        dep.hosts.clear()
        raise
    finally:
        if checkpoint is not None:
            checkpoint.release_staging()
