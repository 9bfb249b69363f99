"""Discovery: one real forward of the workload that finds traps, their order, and their tensors.

Owns: running `run(model, inputs)` once under the trap hooks and the read recorder (and, for
roofline estimates, torch's FlopCounterMode), on a real or a meta-device model, and assembling
the `Discovery` record: traps and gap traps in execution order with their tensors, untrapped
tensors, FLOPs per slot, and a report (unused, nested, repeated, conditional, manual,
cross-read, moved, split ties).
Must not know: clocks and timing, devices, the solver, the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flextensor_compile.discover.hooks import Event, TrapHooks
from flextensor_compile.discover.ownership import Assignment, assign_tensors
from flextensor_compile.discover.patterns import Selection, select_traps
from flextensor_compile.discover.reads import ReadRecorder
from flextensor_compile.discover.slots import (
    SlotPlan,
    attribute,
    drop_traps,
    entered_outside,
    plan_slots,
)
from flextensor_compile.model_file import Inputs, call_run, inputs_on
from flextensor_compile.stats import TensorStat
from flextensor_runtime.errors import ConfigError, ModelFileError
from flextensor_runtime.model_tensors import iter_model_tensors, model_tensor_entries
from flextensor_runtime.profile import TensorEntry

__all__ = ["Discovery", "DiscoveryReport", "discover", "is_meta_model", "to_meta_inputs"]


@dataclass(frozen=True)
class DiscoveryReport:
    """What discovery noticed, for the user (all names are module paths or tensor paths)."""

    unused: tuple[str, ...] = ()  # selected trap modules never called (kept resident)
    outside: tuple[str, ...] = ()  # of `unused`: called only outside the model's forward
    nested: tuple[str, ...] = ()  # selected modules only ever called inside another trap
    repeated: dict[str, int] = field(default_factory=dict)  # trap -> calls per iteration
    conditional: tuple[str, ...] = ()  # traps missing from some iterations (kept resident)
    manual: tuple[str, ...] = ()  # offload_block regions seen
    manual_hook: bool = False  # whether the runtime's offload_block reports to discovery
    cross_reads: dict[str, tuple[str, ...]] = field(default_factory=dict)
    moved: dict[str, str] = field(default_factory=dict)
    split_ties: tuple[str, ...] = ()
    default_include: bool = False
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Discovery:
    """Traps and gap traps in execution order, with everything the measurement step needs."""

    plan: SlotPlan
    tensors: dict[str, tuple[TensorStat, ...]]  # trap -> tensors it owns (gaps own none)
    untrapped: tuple[TensorStat, ...]
    events: tuple[Event, ...]  # top-level events of the discovery forward (FLOPs as values)
    flops: dict[str, float]  # per slot, per iteration (empty unless FLOPs were counted)
    gap_tensors: dict[str, frozenset[str]]  # gap slot -> untrapped tensors read there
    whole_run: bool  # the root forward never ran: one run() call is one iteration
    meta: bool
    selection: Selection
    report: DiscoveryReport

    def weight_bytes(self, slot: str) -> int:
        """Bytes of the distinct tensors a slot owns (tied aliases counted once); for a gap
        trap, of the untrapped tensors read during it."""
        if self.plan.kinds.get(slot) == "gap":
            names = self.gap_tensors.get(slot, frozenset())
            return sum(t.bytes for t in self.untrapped if t.name in names and t.tie is None)
        return sum(t.bytes for t in self.tensors.get(slot, ()) if t.tie is None)


def is_meta_model(model: nn.Module) -> bool:
    """True when any parameter or buffer lives on the meta device."""
    return any(t.device.type == "meta" for _, t, _ in iter_model_tensors(model))


def to_meta_inputs(inputs: Inputs) -> Inputs:
    """The same inputs with every tensor replaced by a meta tensor of equal shape and dtype."""
    return inputs_on(inputs, "meta")


def _flop_counter(enabled: bool) -> Any:
    if not enabled:
        return None
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def _record(
    model: nn.Module, inputs: Inputs, run: Callable[..., Any] | None, sel: Selection,
    source: str, count_flops: bool,
) -> tuple[TrapHooks, ReadRecorder, bool]:  # fmt: skip
    modules = dict(model.named_modules())
    counter = _flop_counter(count_flops)
    sample: Callable[[], Any] = (
        (lambda: float(counter.get_total_flops())) if counter else (lambda: 0.0)
    )
    hooks = TrapHooks(model, {p: modules[p] for p in sel.traps}, sample=sample)
    names: dict[int, str] = {}
    for name, t, _ in iter_model_tensors(model):
        names.setdefault(id(t), name)
    recorder = ReadRecorder(hooks, names)
    with torch.no_grad(), hooks.installed():
        start = sample()
        with recorder:
            if counter is not None:
                with counter:
                    call_run(run, model, inputs, source)
            else:
                call_run(run, model, inputs, source)
        end = sample()
    whole_run = not any(e.kind == "begin" for e in hooks.events)
    if whole_run:
        hooks.events[:0] = [Event("begin", "", start)]
        hooks.events.append(Event("end", "", end))
    return hooks, recorder, whole_run


def discover(
    model: nn.Module,
    inputs: Inputs,
    run: Callable[..., Any] | None = None,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    *,
    source: str = "model",
    count_flops: bool = False,
    leaves: bool = False,
    entries: list[TensorEntry] | None = None,
) -> Discovery:
    """Run the workload once and return what it showed (`leaves`: traps at the leaf
    granularity, `select_traps`). Costs exactly one `run()` call. `entries`: the model's
    tensors as built (`model_tensor_entries`), when the model runs from placed copies whose
    layout and ties differ (dense, tied only by object); default: taken from the model now."""
    meta = is_meta_model(model)
    if meta:
        inputs, count_flops = to_meta_inputs(inputs), True
    sel = select_traps(model, include, exclude, leaves)
    try:
        hooks, recorder, whole_run = _record(model, inputs, run, sel, source, count_flops)
    except ModelFileError as exc:
        raise _explain_meta(exc) if meta else exc from None
    nested = {e.name for e in hooks.events if e.kind == "nested"}
    events = drop_traps(hooks.events, nested)
    plan = plan_slots(events, hooks.manual_names)
    if not plan.traps and not sel.traps and sel.excluded_by:
        raise _excluded_all(sel)
    if not plan.traps:
        raise ModelFileError(
            f"{source}: no trap ran during the forward: {_why_no_trap(model, sel, whole_run)}"
        )
    tensors = model_tensor_entries(model) if entries is None else entries
    assignment = assign_tensors(tensors, sel, plan, dict(recorder.reads))
    report = _report(sel, plan, hooks, nested, assignment)
    return Discovery(
        plan=plan,
        tensors=assignment.by_trap,
        untrapped=assignment.untrapped,
        events=tuple(events),
        flops=attribute(events, plan) if count_flops else {},
        gap_tensors={g: frozenset(n) for g, n in recorder.gap_reads.items() if g in plan.kinds},
        whole_run=whole_run,
        meta=meta,
        selection=sel,
        report=report,
    )


def _why_no_trap(model: nn.Module, sel: Selection, whole_run: bool) -> str:
    """Why no selected module ran, and the patterns to pass instead (`whole_run`: the model's
    own forward did not run either)."""
    patterns = ", ".join(repr(p) for p in sel.include) or "none"
    if whole_run:  # no pattern can help: the workload never called the model
        return ("run(model, inputs) called neither the model's forward nor any module the "
                f"patterns ({patterns}) select; make run() call the model, e.g. "
                "`return model(*inputs)`")  # fmt: skip
    if not any(True for _ in model.named_children()):
        return ("the model has no submodules to trap (one layer); offloading streams the "
                "weights of the layers a model is built of: wrap it in a module of layers")  # fmt: skip
    containers = [p for p in sel.traps
                  if isinstance(model.get_submodule(p), (nn.ModuleList, nn.ModuleDict))]  # fmt: skip
    if containers:
        return (f"{containers[0]!r} is a {type(model.get_submodule(containers[0])).__name__}, "
                f"which is never called (its children are); pass --include "
                f"'{containers[0]}.*'")  # fmt: skip
    return (
        f"the modules the patterns ({patterns}) select never ran; pass --include patterns "
        "that name modules the forward calls"
    )


def _excluded_all(sel: Selection) -> ConfigError:
    """The exclude patterns removed every module the include patterns chose: an option error."""
    named = " ".join(f"--exclude {p!r}" for p in sel.excluded_by)
    verb = "removes" if len(sel.excluded_by) == 1 else "remove"
    chose = ", ".join(repr(p) for p in sel.include)
    source = "the default include" if sel.default else "--include"
    return ConfigError(
        f"{named} {verb} every module that {source} ({chose}) selects, so no trap is left to "
        "stream; narrow the exclude pattern, or pass --include for the modules to stream"
    )


def _explain_meta(exc: ModelFileError) -> ModelFileError:
    return ModelFileError(
        f"{str(exc).removesuffix('; fix example_inputs() or run()')}; on the meta device the "
        "workload must not read tensor values (no generate(), no .item(): let run() make one "
        "plain forward) and the model must use dtypes its kernels accept (e.g. bfloat16)"
    )


def _report(
    sel: Selection, plan: SlotPlan, hooks: TrapHooks, nested: set[str], assignment: Assignment
) -> DiscoveryReport:
    called = set(plan.traps) | nested
    unused = tuple(p for p in sel.traps if p not in called)
    outside = entered_outside(hooks.events)
    return DiscoveryReport(
        unused=unused,
        outside=tuple(p for p in unused if p in outside),
        nested=tuple(sorted(nested)),
        repeated={t: n for t, n in plan.calls.items() if n > 1},
        conditional=tuple(sorted(plan.conditional)),
        manual=tuple(sorted(hooks.manual_names)),
        manual_hook=hooks.manual_seen or _hook_available(),
        cross_reads=assignment.cross_reads,
        moved=assignment.moved,
        split_ties=assignment.split_ties,
        default_include=sel.default,
        patterns=sel.include,
    )


def _hook_available() -> bool:
    from flextensor_compile.discover.manual import manual_blocks_supported

    return manual_blocks_supported()
