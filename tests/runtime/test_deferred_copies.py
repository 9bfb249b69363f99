"""Outputs stay bit-identical when copies run as late as a CUDA copy stream may run them.

`DeferredBackend` queues every copy and runs it only when the compute side waits for it, so a
trap that read its block before waiting for the right copy would read stale bytes here (on the
CPU backend a copy has finished when it is issued). Covered: every transfer mode, several block
counts and prefetch depths, gap traps, several transfers per trap, on-entry copies, the ring,
tied weights held for a later trap, a module called twice, and the compiled golden profiles.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from flextensor_runtime.deploy import offload_from_profile
from flextensor_runtime.profile import Profile, load
from profiles.tiny_transformer import build_model, example_inputs
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.deferred_backend import DeferredBackend
from tests.runtime.models import SharedBlockNet, block_names, tiny_lm
from tests.runtime.plans import build_profile, record_order
from tests.runtime.split_plans import on_entry, ring, split_profile, two_blocks

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")
ROOT = Path(__file__).resolve().parents[2]
ITERS = 3


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))


def _run(model: nn.Module, profile: Profile, inputs: list[tuple]) -> DeferredBackend:
    """Deploy with deferred copies; each input's output equals the plain model's, every time."""
    with torch.no_grad():
        plain = [model(*x) for x in inputs]
    before = snapshot(model)
    backend = DeferredBackend()
    h = deploy(model, profile, backend=backend)
    with torch.no_grad():
        for _ in range(ITERS):
            for x, want in zip(inputs, plain, strict=True):
                assert torch.equal(model(*x), want)
    h.remove()
    assert_same(model, before)
    return backend


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("num_blocks", "prefetch"), [(1, 1), (2, 1), (2, 3), (3, 6)])
def test_block_plans(mode: str, num_blocks: int, prefetch: int) -> None:
    model = tiny_lm()
    order, _ = record_order(model, block_names(model), _ids())
    profile = build_profile(model, order, num_blocks=num_blocks, prefetch=prefetch, mode=mode,
                            gaps_after=["blocks.1"])  # fmt: skip
    backend = _run(model, profile, [(_ids(1),), (_ids(2),)])
    assert backend.ran > 0
    if mode != "strategy" and prefetch > 1:  # copies issued ahead wait in the queue
        assert backend.most_queued >= 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["two_blocks", "on_entry", "ring"])
def test_several_transfers_per_trap(layout: str, mode: str) -> None:
    model = tiny_lm()
    order = block_names(model)
    streamed = (1, 2, 3, 4)
    copies = {
        "two_blocks": lambda: two_blocks(model, streamed, order),
        "on_entry": lambda: on_entry(model, streamed, order),
        "ring": lambda: ring(model, streamed, order, 30000),
    }[layout]()
    profile = split_profile(model, order, copies, mode)
    backend = _run(model, profile, [(_ids(1),), (_ids(2),)])
    assert backend.most_queued >= 2


@pytest.mark.parametrize("mode", MODES)
def test_tied_weight_held_for_a_later_trap(mode: str) -> None:
    model = tiny_lm()
    profile = build_profile(model, block_names(model), num_blocks=2, prefetch=1, mode=mode,
                            stream_shared=True, gaps_after=["head"])  # fmt: skip
    _run(model, profile, [(_ids(1),), (_ids(2),)])


@pytest.mark.parametrize("mode", MODES)
def test_a_module_called_twice(mode: str) -> None:
    model, x = SharedBlockNet().eval(), torch.randn(4, 32)
    order, calls = record_order(model, ["inp", "shared", "mid", "out"], x)
    profile = build_profile(model, order, calls=calls, num_blocks=2, prefetch=1, mode=mode)
    _run(model, profile, [(x,), (torch.randn(4, 32),)])


@pytest.mark.parametrize(
    "name", ["tiny_transformer.f40", "tiny_transformer.f60", "tiny_transformer.latency"]
)
def test_compiled_golden_profiles(name: str) -> None:
    model = build_model()
    profile = load(ROOT / "profiles" / f"{name}.msgpack")
    x = example_inputs()
    backend = _run(model, profile, [x])
    assert backend.ran > 0


class _SkipsOneWait(DeferredBackend):
    """A runtime bug made on purpose: the compute side never waits for the second copy."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, event: object) -> None:
        self.waits += 1
        if self.waits != 2:
            super().wait(event)


def test_a_missing_wait_is_caught() -> None:
    """The harness can fail: skipping one wait reads a block before its copy ran."""
    model = tiny_lm()
    order, _ = record_order(model, block_names(model), _ids())
    profile = build_profile(model, order, num_blocks=2, prefetch=3)
    with torch.no_grad():
        plain = model(_ids())
    offload_from_profile(model, profile, backend=_SkipsOneWait())
    with torch.no_grad():
        assert not torch.equal(model(_ids()), plain)


@pytest.mark.parametrize("mode", MODES)
def test_manual_traps(mode: str) -> None:
    from tests.runtime.test_manual_replan import STAGES, _drive, _Stages

    torch.manual_seed(0)
    model, x = _Stages().eval(), torch.randn(5, 24)
    plain = _drive(model, x, manual=False)
    profile = build_profile(model, list(STAGES), manual=STAGES, num_blocks=2, prefetch=2, mode=mode)
    backend = DeferredBackend()
    deploy(model, profile, backend=backend)
    for _ in range(ITERS):
        assert torch.equal(_drive(model, x, manual=True), plain)
    assert backend.ran > 0


def test_replan_then_run() -> None:
    from flextensor_runtime.strategy_replan import replan

    model = tiny_lm()
    order, _ = record_order(model, block_names(model), _ids())
    profile = build_profile(model, order, num_blocks=3, prefetch=1, gaps_after=["blocks.1"])
    with torch.no_grad():
        plain = [model(_ids(s)) for s in (1, 2)]
    backend = DeferredBackend()
    deploy(model, profile, backend=backend)
    request = replan(model, iters=2)
    with torch.no_grad():
        for _ in range(ITERS + 2):  # the replan iterations, then the rebuilt schedule
            for s, want in zip((1, 2), plain, strict=True):
                assert torch.equal(model(_ids(s)), want)
    assert request.done and request.profile is not None
