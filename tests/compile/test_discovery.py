"""Discovery on small real models: order, gaps, ties, inner fields, repeats, unused, conditional,
cross reads, meta device, manual blocks, and that it costs exactly one forward."""

from __future__ import annotations

import pytest
import torch

from flextensor_compile.discover import discover
from flextensor_compile.discover.manual import manual_blocks_supported
from flextensor_compile.model_file import normalize_inputs
from flextensor_runtime.model_tensors import model_tensor_entries
from tests.compile import models


def _discover(model, inputs, run=None, include=(), exclude=(), **kw):
    return discover(model, normalize_inputs(inputs), run, include, exclude, **kw)


def _tensors(d, trap):
    return {t.name: t for t in d.tensors[trap]}


def test_default_stack_order_gaps_and_one_forward():
    model = models.Stack()
    d = _discover(model, models.stack_inputs())
    assert model.forwards == 1  # discovery costs one forward
    assert d.plan.order == ("gap:start", "layers.0", "layers.1", "layers.2", "gap:after:layers.2")
    assert d.report.default_include and d.report.unused == ()
    assert [t.name for t in d.untrapped if t.name.startswith("head")] == ["head.weight"]
    # buffers stay resident unless a pattern names them; parameters stream
    layer0 = _tensors(d, "layers.0")
    assert not layer0["layers.0.scale"].offloadable
    assert layer0["layers.0.fc1.weight"].offloadable and layer0["layers.0.norm.bias"].offloadable


def test_every_tensor_listed_once_with_runtime_names():
    model = models.Stack(tie=True)
    d = _discover(model, models.stack_inputs())
    listed = [t.name for ts in d.tensors.values() for t in ts] + [t.name for t in d.untrapped]
    assert sorted(listed) == sorted(e.name for e in model_tensor_entries(model))


def test_tie_inside_untrapped_and_across_traps():
    model = models.Stack(tie=True)
    d = _discover(model, models.stack_inputs())
    untrapped = {t.name: t for t in d.untrapped}
    assert untrapped["head.weight"].tie == "embed.weight"
    # tie across traps: embed in its own trap, head in another -> both pinned resident
    d2 = _discover(models.Stack(tie=True), models.stack_inputs(), include=("embed", "head"))
    embed, head = _tensors(d2, "embed")["embed.weight"], _tensors(d2, "head")["head.weight"]
    assert head.tie == "embed.weight"
    assert not embed.offloadable and not head.offloadable
    assert d2.report.split_ties == ("embed.weight",) or "embed.weight" in d2.report.split_ties


def test_inner_tensor_fields_move_with_parent():
    model = models.Fp8Like()
    d = _discover(model, models.x_inputs(), include=("layers.*",))
    layer = _tensors(d, "layers.1")
    inner = layer["layers.1.weight.scale"]
    assert inner.kind == "inner" and inner.offloadable == layer["layers.1.weight"].offloadable
    # excluding the parent pins its inner field too
    d2 = _discover(models.Fp8Like(), models.x_inputs(), include=("layers.*",),
                   exclude=("layers.1.weight",))  # fmt: skip
    layer2 = _tensors(d2, "layers.1")
    assert not layer2["layers.1.weight"].offloadable
    assert not layer2["layers.1.weight.scale"].offloadable
    assert layer2["layers.1.bias"].offloadable


def test_repeated_modules():
    d = _discover(models.Shared(), models.x_inputs())
    assert d.plan.traps == ("layers.0", "layers.1", "layers.2")
    assert d.report.repeated == {"layers.0": 2, "layers.1": 2}
    assert "layers.0" in d.plan.contiguous and "layers.1" not in d.plan.contiguous
    assert _tensors(d, "layers.0")["layers.0.fc1.weight"].offloadable  # back to back: one window
    assert not _tensors(d, "layers.1")["layers.1.fc1.weight"].offloadable  # reused later
    assert _tensors(d, "layers.2")["layers.2.fc1.weight"].offloadable


