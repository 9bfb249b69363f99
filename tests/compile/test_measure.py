"""Measurement: slot attribution, CPU timing, device choice, copy curves, targets, roofline."""

from __future__ import annotations

import pytest
import torch

from flextensor_compile.config import OffloadConfig
from flextensor_compile.discover import discover
from flextensor_compile.discover.hooks import Event
from flextensor_compile.discover.slots import attribute, plan_slots
from flextensor_compile.measure import (
    choose_device,
    get_target,
    measure_compute,
    roofline_ms,
)
from flextensor_compile.measure.bandwidth import measure_host_copies
from flextensor_compile.measure.targets import targets
from flextensor_compile.model_file import normalize_inputs
from flextensor_runtime.errors import ConfigError
from tests.compile import models


def _ev(kind, name="", value=0.0):
    return Event(kind, name, value)


def test_attribution_of_traps_gaps_and_back_to_back_calls():
    # iteration: 1 ms gap, A twice back to back (2 + 0.5 between + 3), 1 ms gap, B 4 ms, 2 ms tail
    events = [_ev("begin", value=0), _ev("op"), _ev("enter", "A", 1), _ev("exit", "A", 3),
              _ev("enter", "A", 3.5), _ev("exit", "A", 6.5), _ev("op"), _ev("enter", "B", 7.5),
              _ev("exit", "B", 11.5), _ev("op"), _ev("end", value=13.5)]  # fmt: skip
    plan = plan_slots(events, manual=set())
    assert plan.order == ("gap:start", "A", "gap:after:A", "B", "gap:after:B")
    assert plan.calls == {"A": 2, "B": 1} and plan.contiguous == {"A"}
    ms = attribute(events, plan)
    assert ms == {"gap:start": 1, "A": 5.5, "gap:after:A": 1, "B": 4, "gap:after:B": 2}
    assert sum(ms.values()) == 13.5  # nothing lost, nothing counted twice
    # two iterations average
    assert attribute(events + events, plan) == ms


def test_a_module_called_again_later_keeps_the_traps_after_it_in_call_order():
    # layers 0, 1, 0 (reused), 2: trap order follows first calls; a later iteration that adds
    # a conditional trap after the reuse puts it after the furthest trap seen before it
    def iteration(seq):
        out, now = [_ev("begin", value=0)], 0.0
        for name in seq:
            out += [_ev("enter", name, now), _ev("exit", name, now + 1)]
            now += 1
        return [*out, _ev("end", value=now)]

    plan = plan_slots(iteration(["l0", "l1", "l0", "l2"]), manual=set())
    assert plan.order == ("l0", "l1", "l2") and plan.calls["l0"] == 2
    both = iteration(["l0", "l1", "l0", "l2"]) + iteration(["l0", "l1", "l0", "x", "l2"])
    assert plan_slots(both, manual=set()).order == ("l0", "l1", "x", "l2")


def test_cpu_timing_is_a_median_per_slot_and_counts_forwards():
    model = models.Stack()
    inputs = normalize_inputs(models.stack_inputs())
    disc = discover(model, inputs)
    timing = measure_compute(
        model, inputs, None, disc, iters=2, warmup=1, device=torch.device("cpu")
    )
    assert model.forwards == 1 + 3 and timing.forwards == 3 and not timing.streamed
    assert set(timing.compute_ms) == set(disc.plan.order)
    assert all(timing.compute_ms[t] > 0 for t in disc.plan.traps)


def test_device_choice_rules():
    emulated = choose_device(OffloadConfig(device="cpu"), weight_bytes=1234, meta=False)
    assert emulated.spec.kind == "emulated" and emulated.spec.memory_bytes == 1234
    assert emulated.timing_source == "measured-cpu" and "emulated device" in (emulated.note or "")
    custom = choose_device(
        OffloadConfig(device="cpu", device_memory_bytes=10**9, h2d_bytes_per_s=2e10), 5, False
    )
    assert (custom.spec.memory_bytes, custom.spec.h2d_bytes_per_s, custom.note) == (
        10**9,
        2e10,
        None,
    )
    target = choose_device(OffloadConfig(target="l4"), 5, meta=True)
    assert target.measure_on is None and target.timing_source == "roofline"
    assert target.spec.name == "l4" and target.spec.memory_bytes == get_target("l4").memory_bytes
    with pytest.raises(ConfigError, match=r"weights on the meta device \(all or some.*--target"):
        choose_device(OffloadConfig(), 5, meta=True)


def test_host_copy_curve():
    curve = measure_host_copies()
    sizes = [p.bytes for p in curve.points]
    assert sizes == sorted(sizes) and len(sizes) >= 3
    assert curve.bytes_per_s == curve.points[-1].bytes_per_s > 0 and curve.latency_ms >= 0


