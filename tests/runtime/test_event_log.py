"""The event log proves the schedule is followed, no block bytes are overwritten before their
last reader finished, every read sees its own transfer, and device bytes stay within the peak."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime.events import Event
from flextensor_runtime.profile import Profile, Transfer
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile, record_order

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")


def _overlap(a: Transfer, b: Transfer) -> bool:
    return a.block == b.block and a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _run(mode: str, num_blocks: int, prefetch: int, iters: int = 3):
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    order, _ = record_order(model, block_names(model), ids)
    profile = build_profile(model, order, num_blocks=num_blocks, prefetch=prefetch, mode=mode,
                            gaps_after=["blocks.0", "blocks.2"])  # fmt: skip
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(iters):
            model(ids)
    assert h.events is not None
    return profile, list(h.events), h


def _check_no_early_overwrite(profile: Profile, events: list[Event]) -> None:
    by_trap = {t.trap: t for t in profile.schedule}
    issued: dict[int, int] = {}
    released: dict[int, int] = {}
    for e in events:
        if e.kind == "issue":
            k = by_trap[e["transfer"]]
            for u in profile.schedule:
                if u is not k and _overlap(u, k) and u.trap in issued:
                    assert released.get(u.trap, -1) > issued[u.trap], (
                        f"transfer {k.trap} overwrote block {k.block} before trap "
                        f"{u.release_after} finished reading transfer {u.trap}"
                    )
            issued[k.trap] = e.seq
        elif e.kind == "release" and by_trap[e["transfer"]].release_after == e["at"]:
            released[e["transfer"]] = e.seq


def _check_reads_see_their_transfer(profile: Profile, events: list[Event]) -> None:
    by_trap = {t.trap: t for t in profile.schedule}
    last_issue: dict[int, int] = {}
    completed: set[int] = set()
    for e in events:
        if e.kind == "issue":
            last_issue[e["transfer"]] = e.seq
            completed.discard(e["transfer"])
        elif e.kind == "complete":
            completed.add(e["transfer"])
        elif e.kind == "wait":
            t = by_trap[e["transfer"]]
            assert e["transfer"] in completed
            for u in profile.schedule:
                if u is not t and _overlap(u, t) and u.trap in last_issue:
                    assert last_issue[u.trap] < last_issue[t.trap], (
                        "read after its bytes were overwritten"
                    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("num_blocks", "prefetch"), [(2, 1), (2, 4), (3, 2)])
def test_schedule_followed_exactly(mode: str, num_blocks: int, prefetch: int) -> None:
    iters = 3
    profile, events, h = _run(mode, num_blocks, prefetch, iters)
    issues = [e for e in events if e.kind == "issue"]
    assert not [e for e in issues if e["demand"]], "a trap had to load its own weights"
    by_trap = {t.trap: t for t in profile.schedule}
    cyclic = {t.trap for t in profile.schedule if t.issue_at >= t.trap}
    assert {e["transfer"] for e in issues if e["at"] == -1} == cyclic
    for t in profile.schedule:
        at = [e["at"] for e in issues if e["transfer"] == t.trap and e["at"] >= 0]
        shares_bytes = any(u is not t and _overlap(u, t) for u in profile.schedule)
        if shares_bytes or mode == "strategy":  # copied again every iteration, at the planned trap
            assert at == [t.issue_at] * iters, (
                f"transfer {t.trap} issued at {at}, planned {t.issue_at}"
            )
        else:  # alone in its bytes: its copy stays valid, so it is copied exactly once
            assert len(at) + (t.trap in cyclic) == 1 and set(at) <= {t.issue_at}
    for e in issues:
        assert by_trap[e["transfer"]].bytes == e["bytes"]
    enters = [e["trap"] for e in events if e.kind == "enter"]
    assert enters == list(range(len(profile.traps))) * iters
    _check_no_early_overwrite(profile, events)
    _check_reads_see_their_transfer(profile, events)
    assert 0 < h.backend.peak_held_bytes <= profile.predicted.peak_bytes


def test_cyclic_prefetch_is_issued_in_the_previous_iteration() -> None:
    profile, events, _ = _run("allocation_block_transfer", 2, 4)
    cyclic = [t for t in profile.schedule if t.issue_at >= t.trap]
    assert cyclic, "the plan should prefetch across the iteration boundary"
    t = cyclic[0]
    seq = [(e.kind, e.fields) for e in events if e.kind in ("enter", "issue")]
    # in steady state the copy for trap t is issued at trap issue_at, i.e. after trap t ran
    first_issue = next(
        i
        for i, (k, f) in enumerate(seq)
        if k == "issue" and f["transfer"] == t.trap and f["at"] >= 0
    )
    entered_before = [f["trap"] for k, f in seq[:first_issue] if k == "enter"]
    assert t.trap in entered_before and entered_before[-1] == t.issue_at


def test_gap_traps_issue_copies_between_modules() -> None:
    profile, events, _ = _run("allocation_block_transfer", 3, 2)
    gaps = [i for i, trap in enumerate(profile.traps) if trap.kind == "gap"]
    issued_at_gaps = [e for e in events if e.kind == "issue" and e["at"] in gaps]
    assert issued_at_gaps, "the plan issues copies at gap traps"
    order = [e for e in events if e.kind in ("enter", "exit")]
    for g in gaps:  # a gap runs right after the trap before it, before the next one enters
        i = next(n for n, e in enumerate(order) if e.kind == "enter" and e["trap"] == g)
        assert order[i - 1].kind == "exit" and order[i - 1]["trap"] == g - 1


@pytest.mark.parametrize("mode", MODES)
def test_out_of_order_calls_stay_correct_and_count_stalls(mode: str) -> None:
    model = tiny_lm()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = [model.blocks[i](x) for i in (3, 1, 2)]
    h = deploy(model, build_profile(model, block_names(model), num_blocks=2, prefetch=1, mode=mode))
    with torch.no_grad():
        got = [model.blocks[i](x) for i in (3, 1, 2)]
    assert all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
    assert h.report().stalls >= 1
    assert h.backend.peak_held_bytes <= h.profile.predicted.peak_bytes


def test_events_is_an_empty_log_without_logging_and_keeps_its_events_after_remove() -> None:
    """`handle(m).events` used to be None with `log_events=False`: `list(h.events)` raised."""
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    profile = build_profile(model, block_names(model), num_blocks=2)
    h = deploy(model, profile, log_events=False)
    with torch.no_grad():
        model(ids)
    assert list(h.events) == [] and len(h.events) == 0 and h.events.of_kind("issue") == []
    h.remove()
    assert list(h.events) == []
    h = deploy(model, profile)
    with torch.no_grad():
        model(ids)
    n = len(h.events)
    h.remove()
    assert n > 0 and len(list(h.events)) == n  # what was logged stays readable
