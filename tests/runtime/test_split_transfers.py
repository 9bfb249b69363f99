"""Several transfers per trap and on-entry copies (format version 2), on a real TinyLM.

Each layout must pass `check_profile`, round-trip to identical bytes, and run bit-identical to
the plain model in every transfer mode, with the report counting the copies the plan issues.
Broken variants give one-line errors naming the transfer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgpack
import pytest
import torch
from torch import nn

from flextensor_runtime.errors import ProfileFormatError, ProfileVersionError
from flextensor_runtime.profile import (
    Profile,
    Transfer,
    check_profile,
    dumps,
    load,
    loads,
    save,
    to_document,
)
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.split_plans import Copy, on_entry, ring, split_profile, two_blocks

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")
STREAMED = (1, 2, 3, 4)  # blocks.0 .. blocks.3 in TinyLM's trap order
ITERS = 3

Layout = Callable[[nn.Module, list[str]], list[Copy]]
LAYOUTS: dict[str, Layout] = {
    "two_blocks": lambda m, order: two_blocks(m, STREAMED, order),
    "on_entry": lambda m, order: on_entry(m, STREAMED, order),
    "ring": lambda m, order: ring(m, STREAMED, order, 30000),
}


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))


def _profile(layout: str, mode: str = "allocation_block_transfer") -> tuple[nn.Module, Profile]:
    model = tiny_lm()
    order = block_names(model)
    return model, split_profile(model, order, LAYOUTS[layout](model, order), mode)


def _overlap(a: Transfer, b: Transfer) -> bool:
    return a.block == b.block and a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _expected_copies(profile: Profile, mode: str) -> list[int]:
    """Copies counted at each trap's entry over ITERS iterations: a transfer whose bytes another
    one reuses (or, in strategy mode, whose memory is freed) is copied once per iteration; one
    that keeps its bytes is copied once, at install when cyclic (not counted at a trap)."""
    counts = [0] * len(profile.traps)
    for t in profile.schedule:
        again = mode == "strategy" or any(u is not t and _overlap(t, u) for u in profile.schedule)
        if again:
            counts[t.issue_at] += ITERS
        elif t.issue_at <= t.trap:
            counts[t.issue_at] += 1
    return counts


def test_layouts_have_what_they_claim() -> None:
    _, split = _profile("two_blocks")
    assert all(len([t for t in split.schedule if t.trap == i]) == 2 for i in STREAMED)
    assert all(len({t.block for t in split.schedule if t.trap == i}) == 2 for i in STREAMED)
    _, entry = _profile("on_entry")
    for t in entry.schedule:
        if t.issue_at == t.trap:  # into bytes the previous trap's transfer held until it ended
            assert any(u.trap == t.trap - 1 and u.release_after == t.trap - 1 and _overlap(t, u)
                       for u in entry.schedule)  # fmt: skip
    assert sum(t.issue_at == t.trap for t in entry.schedule) == 3
    _, one = _profile("ring")
    assert {b.id for b in one.blocks} == {0} and len(one.schedule) > len(STREAMED)
    assert any(t.issue_at == t.trap for t in one.schedule)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_accepted_and_round_trip_is_byte_stable(layout: str, tmp_path) -> None:
    _, profile = _profile(layout)
    check_profile(profile)
    data = dumps(profile)
    assert loads(data) == profile
    assert dumps(loads(data)) == data
    path = save(profile, tmp_path / "split.msgpack")
    assert path.read_bytes() == data and load(path) == profile
    shuffled = dataclasses.replace(profile, schedule=tuple(reversed(profile.schedule)))
    assert dumps(shuffled) == data


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bit_identical_in_every_mode(layout: str, mode: str) -> None:
    model, profile = _profile(layout, mode)
    ids = _ids()
    with torch.no_grad():
        plain = model(ids)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(ITERS):
            assert torch.equal(model(ids), plain)
    report = h.report()
    assert report.stalls == 0
    assert [t.transfers_issued for t in report.traps] == _expected_copies(profile, mode)
    assert report.bytes_moved == sum(e["bytes"] for e in h.events.of_kind("issue") if e["at"] >= 0)
    h.remove()


@pytest.mark.parametrize("layout", ["on_entry", "ring"])
def test_entry_issues_own_copies_first_then_in_trap_order(layout: str) -> None:
    model, profile = _profile(layout)
    n = len(profile.traps)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(2):
            model(_ids())
    assert h.events is not None
    at_entry: list[tuple[int, list[tuple[int, int, int]]]] = []  # one per trap entry
    current: list[tuple[int, int, int]] = []
    for e in h.events:
        if e.kind == "enter":
            current = []
            at_entry.append((e["trap"], current))
        elif e.kind == "issue" and e["at"] >= 0:
            assert not e["demand"]
            current.append(((e["transfer"] - e["at"]) % n, e["block"], e["offset"]))
    on_entry_seen = 0
    for i, issued in at_entry:
        assert issued == sorted(issued), f"copies at trap {i} out of order: {issued}"
        on_entry_seen += sum(1 for key in issued if key[0] == 0)
    assert on_entry_seen == 2 * sum(t.issue_at == t.trap for t in profile.schedule)


def test_replan_keeps_several_transfers_valid() -> None:
    from flextensor_runtime.strategy_replan import rebuild_schedule

    for layout in sorted(LAYOUTS):
        _, profile = _profile(layout)
        new = rebuild_schedule(profile, [0.5] * len(profile.traps))
        check_profile(new)
        assert len(new.schedule) == len(profile.schedule)
        assert [(t.trap, t.block, t.offset) for t in new.schedule] == [
            (t.trap, t.block, t.offset) for t in profile.schedule
        ]


def _broken(layout: str, change: Callable[[list[Transfer]], list[Transfer]]) -> Profile:
    _, profile = _profile(layout)
    return dataclasses.replace(profile, schedule=tuple(change(list(profile.schedule))))


def _shrink_first(s: list[Transfer]) -> list[Transfer]:
    return [dataclasses.replace(s[0], bytes=s[0].bytes - 64), *s[1:]]


def _overlap_siblings(s: list[Transfer]) -> list[Transfer]:
    # the ring's two transfers of trap 2 made to share their first bytes
    a, b = [t for t in s if t.trap == 2]
    grown = dataclasses.replace(b, offset=a.offset, bytes=b.offset + b.bytes - a.offset) \
        if b.offset > a.offset else dataclasses.replace(a, offset=b.offset, bytes=a.offset + a.bytes - b.offset)  # fmt: skip
    return [grown if t in (a, b) and t.offset != grown.offset else t for t in s]


def _entry_too_early(s: list[Transfer]) -> list[Transfer]:
    # the on-entry copy of trap 2 while trap 1 still holds those bytes
    return [dataclasses.replace(t, release_after=2) if t.trap == 1 and t.block == 0 else t
            for t in s]  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "change", "fragment"),
    [
        ("two_blocks", _shrink_first, "lies outside every transfer of its trap 1"),
        ("ring", _overlap_siblings, "transfer 1 of trap 2 and transfer 2 of trap 2 overlap"),
        ("on_entry", _entry_too_early,
         "transfer 1 of trap 1 and transfer 1 of trap 2 hold the same bytes of block 0 during "
         "trap 2"),
    ],
)  # fmt: skip
def test_broken_layouts_are_one_line_errors(layout: str, change, fragment: str) -> None:
    broken = _broken(layout, change)
    with pytest.raises(ProfileFormatError) as info:
        check_profile(broken)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    doc = to_document(dataclasses.replace(broken))
    with pytest.raises(ProfileFormatError, match="recompile"):
        loads(msgpack.packb(doc, use_bin_type=True))


def test_version_1_file_is_refused(tmp_path) -> None:
    _, profile = _profile("two_blocks")
    doc = to_document(profile)
    doc["version"] = 1
    path = tmp_path / "v1.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    with pytest.raises(ProfileVersionError) as info:
        load(path)
    message = str(info.value)
    assert "version 1" in message and "recompile" in message and "\n" not in message


@pytest.mark.parametrize("mode", MODES)
def test_tied_alias_reads_the_transfer_carrying_its_canonical(mode: str) -> None:
    # embed.weight (trap 0) is copied on entry into a block of its own and held until the head
    # (trap 6), whose weight is tied to it, has run
    model = tiny_lm()
    order = block_names(model)
    n = len(order)
    copies = [*two_blocks(model, STREAMED, order), Copy(0, 4, 0, 0, n - 1, ("embed.weight",))]
    profile = split_profile(model, order, copies, mode)
    check_profile(profile)
    head = next(e for e in profile.traps[n - 1].tensors if e.name == "head.weight")
    assert head.placement == "streamed" and head.block == 4
    ids = _ids()
    with torch.no_grad():
        plain = model(ids)
    h = deploy(model, profile)
    tables = h.deployment.tables
    assert tables is not None
    embed_k = next(p.index for p in tables.transfers if p.transfer.trap == 0)
    assert embed_k in tables.reads[n - 1] and tables.prologue == tuple(
        p.index for p in tables.transfers if p.transfer.issue_at > p.transfer.trap
    )
    with torch.no_grad():
        for _ in range(ITERS):
            assert torch.equal(model(ids), plain)
    assert h.report().stalls == 0
    waits = [e["at"] for e in h.events.of_kind("wait") if e["transfer"] == 0]
    assert waits.count(n - 1) == ITERS and waits.count(0) == ITERS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_demand_loads_each_transfer_off_plan(layout: str, mode: str) -> None:
    # a block called on its own, after a full forward, finds its transfers overwritten (or
    # freed) and loads each of them on entry
    model, profile = _profile(layout, mode)
    ids = _ids()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain, plain_block = model(ids), model.blocks[1](x)
    h = deploy(model, profile)
    with torch.no_grad():
        model(ids)
        h.deployment.runtime.reset_counters()
        assert torch.equal(model.blocks[1](x), plain_block)
        demand = [e for e in h.events.of_kind("issue") if e["demand"]]
        for _ in range(2):
            assert torch.equal(model(ids), plain)
    own = [t for t in profile.schedule if t.trap == 2]
    stalled = h.report().traps[2].stalls
    assert 1 <= stalled <= len(own) and len(demand) == stalled
    assert {(e["block"], e["offset"]) for e in demand} <= {(t.block, t.offset) for t in own}


def test_runtime_replan_of_a_ring_keeps_outputs(tmp_path) -> None:
    from flextensor_runtime.strategy_replan import replan

    model, profile = _profile("ring")
    ids = _ids()
    with torch.no_grad():
        plain = model(ids)
    h = deploy(model, profile)
    request = replan(model, iters=2, save=tmp_path / "ring2.msgpack")
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(ids), plain)
    assert request.profile is not None
    new = load(tmp_path / "ring2.msgpack")
    assert [(t.trap, t.block, t.offset, t.bytes) for t in new.schedule] == [
        (t.trap, t.block, t.offset, t.bytes) for t in profile.schedule
    ]
    assert any(t.issue_at == t.trap for t in new.schedule)  # the shared bytes stay on entry
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(ids), plain)
    assert h.report().stalls == 0


def test_replan_predicts_the_wait_for_on_entry_copies() -> None:
    from flextensor_runtime.strategy_replan import rebuild_schedule

    _, profile = _profile("ring")
    slow = rebuild_schedule(profile, [100.0] * len(profile.traps))  # every prefetch hidden
    rate = profile.device.h2d_bytes_per_s
    for i, stall in enumerate(slow.predicted.trap_stall_ms):
        on_entry_ms = sum(t.bytes / rate * 1e3 for t in slow.schedule
                          if t.trap == i and t.issue_at == i)  # fmt: skip
        assert stall == pytest.approx(on_entry_ms, rel=1e-9, abs=1e-12), i
    assert any(slow.predicted.trap_stall_ms)