def test_target_table_has_the_documented_gpus():
    names = {t.name for t in targets()}
    assert names >= {"rtx4090", "a100-40g", "a100-80g", "h100-pcie", "h100-sxm", "h200", "l4"}
    for t in targets():
        assert t.memory_bytes > 16 * 2**30 and 1e10 <= t.h2d_bytes_per_s <= 1e11
        assert t.peak_bf16_flops > 1e14 and t.hbm_bytes_per_s > 2e11


def test_roofline_formula():
    model = models.Stack().to("meta")
    disc = discover(model, normalize_inputs(models.stack_inputs()))
    target = get_target("h100-sxm")
    ms = roofline_ms(disc, target)
    flops, nbytes = disc.flops["layers.0"], disc.weight_bytes("layers.0")
    expected = max(flops / target.peak_bf16_flops, nbytes / target.hbm_bytes_per_s) * 1e3
    assert ms["layers.0"] == pytest.approx(expected) and ms["layers.0"] > 0


@pytest.mark.cuda
def test_cuda_timing_and_copy_curve():
    from flextensor_compile.measure.bandwidth import measure_cuda_copies

    device = torch.device("cuda")
    curve = measure_cuda_copies(device, max_bytes=1 << 24)
    assert curve.bytes_per_s > 1e9
    model = models.Stack()
    inputs = normalize_inputs(models.stack_inputs())
    disc = discover(model, inputs)
    timing = measure_compute(model, inputs, None, disc, iters=2, warmup=1, device=device)
    assert all(timing.compute_ms[t] > 0 for t in disc.plan.traps)
    assert timing.activation_peak_bytes is not None and timing.activation_peak_bytes > 0
    assert next(model.parameters()).device.type == "cpu"  # left where it was
    streamed = measure_compute(
        model, inputs, None, disc, iters=2, warmup=1, device=device, fit_bytes=1
    )
    assert streamed.streamed and all(streamed.compute_ms[t] > 0 for t in disc.plan.traps)
    assert streamed.activation_peak_bytes is None  # trap by trap: copies would count too
    assert next(model.parameters()).device.type == "cpu"


def test_traps_sharing_tensors_are_not_streamed_while_timing():
    from flextensor_compile.measure.timing import streamable_traps

    d = discover(models.CrossRead(), normalize_inputs(models.x_inputs()), include=("layers.*",))
    assert streamable_traps(d) == ("layers.1", "layers.2")  # layers.0's weight is read by layers.1
    d = discover(
        models.Stack(tie=True),
        normalize_inputs(models.stack_inputs()),
        include=("embed", "head", "layers.*"),
    )
    assert streamable_traps(d) == ("layers.0", "layers.1", "layers.2")


def test_roofline_gap_counts_the_untrapped_weights_it_reads():
    model = models.Stack().to("meta")
    disc = discover(model, normalize_inputs(models.stack_inputs()))
    tail = "gap:after:layers.2"
    assert disc.gap_tensors[tail] >= {"head.weight", "extra.0.weight"}
    assert "embed.weight" in disc.gap_tensors["gap:start"]
    head_bytes = 20 * models.DIM * 4
    assert disc.weight_bytes(tail) >= head_bytes
    target = get_target("l4")
    assert roofline_ms(disc, target)[tail] >= head_bytes / target.hbm_bytes_per_s * 1e3