class _Interleaved(torch.nn.Module):
    """One layer object at places 0 and 2 of a list, called at each place: 0, 1, 0, 3."""

    def __init__(self) -> None:
        super().__init__()
        shared = torch.nn.Linear(8, 8)
        self.layers = torch.nn.ModuleList(
            [shared, torch.nn.Linear(8, 8), shared, torch.nn.Linear(8, 8)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_object_at_two_places_is_one_trap_in_call_order_not_a_split_tie():
    d = _discover(_Interleaved(), (torch.randn(2, 8),))
    assert d.plan.traps == ("layers.0", "layers.1", "layers.3")  # layers.3 after layers.1
    assert d.report.repeated == {"layers.0": 2} and d.report.split_ties == ()
    # the names through the second place are the first place's tensors: one trap holds them
    assert {t.name for t in d.tensors["layers.0"]} >= {"layers.2.weight", "layers.2.bias"}
    assert not _tensors(d, "layers.0")["layers.0.weight"].offloadable  # called again later


def test_unused_module_reported_and_resident():
    d = _discover(models.Stack(), models.stack_inputs(), include=("layers.*", "unused"))
    assert d.report.unused == ("unused",)
    assert "unused" not in d.plan.order
    assert {t.name for t in d.untrapped} >= {"unused.weight", "unused.bias"}


def test_a_module_run_only_outside_the_forward_is_named_as_such():
    """generate() of an encoder-decoder runs the encoder itself, before the first forward: its
    modules ran, outside every iteration, so the note must not say they never ran."""
    from types import SimpleNamespace

    from flextensor_compile.compile_notes import discovery_notes

    def run(model, inputs):
        model.unused(torch.zeros(1, models.DIM))  # the workload's own call, as generate() makes
        return model(*inputs)

    d = _discover(models.Stack(), models.stack_inputs(), run=run, include=("layers.*", "unused"))
    assert d.report.unused == ("unused",) and d.report.outside == ("unused",)
    assert {t.name for t in d.untrapped} >= {"unused.weight", "unused.bias"}
    no_device = SimpleNamespace(note=None)
    notes = discovery_notes(d, no_device)  # type: ignore[arg-type]
    assert not any("never ran" in n for n in notes)
    assert notes[0].startswith("1 selected module ran only outside the model's forward")
    d = _discover(models.Stack(), models.stack_inputs(), include=("layers.*", "unused"))
    assert d.report.outside == ()
    assert discovery_notes(d, no_device)[0].startswith("1 selected module never ran")  # type: ignore[arg-type]


def test_conditional_module_kept_resident():
    model = models.Conditional()
    d = _discover(model, models.x_inputs(), run=models.run_twice)
    assert model.calls == 2 and d.plan.iterations == 2
    assert d.plan.traps == ("layers.0", "layers.2", "layers.1")
    assert d.report.conditional == ("layers.2",)
    assert not any(t.offloadable for t in d.tensors["layers.2"])
    assert all(t.offloadable for t in d.tensors["layers.1"] if t.kind == "parameter")


def test_tensor_discovery_cross_reads_and_moves():
    d = _discover(models.CrossRead(), models.x_inputs(), include=("layers.*",))
    w = _tensors(d, "layers.0")["layers.0.fc1.weight"]
    assert not w.offloadable
    assert d.report.cross_reads["layers.0.fc1.weight"] == ("layers.1",)
    assert d.report.moved == {"gate": "layers.2"}
    assert _tensors(d, "layers.2")["gate"].offloadable


def test_meta_device_discovery_counts_flops_without_data():
    model = models.Stack().to("meta")  # (torch.device("meta") init would import torch._dynamo)
    d = _discover(model, models.stack_inputs())
    assert d.meta and d.plan.traps == ("layers.0", "layers.1", "layers.2")
    # each block: fc1 (6x8 @ 8x16) + fc2 (6x16 @ 16x8) = 2 * 2*6*8*16 FLOPs
    assert d.flops["layers.1"] == 2 * 2 * 6 * 8 * 16
    assert (
        d.weight_bytes("layers.0")
        == sum(p.numel() * 4 for p in model.layers[0].parameters()) + 4 * 8
    )  # plus the `scale` buffer


def test_nested_patterns_keep_the_outermost_module():
    # a block and a module inside it both match: the block is the trap (dynamic nesting, a
    # trap called inside another trap, is covered in test_manual_blocks)
    model = models.Stack()
    d = _discover(model, models.stack_inputs(), include=("layers.0", "layers.0.fc1", "extra.0"))
    assert d.plan.traps == ("layers.0", "extra.0")


@pytest.mark.skipif(
    not manual_blocks_supported(), reason="the runtime's offload_block hook is not available"
)
def test_manual_offload_block_regions():
    from flextensor_runtime.manual import offload_block

    class Manual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(models.DIM, models.DIM)
            self.b = torch.nn.Linear(models.DIM, models.DIM)

        def forward(self, x):
            with offload_block("first"):
                x = torch.nn.functional.linear(x, self.a.weight, self.a.bias)
            with offload_block("second"):
                x = torch.nn.functional.linear(x, self.b.weight, self.b.bias)
            return x

    d = _discover(Manual(), models.x_inputs())
    assert d.plan.traps == ("first", "second")
    assert d.plan.kinds["first"] == "manual"
    assert {t.name for t in d.tensors["second"]} == {"b.weight", "b.bias"}


def test_workload_that_never_calls_the_root_forward_is_one_iteration():
    class Encoder(models.Stack):
        def encode(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return x

    model = Encoder()
    d = _discover(model, models.stack_inputs(), run=lambda m, inputs: m.encode(*inputs))
    assert d.whole_run and d.plan.iterations == 1 and model.forwards == 0
    assert d.plan.order == ("gap:start", "layers.0", "layers.1", "layers.2")


def test_weights_tied_by_storage_not_identity():
    model = models.Stack()
    model.head.weight = torch.nn.Parameter(model.embed.weight.data)  # same bytes, new object
    d = _discover(model, models.stack_inputs(), include=("embed", "head", "layers.*"))
    head = _tensors(d, "head")["head.weight"]
    assert head.tie == "embed.weight" and not head.offloadable
    assert not _tensors(d, "embed")["embed.weight"].offloadable


@pytest.mark.parametrize(
    ("build", "include", "exclude", "why"),
    [
        (
            models.Stack,
            ("layers",),
            (),
            "'layers' is a ModuleList, which is never called (its "
            "children are); pass --include 'layers.*'",
        ),
        (
            lambda: torch.nn.Linear(models.DIM, models.DIM),
            (),
            (),
            "the model has no submodules to trap",
        ),
        (models.Stack, ("unused",), (), "the modules the patterns ('unused') select never ran"),
    ],
)
def test_no_trap_ran_says_why(build, include, exclude, why):
    from flextensor_runtime.errors import ModelFileError

    model = build()
    inputs = models.stack_inputs() if isinstance(model, models.Stack) else (
        torch.ones(1, models.DIM),)  # fmt: skip
    with pytest.raises(ModelFileError, match="no trap ran during the forward") as exc:
        _discover(model, inputs, include=include, exclude=exclude)
    assert why in str(exc.value)


def test_a_run_that_never_calls_the_model_is_named_as_such():
    """`run()` returned without calling the model: the message blamed the include patterns
    (the default '?*', which the user never typed) and asked for other ones."""
    from flextensor_runtime.errors import ModelFileError

    with pytest.raises(ModelFileError, match="no trap ran during the forward") as exc:
        _discover(models.Stack(), models.stack_inputs(), run=lambda model, inputs: None)
    assert "run(model, inputs) called neither the model's forward nor any module" in str(exc.value)
    assert "make run() call the model" in str(exc.value)


@pytest.mark.parametrize(
    ("include", "exclude", "why"),
    [
        ((), ("layers.*",), "--exclude 'layers.*' removes every module that the default include "
                            "('layers.?*') selects, so no trap is left to stream"),
        (("layers.1",), ("layers.1", "head"), "--exclude 'layers.1' removes every module that "
                                              "--include ('layers.1') selects"),
        ((), ("layers.0", "layers.?"), "--exclude 'layers.0' --exclude 'layers.?' remove every "
                                       "module"),
        ((), ("class:Block",), "--exclude 'class:Block' removes every module that the default "
                               "include ('layers.?*') selects"),
    ],
)  # fmt: skip
def test_an_exclude_that_removes_every_trap_is_an_option_error(include, exclude, why):
    from flextensor_runtime.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        _discover(models.Stack(), models.stack_inputs(), include=include, exclude=exclude)
    assert why in str(exc.value) and "narrow the exclude pattern" in str(exc.value)


class _TiedInside(torch.nn.Module):
    """Layers whose two linears share one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential() for _ in range(3))
        for layer in self.layers:
            layer.add_module("a", torch.nn.Linear(8, 8))
            layer.add_module("b", torch.nn.Linear(8, 8))
            layer.b.weight = layer.a.weight

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_pinned_tensor_records_the_rule_that_pinned_it():
    d = _discover(models.Stack(), models.stack_inputs(), exclude=("*.fc2.weight",))
    layer = _tensors(d, "layers.1")
    assert (
        layer["layers.1.fc2.weight"].pin_reason == "the exclude pattern '*.fc2.weight' matches it"
    )
    assert "it is a buffer, and buffers stay resident unless an include pattern names them " \
           "(add --include 'layers.1.scale'" in layer["layers.1.scale"].pin_reason  # fmt: skip
    assert layer["layers.1.fc1.weight"].pin_reason is None  # streamable: no reason
    d2 = _discover(models.Stack(tie=True), models.stack_inputs(), include=("embed", "head"))
    head = _tensors(d2, "head")["head.weight"].pin_reason
    assert head == "it shares storage with 'embed.weight' (trap 'embed'), and tied tensors " \
                   "split over traps stay resident"  # fmt: skip
    d3 = _discover(_TiedInside(), (torch.randn(2, 8),), exclude=("layers.1.b.weight",))
    canonical = _tensors(d3, "layers.1")["layers.1.a.weight"].pin_reason
    assert canonical == ("it moves with 'layers.1.b.weight', which stays resident (the exclude "
                         "pattern 'layers.1.b.weight' matches it)")  # fmt: skip
    cross = _tensors(_discover(models.CrossRead(), models.x_inputs(), include=("layers.*",)),
                     "layers.0")["layers.0.fc1.weight"]  # fmt: skip
    assert cross.pin_reason == "it is read outside its trap 'layers.0' too (by layers.1)"
    cond = _discover(models.Conditional(), models.x_inputs(), run=models.run_twice)
    assert {t.pin_reason for t in cond.tensors["layers.2"] if t.kind == "parameter"} == {
        "its trap 'layers.2' does not run in every iteration"}  # fmt: skip
    again = _tensors(_discover(models.Shared(), models.x_inputs()), "layers.1")
    assert again["layers.1.fc1.weight"].pin_reason == (
        "its trap 'layers.1' runs 2 times per iteration with other work between"
    )


def test_a_class_exclude_pins_the_tensors_of_its_modules_inside_a_trap():
    d = _discover(models.Stack(), models.stack_inputs(), exclude=("class:LayerNorm",))
    assert d.plan.traps == ("layers.0", "layers.1", "layers.2")
    layer = _tensors(d, "layers.1")
    for name in ("layers.1.norm.weight", "layers.1.norm.bias"):
        assert not layer[name].offloadable
        assert layer[name].pin_reason == (
            "the exclude pattern 'class:LayerNorm' matches the module 'layers.1.norm' it is in"
        )
    assert layer["layers.1.fc1.weight"].offloadable


class _BlockTwice(torch.nn.Module):
    """One block object at two paths: `spare` (never called there, registered first: its
    tensors' canonical names) and inside `body`, which runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = models.Block()
        self.body = torch.nn.Sequential(self.spare, torch.nn.Linear(models.DIM, models.DIM))

    def forward(self, x):
        return self.body(x)


def test_a_class_exclude_pins_a_repeated_module_at_every_path():
    d = _discover(_BlockTwice(), models.x_inputs(), include=("body",), exclude=("class:Block",))
    assert d.plan.traps == ("body",)
    body = _tensors(d, "body")
    assert body["body.1.weight"].offloadable and body["body.1.bias"].offloadable
    pinned = {n: t for n, t in body.items() if n.startswith(("spare.", "body.0."))}
    # its 6 parameters at both paths and its buffer at `body.0` (`spare.scale` is untrapped)
    assert len(pinned) == 13 and not any(t.offloadable for t in pinned.values())
    assert pinned["spare.fc1.weight"].pin_reason == (
        "the exclude pattern 'class:Block' matches the module 'spare' it is in"
    )
    assert pinned["body.0.fc1.weight"].pin_reason == (
        "the exclude pattern 'class:Block' matches the module 'body.0' it is in"
    )
