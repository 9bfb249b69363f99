"""`offload_from_profile` against bad input on the bundled tiny transformer and its compiled
profile: every failed installation is one-line `FlextensorError` naming the fix, and leaves the
model's parameters, devices, layouts, forwards and outputs exactly as they were."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.errors import (
    ConfigError,
    FlextensorError,
    ModelFileError,
    ProfileFormatError,
    ProfileMismatchError,
)
from flextensor_runtime.profile import Profile, fingerprint, load, save
from profiles.tiny_transformer import TinyTransformer, build_model, example_inputs
from tests.runtime.conftest import assert_same, snapshot
from tests.runtime.plans import build_profile
from tests.runtime.test_manual_replan import _drive, _Stages

ROOT = Path(__file__).parents[2]
PROFILE = ROOT / "profiles" / "tiny_transformer.f60.msgpack"
STATS = ROOT / "profiles" / "tiny_transformer.stats.json"


def _output(model: nn.Module) -> torch.Tensor | None:
    """The forward's output; None for a model changed so that it no longer runs."""
    try:
        with torch.no_grad():
            return model(*example_inputs())
    except RuntimeError:
        return None


def _same_output(model: nn.Module, expected: torch.Tensor | None) -> bool:
    after = _output(model)
    return after is None if expected is None else after is not None and torch.equal(after, expected)


def _streamed(profile: Profile) -> list[str]:
    return [e.name for e in profile.all_tensors() if e.placement == "streamed"]


def _with_entry(profile: Profile, name: str, **changes: object) -> Profile:
    """`profile` with one tensor entry changed (and the fingerprint made to match again)."""
    traps = tuple(
        replace(t, tensors=tuple(replace(e, **changes) if e.name == name else e for e in t.tensors))
        for t in profile.traps
    )
    changed = replace(profile, traps=traps)
    return replace(changed, model=fingerprint(changed.all_tensors()))


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _relaid(model: nn.Module) -> None:
    """blocks.3.up.weight keeps its values but is stored transposed (column-major)."""
    w = model.blocks[3].up.weight
    w.data = w.data.t().contiguous().t()


def _square_swapped(tmp_path: Path) -> Profile:
    """A profile claiming the square, streamed blocks.2.proj.weight is stored transposed."""
    profile = load(PROFILE)
    assert "blocks.2.proj.weight" in _streamed(profile)
    return _with_entry(profile, "blocks.2.proj.weight", stride=(1, 128))


