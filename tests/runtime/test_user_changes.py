"""What `remove()` does with weights other code changed while a profile was installed."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.conftest import deploy
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile

MODES = ["allocation_block_transfer", "strategy", "raw_block_transfer"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["blocks.1.up.weight", "norm.weight"])  # streamed, resident
def test_remove_leaves_data_the_user_replaced(mode, name) -> None:
    """`p.data = t` while installed (transformers' resize_token_embeddings does it) used to be
    undone by remove(), which put the old data back: [256, 64] rows under num_embeddings=300."""
    model, plain = tiny_lm(), tiny_lm().state_dict()
    profile = build_profile(model, block_names(model), streamed=["blocks.1"], num_blocks=2,
                            mode=mode)  # fmt: skip
    assert any(e.name == "blocks.1.up.weight" and e.placement == "streamed"
               for e in profile.all_tensors())  # fmt: skip
    h = deploy(model, profile)
    param = model.get_parameter(name)
    new = torch.randn(3, *param.shape)
    param.data = new
    h.remove()
    assert model.get_parameter(name) is param and param.data_ptr() == new.data_ptr()
    assert param.shape == new.shape
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in plain.items() if k != name)  # others restored


def test_resize_token_embeddings_while_deployed_survives_remove() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    traps = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    h = deploy(model, build_profile(model, traps, num_blocks=2))
    model.resize_token_embeddings(160, mean_resizing=False)
    h.remove()
    assert model.model.embed_tokens.weight.shape == (160, 64)
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[150]])).logits.shape == (1, 1, 160)


@pytest.mark.parametrize("mode", MODES)
def test_adding_a_module_built_from_streamed_weights_is_refused(mode) -> None:
    """diffusers' `fuse_qkv_projections` on a deployed model built `to_qkv` from whatever the
    memory blocks held (max |diff| 0.1 on a small Flux, silently); now the first new submodule
    is refused before anything changes. Replacing an existing submodule still works."""
    from torch import nn

    from flextensor_runtime.errors import ConfigError
    from tests.runtime.conftest import assert_same, snapshot

    model = tiny_lm()
    before = snapshot(model)
    h = deploy(model, build_profile(model, block_names(model), num_blocks=2, mode=mode))
    up = model.blocks[1].up
    fused = nn.Linear(up.in_features, up.out_features)
    with pytest.raises(ConfigError, match=r"adding TinyLM\.blocks\.1\.fused \(Linear\) while an "):
        model.blocks[1].fused = fused
    with pytest.raises(ConfigError, match=r"call handle\(model\)\.remove\(\), change the model"):
        model.add_module("extra", nn.Identity())
    model.blocks[1].up = up  # the same object, and (below) a replacement, are not additions
    h.remove()
    assert_same(model, before)
    model.blocks[1].fused = fused  # after remove() the model is the user's again
