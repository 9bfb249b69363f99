"""Common calls on a deployed model, each against the plain model: `Module.apply` with a
function that edits weights in place, on a small Llama and on TinyLM in every transfer mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import block_names, tiny_llama, tiny_lm
from tests.runtime.plans import build_profile

MODES = ["allocation_block_transfer", "strategy", "raw_block_transfer"]


def _double_linears(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        with torch.no_grad():
            module.weight.mul_(2)  # in place, as init functions and hand-merged LoRAs do


@pytest.mark.parametrize("mode", MODES)
def test_apply_that_edits_streamed_weights_in_place_runs_on_their_true_values(mode) -> None:
    """`model.apply(fn)` edited streamed weights outside their traps: in allocation mode it
    scaled whatever the memory blocks held (logits off by up to 0.38 on a small Llama and not the
    same from one forward to the next, and `remove()` gave the old weights); in the strategy and
    raw modes it hit the one-element placeholders and torch raised "more than one element of the
    written-to tensor refers to a single memory location". Now `fn` runs on the true values (the
    host copies) and every transfer is copied again from them."""
    model, edited = tiny_llama(), tiny_llama()
    edited.apply(_double_linears)
    ids = torch.tensor([[1, 2, 3, 127, 5]])
    with torch.no_grad():
        want = edited(input_ids=ids).logits
    traps = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    h = deploy(model, build_profile(model, traps, num_blocks=2, prefetch=2, mode=mode))
    with torch.no_grad():
        model(input_ids=ids)  # the blocks hold copies of the old weights
    assert model.apply(_double_linears) is model
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(input_ids=ids).logits, want)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in edited.state_dict().items())
    assert h.report().stalls == 0
    h.remove()
    assert all(torch.equal(model.get_parameter(k), v) for k, v in edited.named_parameters())
    assert "apply" not in model.__dict__ and "apply" not in model.lm_head.__dict__


@pytest.mark.parametrize("mode", MODES)
def test_apply_on_a_submodule_edits_its_streamed_weights(mode) -> None:
    model, edited = tiny_lm(), tiny_lm()
    edited.blocks[1].apply(_double_linears)
    ids = torch.tensor([[1, 5, 9, 63]])
    with torch.no_grad():
        want = edited(ids)
    h = deploy(model, build_profile(model, block_names(model), streamed=["blocks.1"],
                                    num_blocks=2, mode=mode))  # fmt: skip
    model.blocks[1].apply(_double_linears)
    with torch.no_grad():
        assert torch.equal(model(ids), want) and torch.equal(model(ids), want)
    h.remove()
    assert torch.equal(model.blocks[1].up.weight, edited.blocks[1].up.weight)


def _replace_data(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        module.weight.data = module.weight.data * 2


@pytest.mark.parametrize("mode", MODES)
def test_apply_that_replaces_a_weights_data_is_refused_and_undone(mode) -> None:
    from flextensor_runtime.errors import ConfigError

    model = tiny_lm()
    ids = torch.tensor([[1, 5, 9, 63]])
    with torch.no_grad():
        plain = model(ids)
    before = snapshot(model)
    h = deploy(model, build_profile(model, block_names(model), streamed=["blocks.1"],
                                    num_blocks=2, mode=mode))  # fmt: skip
    with pytest.raises(ConfigError, match=r"^TinyLM\.apply\(\) changed embed\.weight, blocks\.3\.up\.weight, "
                       r"blocks\.3\.down\.weight \(\+6 more\) while an offload profile is installed, "
                       r"which is not supported \(a profile weight's data may be edited in place but "
                       r"not replaced while installed\); the change was undone: call "
                       r"handle\(model\)\.remove\(\), then apply\(\)"):  # fmt: skip
        model.apply(_replace_data)
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    h.remove()
    assert_same(model, before)


def test_a_second_offloader_on_a_deployed_diffusers_model_is_refused() -> None:
    """diffusers' `enable_group_offload` on a deployed model ran, and `remove()` then left its
    replaced forwards in place (moving the memory blocks' contents instead of the weights);
    now it is refused before anything changes, and runs once the profile is removed."""
    from diffusers import SD3Transformer2DModel

    from flextensor_runtime.errors import ConfigError

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=2,
                                  attention_head_dim=8, num_attention_heads=4,
                                  caption_projection_dim=32, joint_attention_dim=32,
                                  pooled_projection_dim=64, out_channels=4).eval()  # fmt: skip
    before = snapshot(model)
    traps = ["transformer_blocks.0", "transformer_blocks.1"]
    h = deploy(model, build_profile(model, traps, num_blocks=2))
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"enable_group_offload\(\) while an offload profile"):
        model.enable_group_offload(cpu, cpu, offload_type="leaf_level")
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())
    h.remove()
    assert_same(model, before)
    assert "enable_group_offload" not in model.__dict__


@pytest.mark.parametrize("mode", ["strategy", "raw_block_transfer"])
def test_torch_compile_of_a_deployed_model_runs_its_traps_outside_the_graph(mode) -> None:
    """`torch.compile` traced the traps' entries: in the strategy and raw modes inductor saw the
    one-element placeholders of streamed weights and failed ("expected size 32==32, stride
    0==1"). Entries and exits now run eagerly around the traced forwards."""
    model = tiny_lm()
    x, y = torch.tensor([[1, 5, 9, 63]]), torch.tensor([[2, 7, 7, 1]])
    with torch.no_grad():
        want = model(x), model(y)
    h = deploy(model, build_profile(model, block_names(model), streamed=["blocks.1"],
                                    num_blocks=2, mode=mode))  # fmt: skip
    compiled = torch.compile(model)
    with torch.no_grad():
        for inp, out in ((x, want[0]), (y, want[1]), (x, want[0])):
            torch.testing.assert_close(compiled(inp), out, rtol=1e-5, atol=1e-5)
    assert h.report().stalls == 0
    h.remove()
