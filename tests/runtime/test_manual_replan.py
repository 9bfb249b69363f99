"""Manual traps (`offload_block`) and strategy replan under the real runtime."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_runtime.deploy import load_profile
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.manual import offload_block
from flextensor_runtime.strategy_replan import rebuild_schedule, replan
from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile, record_order


class _Stages(nn.Module):
    """Three linears driven by user code, not by a forward of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.l0, self.l1, self.l2, self.l3 = (nn.Linear(24, 24) for _ in range(4))


STAGES = {"stage_a": ["l0", "l1"], "stage_b": ["l2"], "stage_c": ["l3"]}  # manual trap -> modules


def _drive(model: _Stages, x: torch.Tensor, manual: bool) -> torch.Tensor:
    with torch.no_grad():
        if not manual:
            return model.l3(model.l2(torch.tanh(model.l1(model.l0(x)))))
        with offload_block("stage_a"):
            x = torch.tanh(model.l1(model.l0(x)))
        with offload_block("stage_b", model):
            x = model.l2(x)
        with offload_block("stage_c"):
            return model.l3(x)


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_manual_traps_follow_the_schedule(mode: str) -> None:
    torch.manual_seed(0)
    model, x = _Stages().eval(), torch.randn(5, 24)
    plain = _drive(model, x, manual=False)
    profile = build_profile(model, list(STAGES), manual=STAGES, num_blocks=3, prefetch=1, mode=mode)
    assert {t.kind for t in profile.traps} == {"manual"}
    h = deploy(model, profile)
    for _ in range(3):
        assert torch.equal(_drive(model, x, manual=True), plain)
    report = h.report()
    assert [t.calls for t in report.traps] == [3, 3, 3] and report.stalls == 0
    with pytest.raises(ConfigError, match="no manual trap"), offload_block("stage_z"):
        pass


def test_replan_rebuilds_the_schedule_once(tmp_path) -> None:
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8))
    order, _ = record_order(model, block_names(model), ids)
    profile = build_profile(model, order, num_blocks=3, prefetch=1, gaps_after=["blocks.1"])
    with torch.no_grad():
        plain = model(ids)
    h = deploy(model, profile)
    request = replan(model, iters=2, save=tmp_path / "replanned.msgpack")
    with pytest.raises(ConfigError, match="already measuring"):
        replan(model, iters=1)
    assert repr(request) == (f"ReplanRequest(model=TinyLM, iters=2, save={tmp_path}/replanned"
                             ".msgpack, done=False)")  # not the whole model and profile  # fmt: skip
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
        assert not request.done
        assert torch.equal(model(ids), plain)
    assert request.done and request.profile is not None
    new = request.profile
    assert new.meta.timing_source == "replan"
    assert [t.compute_ms for t in new.traps] != [t.compute_ms for t in profile.traps]
    assert load_profile(tmp_path / "replanned.msgpack") is not None
    assert h.profile is new
    h.events.clear()
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(ids), plain)
    issued = [(e["transfer"], e["at"]) for e in h.events.of_kind("issue")]
    plan = {(t.trap, t.issue_at) for t in new.schedule}
    assert issued and set(issued) <= plan


def test_rebuild_issues_copies_as_late_as_their_window_allows() -> None:
    model = tiny_lm()
    profile = build_profile(model, block_names(model), num_blocks=3, prefetch=1)
    n = len(profile.traps)
    slow = [10.0] * n  # each trap hides any copy: issue right before the reader
    late = rebuild_schedule(profile, slow)
    assert all((t.trap - t.issue_at) % n == 1 for t in late.schedule)
    fast = [1e-9] * n  # nothing hides a copy: issue as early as the bytes are free
    early = rebuild_schedule(profile, fast)
    assert all(
        (e.trap - e.issue_at) % n >= (lt.trap - lt.issue_at) % n
        for e, lt in zip(early.schedule, late.schedule, strict=True)
    )
    assert early.predicted.stall_ms > late.predicted.stall_ms == 0.0


def test_two_deployed_models_offload_block_names_the_model_it_used() -> None:
    """`offload_block(name)` without model= enters the most recently deployed model's trap;
    driving the other one used to fail with a message that blamed a missing `with`."""
    torch.manual_seed(0)
    a, x = _Stages().eval(), torch.randn(5, 24)
    torch.manual_seed(1)
    b = _Stages().eval()
    plain_a, plain_b = _drive(a, x, manual=False), _drive(b, x, manual=False)
    profile = build_profile(a, list(STAGES), manual=STAGES, num_blocks=3, prefetch=1)
    deploy(a, profile)
    deploy(b, profile)
    assert torch.equal(_drive(b, x, manual=True), plain_b)
    with pytest.raises(ConfigError, match=r"'l0' ran outside offload_block\('stage_a'\) on its "
                       r"model: .*offload_block\('stage_a', model=model\).*most recently "
                       r"deployed in this context: another _Stages object"):  # fmt: skip
        _drive(a, x, manual=True)
    with torch.no_grad(), offload_block("stage_a", model=a):
        y = torch.tanh(a.l1(a.l0(x)))
    with torch.no_grad(), offload_block("stage_b", a), offload_block("stage_c", model=a):
        assert torch.equal(a.l3(a.l2(y)), plain_a)
    lm = tiny_lm()
    deploy(lm, build_profile(lm, block_names(lm)))
    unknown = r"no manual trap of the installed profile of the most recently deployed model \(a "
    with pytest.raises(ConfigError, match=unknown + "TinyLM"), offload_block("stage_a"):
        pass


def test_offload_block_without_a_deployed_model_runs_plainly() -> None:
    ran = []
    with offload_block("anything", model=torch.nn.Linear(2, 2)):
        ran.append(True)
    assert ran == [True]


def test_offload_block_reports_to_an_observer_without_a_model() -> None:
    from flextensor_runtime.manual import offload_block_observer

    seen: list[tuple[str, bool]] = []
    token = offload_block_observer.set(lambda name, entering: seen.append((name, entering)))
    try:
        with offload_block("stage_a"):
            seen.append(("body", True))
    finally:
        offload_block_observer.reset(token)
    assert seen == [("stage_a", True), ("body", True), ("stage_a", False)]


def test_replan_rejects_non_int_iters_and_a_folder_to_save(tmp_path) -> None:
    model = tiny_lm()
    deploy(model, build_profile(model, block_names(model)))
    with pytest.raises(ConfigError, match="replan iters='3' must be at least 1"):
        replan(model, iters="3")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"is not a file path; pass the \.msgpack file"):
        replan(model, iters=1, save=tmp_path)
    assert replan(model, iters=1).iters == 1  # nothing was left measuring
