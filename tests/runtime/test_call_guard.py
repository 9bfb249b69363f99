"""A child of a module trap called on its own (outside its trap) is refused, not run on whatever
its memory block holds; every legitimate way to call an installed model still works."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime.errors import ConfigError
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import SharedBlockNet, block_names, tiny_lm
from tests.runtime.plans import build_profile

MODES = ["allocation_block_transfer", "strategy", "raw_block_transfer"]


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode", MODES)
def test_a_child_of_a_module_trap_called_directly_is_an_error(mode) -> None:
    """`m.blocks[1].up(y)` used to return a wrong output silently in every transfer mode."""
    model, plain = tiny_lm(), tiny_lm()
    y = torch.randn(3, 32)
    before = snapshot(model)
    h = deploy(model, build_profile(model, block_names(model), num_blocks=2, mode=mode))
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain(_ids()))
        with pytest.raises(ConfigError, match=r"module 'blocks\.1\.up' was called outside its "
                           r"trap 'blocks\.1'.*call the module 'blocks\.1'.*remove\(\)"):  # fmt: skip
            model.blocks[1].up(y)
        # the trap module itself, out of order, is correct; so is the model afterwards
        assert torch.equal(model.blocks[1](y), plain.blocks[1](y))
        assert torch.equal(model.blocks[3](y), plain.blocks[3](y))
        assert torch.equal(model(_ids()), plain(_ids()))
    h.remove()
    assert_same(model, before)
    with torch.no_grad():
        assert torch.equal(model.blocks[1].up(y), plain.blocks[1].up(y))  # plain once removed


@pytest.mark.parametrize("mode", MODES)
def test_guarded_children_run_inside_their_traps_with_ties_gaps_and_repeats(mode) -> None:
    """A streamed tie read by a later trap, gap traps and a trap called twice per forward."""
    model, plain = tiny_lm(), tiny_lm()
    traps = ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    profile = build_profile(model, ["embed", *traps, "norm", "head"], num_blocks=2, mode=mode,
                            gaps_after=["blocks.1", "head"], stream_shared=True)  # fmt: skip
    deploy(model, profile)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(_ids()), plain(_ids()))
    torch.manual_seed(1)
    net = SharedBlockNet().eval()
    ref = SharedBlockNet().eval()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(4, 32)
    profile = build_profile(net, ["inp", "shared", "mid", "out"], calls={"shared": 2},
                            num_blocks=2, mode=mode)  # fmt: skip
    deploy(net, profile)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(net(x), ref(x))
        with pytest.raises(ConfigError, match=r"'shared\.down' was called outside its trap"):
            net.shared.down(torch.randn(4, 64))


def test_a_skipped_module_is_never_checked() -> None:
    """MoE-style: a trap whose module does not run this forward; its children are not called."""
    model, plain = tiny_lm(), tiny_lm()
    deploy(model, build_profile(model, block_names(model), num_blocks=2))
    skip = model.blocks[2]
    model.blocks[2] = torch.nn.Identity()  # the forward no longer reaches blocks.2
    plain.blocks[2] = torch.nn.Identity()
    with torch.no_grad():
        assert torch.equal(model(_ids()), plain(_ids()))
    model.blocks[2] = skip