def test_residence_moves_once_and_puts_the_originals_back():
    # timing's placement, here converting to float64 where a GPU would copy to the device:
    # parameters keep their objects (and storage), inner fields (weight.scale) and buffers move too, a tie
    # moves once, and restoring one module or all puts back the very tensors that were there
    from flextensor_compile.measure.residence import Residence, bytes_to_move

    class ToDouble(Residence):
        def placed(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.double()

    model = models.Stack(tie=True)
    fc1 = model.layers[0].fc1
    fc1.weight.scale = torch.full((1,), 0.5)
    model.register_buffer("gain", torch.ones(3))
    model.layers[1].register_buffer("gain", model.gain)  # one buffer object in two modules
    params = {n: (p, p.data_ptr()) for n, p in model.named_parameters()}
    scale, gain = fc1.weight.scale, model.gain
    tensors = (*model.parameters(), *model.buffers(), scale)  # each distinct tensor once
    total = sum(t.numel() * t.element_size() for t in tensors)
    assert bytes_to_move(model, torch.device("meta")) == total
    assert bytes_to_move(model, torch.device("cpu")) == 0
    residence = ToDouble(torch.device("cpu"))
    residence.move(model.layers[0])
    assert (
        fc1.weight.dtype == fc1.weight.scale.dtype == model.layers[0].scale.dtype == torch.float64
    )
    assert model.layers[1].fc1.weight.dtype == torch.float32
    residence.restore(model.layers[0])
    assert fc1.weight.data_ptr() == params["layers.0.fc1.weight"][1] and fc1.weight.scale is scale
    assert model.layers[0].scale.dtype == torch.float32
    residence.move(model)
    assert model.head.weight is model.embed.weight and model.embed.weight.dtype == torch.float64
    assert model.layers[1].gain is model.gain and model.gain.dtype == torch.float64  # moved once
    residence.restore()
    for name, p in model.named_parameters():
        assert p is params[name][0] and p.data_ptr() == params[name][1], name
    assert fc1.weight.scale is scale and model.gain is gain and model.layers[1].gain is gain


def test_copy_stretches_are_cut_from_the_time_line():
    # trap-by-trap timing copies a trap in before its entry mark and puts it back after its
    # exit mark, between pause and resume marks: no slot (gap or trap) is charged for those
    from flextensor_compile.measure.timing import _without_pauses

    events = [_ev("begin", value=0), _ev("op"), _ev("pause", "A", 1), _ev("resume", "A", 4),
              _ev("enter", "A", 4), _ev("exit", "A", 6), _ev("pause", "A", 6),
              _ev("resume", "A", 9), _ev("op"), _ev("end", value=10)]  # fmt: skip
    kept = _without_pauses(events)
    assert [e.kind for e in kept] == ["begin", "op", "enter", "exit", "op", "end"]
    plan = plan_slots(kept, manual=set())
    assert attribute(kept, plan) == {"gap:start": 1, "A": 2, "gap:after:A": 1}


def test_activation_note_asks_for_a_reserve_only_when_the_budget_lacks_one():
    from flextensor_compile.compile_notes import activation_note

    peak, memory = 3 * 2**20 + 1, 10 * 2**20
    full = OffloadConfig(max_gpu_mem_fraction=0.9)  # 9 MiB of weights + 3 MiB > 10 MiB
    (note,) = activation_note(peak, full, memory)
    assert "3 MiB" in note and "--activation-reserve 4MiB" in note  # rounded up
    assert activation_note(peak, OffloadConfig(max_gpu_mem_fraction=0.5), memory) == ()  # room
    kept = OffloadConfig(budget_bytes=9 * 2**20, activation_reserve_bytes=peak)
    assert activation_note(peak, kept, memory) == ()
    assert activation_note(peak, OffloadConfig(budget_bytes=9 * 2**20), memory) != ()
    assert activation_note(peak, OffloadConfig(), memory) == ()  # latency mode: no budget
    assert activation_note(None, full, memory) == ()  # not measured (CPU, roofline, trap by trap)
    cpu = measure_compute(models.Stack(), normalize_inputs(models.stack_inputs()), None,
                          discover(models.Stack(), normalize_inputs(models.stack_inputs())),
                          iters=1, warmup=0, device=torch.device("cpu"))  # fmt: skip
    assert cpu.activation_peak_bytes is None


def test_a_trap_copy_failing_part_way_puts_back_what_it_moved(monkeypatch):
    # trap-by-trap timing: a trap's copy-in runs out of memory after its first tensor; no exit
    # comes for a trap that never entered, so the entry itself puts the moved tensor back
    from flextensor_compile.measure import timing
    from flextensor_compile.measure.residence import Residence
    from flextensor_runtime.errors import BudgetError

    class FailsSecond(Residence):
        def placed(self, tensor: torch.Tensor) -> torch.Tensor:
            if len(self._params) > 1:  # recorded before it moves: one tensor already moved
                raise torch.cuda.OutOfMemoryError("out of memory (stand-in)")
            return tensor.clone()

    model = models.Stack()
    inputs = normalize_inputs(models.stack_inputs())
    disc = discover(model, inputs)
    storage = {n: p.data_ptr() for n, p in model.named_parameters()}
    monkeypatch.setattr(timing, "Residence", FailsSecond)
    with pytest.raises(BudgetError, match="ran out of GPU memory"):  # as the run reports it
        timing._one_iteration(model, inputs, None, disc, torch.device("cpu"), True, "model")
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == storage


def test_running_out_of_gpu_memory_is_not_blamed_on_the_inputs():
    from flextensor_compile.model_file import call_run
    from flextensor_runtime.errors import BudgetError

    class Hungry(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(BudgetError, match=r"ran out of GPU memory.*--device cpu"):
        call_run(None, Hungry(), normalize_inputs((torch.ones(1),)), "model.py")


def test_the_device_note_names_where_each_figure_comes_from():
    given = choose_device(OffloadConfig(device="cpu", h2d_bytes_per_s=24e9), 1234, False).note
    assert given is not None and "copies at 24.0 GB/s (--bandwidth)" in given
    assert "host" not in given and "pass --target, or --device-memory, to plan" in given
    memory = choose_device(OffloadConfig(device="cpu", device_memory_bytes=10**9), 5, False).note
    assert memory is not None and "(--device-memory)" in memory
    assert "(host memory copies); pass --bandwidth with the GPU's" in memory