CASES: dict[str, tuple[Callable[[Path], object], Callable[[nn.Module], None] | None, type, str]] = {
    "truncated file": (lambda d: _file(d, "t.msgpack", PROFILE.read_bytes()[:4000]), None,
                       ProfileFormatError, "truncated or damaged"),
    "random bytes": (lambda d: _file(d, "r.msgpack", bytes(range(256)) * 8), None,
                     ProfileFormatError, "not an offload profile"),
    "empty file": (lambda d: _file(d, "e.msgpack", b""), None, ProfileFormatError, "empty"),
    "a stats file": (lambda d: STATS, None, ProfileFormatError, "ftc plan STATS"),
    "an empty path": (lambda d: "", None, ConfigError, "empty"),
    "reshaped layer": (lambda d: PROFILE, lambda m: setattr(m.blocks[2], "up", nn.Linear(128, 256)),
                       ProfileMismatchError, "reshaped: blocks.2.up.bias [512]->[256]"),
    "re-typed layer": (lambda d: PROFILE, lambda m: m.blocks[1].half(), ProfileMismatchError,
                       "re-typed: blocks.1.attn_norm.bias float32->float16"),
    "transposed weight": (lambda d: PROFILE, _relaid, ProfileMismatchError,
                          "blocks.3.up.weight stride [128, 1]->[1, 512]"),
    "profile layout differs": (_square_swapped, None, ProfileMismatchError,
                               "blocks.2.proj.weight stride [1, 128]->[128, 1]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_install_leaves_the_model_unchanged(tmp_path, case) -> None:
    make_source, change_model, error, needle = CASES[case]
    model = build_model()
    if change_model is not None:
        change_model(model)
    before, output = snapshot(model), _output(model)
    with pytest.raises(error) as err:
        offload_from_profile(model, make_source(tmp_path), backend=CpuBackend())  # type: ignore[arg-type]
    message = str(err.value)
    assert isinstance(err.value, FlextensorError)
    assert "\n" not in message and needle in message, message
    assert_same(model, before)
    assert _same_output(model, output)


def test_a_relaid_weight_message_names_the_fix() -> None:
    model = build_model()
    _relaid(model)
    with pytest.raises(ProfileMismatchError, match=r"recompile .*`p.data = p.data.contiguous\(\)`"):
        offload_from_profile(model, PROFILE, backend=CpuBackend())


def test_install_twice_and_remove_twice() -> None:
    model = build_model()
    before, output = snapshot(model), _output(model)
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    h = handle(model)
    with pytest.raises(ConfigError, match="already has an offload profile installed"):
        offload_from_profile(model, PROFILE, backend=CpuBackend())
    assert handle(model) is h and _same_output(model, output)  # the first still runs
    h.remove()
    h.remove()  # a second removal is a no-op
    assert_same(model, before)
    assert output is not None and _same_output(model, output)
    with pytest.raises(ConfigError, match="no offload profile installed"):
        handle(model)


def test_a_profile_saved_with_swapped_layout_round_trips_to_the_same_refusal(tmp_path) -> None:
    """The layout check happens on the file path too (not only on a Profile object)."""
    path = save(_square_swapped(tmp_path), tmp_path / "p.msgpack")
    model = build_model()
    before = snapshot(model)
    with pytest.raises(ProfileMismatchError, match=r"blocks\.2\.proj\.weight"):
        offload_from_profile(model, path, backend=CpuBackend())
    assert_same(model, before)


def test_a_device_as_checkpoint_is_named_as_such() -> None:
    model = build_model()
    before = snapshot(model)
    with pytest.raises(ModelFileError, match=r"checkpoint /dev/zero is not a regular file"):
        offload_from_profile(model, PROFILE, backend=CpuBackend(), checkpoint="/dev/zero")
    assert_same(model, before)


def _other_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    return TinyTransformer().state_dict()


@pytest.mark.parametrize("target", ["model", "blocks.0"])
def test_load_state_dict_on_an_installed_model_is_refused(target) -> None:
    """Streamed weights are copied from host buffers taken at install: a load would have been
    silently lost (forwards and remove() used the old values)."""
    model = build_model()
    before, output = snapshot(model), _output(model)
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    module = model if target == "model" else model.get_submodule(target)
    weights = _other_weights()
    if target != "model":
        weights = {
            k.removeprefix(f"{target}."): v
            for k, v in weights.items()
            if k.startswith(f"{target}.")
        }
    with pytest.raises(ConfigError, match=r"load_state_dict .* handle\(model\)\.remove\(\)"):
        module.load_state_dict(weights)
    assert _same_output(model, output)
    handle(model).remove()
    assert_same(model, before)
    module.load_state_dict(weights)  # allowed again once removed


@pytest.mark.parametrize("convert", ["half", "double", "blocks.1.half"])
def test_a_dtype_change_on_an_installed_model_is_refused(convert) -> None:
    """`.half()` used to leave streamed weights as frozen copies of whatever the memory block
    held, and remove() brought float32 back."""
    model = build_model()
    before, output = snapshot(model), _output(model)
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    path, _, method = convert.rpartition(".")
    module = model.get_submodule(path)
    with pytest.raises(ConfigError, match=r"\.to\(\), \.half\(\).* handle\(model\)\.remove\(\)"):
        getattr(module, method)()
    assert _same_output(model, output)
    model.to("cpu")  # a conversion that changes nothing is allowed
    model.float()
    assert _same_output(model, output)
    handle(model).remove()
    assert_same(model, before)


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_a_manual_trap_left_out_is_an_error_not_wrong_output(mode) -> None:
    """Code that forgets `with offload_block(name)` used to read whatever the memory block held
    (silently wrong outputs in every transfer mode)."""
    torch.manual_seed(0)
    model, x = _Stages().eval(), torch.randn(5, 24)
    plain = _drive(model, x, manual=False)
    stages = {"stage_a": ["l0", "l1"], "stage_b": ["l2"], "stage_c": ["l3"]}
    profile = build_profile(model, list(stages), manual=stages, num_blocks=3, prefetch=1, mode=mode)
    before = snapshot(model)
    offload_from_profile(model, profile, backend=CpuBackend())
    with pytest.raises(ConfigError, match=r"'l0' ran outside offload_block\('stage_a'\).*wrap"):
        _drive(model, x, manual=False)
    for _ in range(2):  # the refused call left the schedule intact
        assert torch.equal(_drive(model, x, manual=True), plain)
    handle(model).remove()
    assert_same(model, before)
    assert torch.equal(_drive(model, x, manual=False), plain)  # plain again once removed


@pytest.mark.parametrize("remove_inside", [True, False])
def test_install_and_remove_under_inference_mode_leave_normal_tensors(remove_inside) -> None:
    """Installing or removing inside `torch.inference_mode()` used to turn the streamed weights
    into inference tensors for good: after remove() the model could no longer be trained."""
    model = build_model()
    before, output = snapshot(model), _output(model)
    with torch.inference_mode():
        offload_from_profile(model, PROFILE, backend=CpuBackend())
        assert torch.equal(model(*example_inputs()), output)
        if remove_inside:
            handle(model).remove()
    if not remove_inside:
        handle(model).remove()
    assert_same(model, before)
    assert not any(t.is_inference() for t in [*model.parameters(), *model.buffers()])
    model.train()
    model(*example_inputs()).sum().backward()  # trainable again, as before install
    assert model.blocks[0].up.weight.grad is not None


def test_state_dict_of_a_deployed_model_has_the_true_weights(tmp_path) -> None:
    """Streamed weights are views into memory blocks; state_dict() used to return whatever a
    block held, so `torch.save(model.state_dict())` of a deployed model saved wrong weights."""
    model = build_model()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    for when in ("after install", "after a forward"):
        state = model.state_dict()
        assert state.keys() == expected.keys()
        wrong = [k for k, v in expected.items() if not torch.equal(state[k], v)]
        assert wrong == [], f"{when}: {wrong[:3]}"
        _output(model)
    block = model.blocks[4].state_dict()  # a submodule's state_dict too
    assert all(torch.equal(v, expected[f"blocks.4.{k}"]) for k, v in block.items())
    torch.save(model.state_dict(), tmp_path / "w.pt")
    saved = torch.load(tmp_path / "w.pt")
    assert all(torch.equal(saved[k], v) for k, v in expected.items())
    handle(model).remove()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


@pytest.mark.parametrize("kind", ["torch.save", "deepcopy", "copy"])
def test_copying_a_deployed_model_is_one_error_and_works_after_remove(kind: str) -> None:
    """`torch.save(model)` failed with "Can't pickle local object", and `copy.deepcopy` gave a
    copy whose guards still acted on the original (`.half()` on it raised after its remove())."""
    import copy
    import io

    def do(m: nn.Module) -> object:
        if kind == "torch.save":
            return torch.save(m, io.BytesIO())
        return copy.deepcopy(m) if kind == "deepcopy" else copy.copy(m)

    model = build_model()
    before = snapshot(model)
    offload_from_profile(model, PROFILE, backend=CpuBackend())
    for target, where in (
        (model, "TinyTransformer,"),
        (model.blocks[1], "TinyTransformer.blocks.1,"),
    ):
        with pytest.raises(ConfigError, match="copying or pickling") as info:
            do(target)
        assert where in str(info.value) and "remove()" in str(info.value)
        assert "state_dict()" in str(info.value)
    output = _output(model)
    assert output is not None
    handle(model).remove()
    assert not {"__reduce_ex__", "__deepcopy__", "_apply"} & model.__dict__.keys()
    do(model)
    assert_same(model, before)
    if kind == "deepcopy":
        twin = copy.deepcopy(model)
        offload_from_profile(twin, PROFILE, backend=CpuBackend())
        assert torch.equal(_output(twin), output)
