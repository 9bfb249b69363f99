"""What `remove()` does with weights other code changed while a profile was installed."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.conftest import deploy
from tests.runtime.models import TinyLM, block_names, tiny_llama, tiny_lm
from tests.runtime.plans import build_profile

MODES = ["allocation_block_transfer", "strategy", "raw_block_transfer"]


def _deployed(model: TinyLM, mode: str, streamed: str):
    """`model` deployed with its blocks as traps and `streamed` streaming (two blocks): (model,
    ids, the plain model's output on ids, its snapshot before deploying, the handle)."""
    from tests.runtime.conftest import snapshot

    ids = torch.tensor([[1, 5, 9, 63]])
    with torch.no_grad():
        plain = model(ids)
    before = snapshot(model)
    h = deploy(model, build_profile(model, block_names(model), streamed=[streamed],
                                    num_blocks=2, mode=mode))  # fmt: skip
    return model, ids, plain, before, h


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


@pytest.mark.parametrize("mode", MODES)
def test_resize_token_embeddings_while_deployed_is_refused(mode) -> None:
    """It rebuilt the streamed embeddings and head from their values outside their traps
    (one-element placeholders in the strategy and raw modes, whatever the block last held in
    allocation mode): logits off by up to 0.54, silently, and in the strategy and raw modes the
    next trap put the 128 old rows back. Now it is refused before any change, with the fix."""
    from flextensor_runtime.errors import ConfigError
    from tests.runtime.conftest import assert_same, snapshot

    model = tiny_llama()
    ids = torch.tensor([[1, 2, 3, 127]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    before = snapshot(model)
    traps = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    h = deploy(model, build_profile(model, traps, num_blocks=2, mode=mode))
    placed = {e.name: e.placement for e in h.profile.all_tensors()}
    assert placed["model.embed_tokens.weight"] == placed["lm_head.weight"] == "streamed"
    with torch.no_grad():
        model(input_ids=ids)
    fix = r"resize before deploying: call handle\(model\)\.remove\(\), then resize_token_embeddings"
    with pytest.raises(ConfigError, match=r"^LlamaForCausalLM\.resize_token_embeddings\(\) while an "
                       rf"offload profile is installed is not supported: .*; {fix}"):  # fmt: skip
        model.resize_token_embeddings(160, mean_resizing=False)
    with pytest.raises(ConfigError, match=r"^LlamaForCausalLM\.model\.resize_token_embeddings"):
        model.model.resize_token_embeddings(pad_to_multiple_of=64)
    assert model.resize_token_embeddings() is model.model.embed_tokens  # only returns it
    assert model.config.vocab_size == 128
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain)
    h.remove()
    assert_same(model, before)
    model.resize_token_embeddings(160, mean_resizing=False)  # the fix: resize, then deploy
    assert model.model.embed_tokens.weight.shape == (160, 64)
    assert model.lm_head.weight.shape == (160, 64)


@pytest.mark.parametrize("mode", MODES)
def test_replacing_a_profile_weight_with_another_parameter_is_refused(mode) -> None:
    """`up.weight = nn.Parameter(...)` put an object the runtime does not fill where a streamed
    weight was; a streamed weight registered under another name was read outside its trap.
    Both, and replacing a resident weight, are refused before any change."""
    from torch import nn

    from flextensor_runtime.errors import ConfigError
    from tests.runtime.conftest import assert_same

    model, ids, plain, before, h = _deployed(tiny_lm(), mode, "blocks.1")
    up = model.blocks[1].up
    with pytest.raises(ConfigError, match=r"^replacing the streamed weight TinyLM\.blocks\.1\.up\."
                       r"weight with another parameter while an offload profile is installed is "
                       r"not supported: .*; call handle\(model\)\.remove\(\), change the weights"):  # fmt: skip
        up.weight = nn.Parameter(torch.zeros_like(up.weight))
    with pytest.raises(ConfigError, match=r"^replacing the resident weight TinyLM\.norm\.weight "):
        model.norm.weight = nn.Parameter(torch.ones(32))
    with pytest.raises(ConfigError, match=r"^setting TinyLM\.blocks\.0\.alias to a streamed weight"):
        model.blocks[0].alias = up.weight
    up.weight = up.weight  # the same object (tie_weights on tied weights): nothing changes
    model.head.weight = model.embed.weight
    model.blocks[0].extra = nn.Parameter(torch.ones(1))  # a new weight, not the profile's
    del model.blocks[0].extra
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    h.remove()
    assert_same(model, before)
    up.weight = nn.Parameter(torch.zeros_like(up.weight))  # after remove() it is the user's


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


def _tiny_bert_mlm():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32,
                        tie_word_embeddings=True)  # fmt: skip
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.normal_()  # zeros at init would hide a wrong copy
    return model


@pytest.mark.parametrize("mode", MODES)
def test_tie_weights_while_deployed_keeps_the_weights(mode) -> None:
    """transformers' tie_weights sets the output bias's `bias.data = pad(bias.data, ...)` even
    when it has its size. On a deployed model it read the streamed bias outside its trap: in
    allocation mode it kept a copy of whatever the memory block held (logits off by up to 7e34,
    NaN with 3 blocks), in every mode remove() kept that copy (a zero placeholder's in the
    strategy and raw modes). Now it runs on the true values and changes nothing."""
    from tests.runtime.conftest import assert_same, snapshot

    model = _tiny_bert_mlm()
    ids = torch.tensor([[1, 5, 9, 63, 2]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    before = snapshot(model)
    traps = ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls"]
    h = deploy(model, build_profile(model, traps, num_blocks=2, mode=mode))
    placed = {e.name: e.placement for e in h.profile.all_tensors()}
    assert placed["cls.predictions.bias"] == placed["cls.predictions.decoder.bias"] == "streamed"
    model.tie_weights()  # before any forward: the bias's block holds another transfer
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain)
    model.tie_weights()
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain)
    model.tie_weights()
    h.remove()
    assert_same(model, before)
    assert "tie_weights" not in model.__dict__ and "tie_weights" not in model.bert.__dict__


class _Retied(TinyLM):
    """A `tie_weights` that changes a streamed value by replacing its data (`p.data = t`)."""

    def tie_weights(self) -> None:
        up = self.blocks[1].up
        up.bias.data = torch.nn.functional.pad(up.bias.data, (0, 0)) + 1


@pytest.mark.parametrize("mode", MODES)
def test_tie_weights_that_changes_a_value_while_deployed_is_refused_and_undone(mode) -> None:
    from flextensor_runtime.errors import ConfigError
    from tests.runtime.conftest import assert_same

    torch.manual_seed(0)
    model, ids, plain, before, h = _deployed(_Retied().eval(), mode, "blocks.1")
    with pytest.raises(ConfigError, match=r"^_Retied\.tie_weights\(\) changed blocks\.1\.up\.bias "
                       r"while an offload profile is installed, which is not supported .*the change "
                       r"was undone: call handle\(model\)\.remove\(\), then tie_weights\(\)"):  # fmt: skip
        model.tie_weights()
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    h.remove()
    assert_same(model, before)
    model.tie_weights()  # after remove() it is the user's call
    assert torch.equal(model.blocks[1].up.bias, before.tensors["blocks.1.up.bias"][1] + 1)


def _empty(model: TinyLM, case: str) -> tuple[str, str]:
    """Empty one streamed tensor's slot as `case` says; its name and the word for how."""
    up = model.blocks[0].up
    if case == "weight=None":
        up.weight = None
        return "blocks.0.up.weight", "set to None"
    if case == "bias=None":  # the layer would run without its bias, silently
        up.bias = None
        return "blocks.0.up.bias", "set to None"
    if case == "del weight":
        del up.weight
        return "blocks.0.up.weight", "deleted"
    del up.weight.scale  # an inner tensor field
    return "blocks.0.up.weight.scale", "deleted"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["weight=None", "bias=None", "del weight", "del weight.scale"])
def test_a_streamed_tensor_set_to_none_or_deleted_is_refused_at_its_next_trap(mode, case) -> None:
    """`module.weight = None` and `del module.weight` reach no torch hook: the trap's next forward
    crashed in torch (`linear(): argument 'weight' must be Tensor, not NoneType`) or, for a bias,
    ran without it while the runtime kept streaming it. Now that trap's entry refuses with the
    tensor's name and the fix, and leaves the schedule intact."""
    from flextensor_runtime.errors import ConfigError
    from tests.runtime.conftest import assert_same

    model, ids, plain, before, h = _deployed(tiny_lm(), mode, "blocks.0")
    up = model.blocks[0].up
    held = dict(up._parameters), dict(vars(up.weight))
    with torch.no_grad():
        model(ids)
    name, how = _empty(model, case)
    with torch.no_grad(), pytest.raises(ConfigError, match=rf"^{name} was {how} while an offload "
                                        r"profile is installed: trap 'blocks\.0' streams it .*; "
                                        r"call handle\(model\)\.remove\(\) first"):  # fmt: skip
        model(ids)
    up._parameters.update(held[0])  # put it back behind the guards' backs: runs as planned
    vars(up.weight).update(held[1])
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    h.remove()
    assert_same(model, before)
