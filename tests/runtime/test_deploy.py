"""Installed vs plain outputs are bit-identical, and `.remove()` restores the model exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime.deploy import handle, load_profile, offload_from_profile
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import dumps, save
from tests.runtime.conftest import assert_same, deploy, deploy_runs_unchanged, snapshot
from tests.runtime.models import MlpBlock, SharedBlockNet, block_names, tiny_lm
from tests.runtime.plans import build_profile, record_order

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("num_blocks", "prefetch"), [(2, 1), (2, 3), (3, 6)])
def test_tiny_lm_identical_in_every_mode(mode: str, num_blocks: int, prefetch: int) -> None:
    model, ids = tiny_lm(), _ids()
    order, _ = record_order(model, block_names(model), ids)
    profile = build_profile(model, order, num_blocks=num_blocks, prefetch=prefetch, mode=mode,
                            gaps_after=["blocks.1"])  # fmt: skip
    with torch.no_grad():
        plain = model(ids)
    h, before = deploy_runs_unchanged(model, profile, (ids,), plain)
    h.remove()
    assert_same(model, before)
    with torch.no_grad():
        assert torch.equal(model(ids), plain)


def test_inner_fields_and_buffers_are_streamed() -> None:
    model, ids = tiny_lm(), _ids()
    profile = build_profile(model, block_names(model))
    streamed = {e.name: e for e in profile.all_tensors() if e.placement == "streamed"}
    assert (
        "blocks.0.up.weight.scale" in streamed
        and streamed["blocks.0.up.weight.scale"].kind == "inner"
    )
    assert "blocks.1.gain" in streamed and streamed["blocks.1.gain"].kind == "buffer"
    with torch.no_grad():
        plain = model(ids)
    deploy(model, profile)
    scale = model.blocks[0].up.weight.scale
    assert scale.untyped_storage().data_ptr() != 0
    with torch.no_grad():
        assert torch.equal(model(ids), plain)


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _TiedInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = _Pair()
        self.tail = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.pair(x))


@pytest.mark.parametrize("mode", MODES)
def test_tie_inside_one_trap_is_streamed_once(mode: str) -> None:
    torch.manual_seed(0)
    model, x = _TiedInside().eval(), torch.randn(3, 16)
    profile = build_profile(model, ["pair", "tail"], streamed=["pair"], num_blocks=1, mode=mode)
    tied = next(e for e in profile.all_tensors() if e.name == "pair.b.weight")
    assert tied.tie == "pair.a.weight" and tied.placement == "streamed"
    with torch.no_grad():
        plain = model(x)
    before = snapshot(model)
    h = deploy(model, profile)
    with torch.no_grad():
        assert torch.equal(model(x), plain) and torch.equal(model(x), plain)
    assert model.pair.a.weight is model.pair.b.weight
    h.remove()
    assert_same(model, before)


@pytest.mark.parametrize("mode", MODES)
def test_module_called_twice_per_forward(mode: str) -> None:
    torch.manual_seed(0)
    model, x = SharedBlockNet().eval(), torch.randn(4, 32)
    order, calls = record_order(model, ["inp", "shared", "mid", "out"], x)
    assert calls["shared"] == 2
    profile = build_profile(model, order, calls=calls, num_blocks=2, prefetch=1, mode=mode)
    with torch.no_grad():
        plain = model(x)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(x), plain)
    report = h.report()
    assert report.traps[order.index("shared")].calls == 4 and report.stalls == 0


def test_partly_streamed_and_profile_file_roundtrip(tmp_path) -> None:
    model, ids = tiny_lm(), _ids()
    profile = build_profile(
        model, block_names(model), streamed=["blocks.1", "blocks.3"], num_blocks=1, prefetch=2
    )
    path = save(profile, tmp_path / "tiny.msgpack")
    assert dumps(load_profile(path)) == dumps(profile)
    with torch.no_grad():
        plain = model(ids)
    offload_from_profile(model, path, device="cpu")  # the CPU even on a GPU machine
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    placements = {e.name: e.placement for e in profile.all_tensors()}
    assert placements["blocks.0.down.weight"] == "resident"
    assert placements["blocks.1.down.weight"] == "streamed"


def test_remove_keeps_an_own_forward_and_install_twice_is_refused() -> None:
    model = tiny_lm()
    own = model.norm.forward
    model.norm.forward = own  # an instance-level forward set by other code
    before = snapshot(model)
    profile = build_profile(model, block_names(model))
    h = deploy(model, profile)
    with pytest.raises(ConfigError, match="already has an offload profile"):
        deploy(model, profile)
    h.remove()
    h.remove()  # a second remove is a no-op
    assert_same(model, before)
    assert model.norm.__dict__["forward"] is own
    with pytest.raises(ConfigError, match="no offload profile installed"):
        handle(model)


def test_strict_false_leaves_extra_tensors_in_place() -> None:
    model, ids = tiny_lm(), _ids()
    profile = build_profile(model, block_names(model))
    extra = MlpBlock(32)
    model.add_module("unused", extra)
    with torch.no_grad():
        plain = model(ids)
    with pytest.raises(Exception, match="extra"):
        deploy(model, profile)
    deploy(model, profile, strict=False)
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    assert handle(model).deployment.binding.extra[0].startswith("unused.")


def test_report_table_matches_event_log() -> None:
    model, ids = tiny_lm(), _ids()
    h = deploy(model, build_profile(model, block_names(model), num_blocks=2, prefetch=2))
    with torch.no_grad():
        model(ids)
        model(ids)
    report = h.report()
    assert h.events is not None
    issued_here = sum(e["bytes"] for e in h.events.of_kind("issue") if e["at"] >= 0)
    assert report.bytes_moved == issued_here > 0
    table = report.table()
    assert table.splitlines()[5].startswith("blocks.2") and "total" in table
    assert all(t.calls == 2 for t in report.traps)


@pytest.mark.parametrize("mode", MODES)
def test_tied_weight_read_by_a_later_trap_is_held_until_then(mode: str) -> None:
    model, ids = tiny_lm(), _ids()
    # a gap after the head leaves room to prefetch the embedding/head weight cyclically
    profile = build_profile(model, block_names(model), num_blocks=2, prefetch=1, mode=mode,
                            stream_shared=True, gaps_after=["head"])  # fmt: skip
    embed = next(t for t in profile.schedule if profile.traps[t.trap].name == "embed")
    assert embed.release_after == block_names(model).index("head")
    with torch.no_grad():
        plain = model(ids)
    h, before = deploy_runs_unchanged(model, profile, (ids,), plain)
    assert h.backend.peak_held_bytes <= profile.predicted.peak_bytes
    h.remove()
    assert_same(model, before)
