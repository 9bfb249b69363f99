"""Disk-tier wrappers on tied weights read them under the name the checkpoint saved.

A checkpoint of a model with tied weights holds the shared tensor once (transformers'
`save_pretrained` keeps `model.embed_tokens.weight` and drops `lm_head.weight`); the head's wrapper asked for `lm_head.weight` and was refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    DiskMap,
    enable_vram_management,
    skip_model_initialization,
)
from flextensor_runtime.errors import DiskMapError

DISK = dict(offload_device="disk", onload_device="disk", computation_device="cpu")
MODULE_MAP = {nn.Linear: AutoWrappedLinear, nn.Embedding: AutoWrappedModule}


def _llama(meta: bool) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    if not meta:
        return LlamaForCausalLM(config).eval()
    with skip_model_initialization():
        return LlamaForCausalLM(config).eval()


def test_tied_head_reads_the_saved_embedding(tmp_path) -> None:
    plain = _llama(meta=False)
    plain.save_pretrained(tmp_path)  # the tie is saved once, as model.embed_tokens.weight
    disk_map = DiskMap(tmp_path, "cpu")
    assert "lm_head.weight" not in disk_map
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    module_map = {**MODULE_MAP, LlamaRMSNorm: AutoWrappedModule}
    model = enable_vram_management(_llama(meta=True), module_map, DISK, disk_map=disk_map)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert "lm_head.weight" not in disk_map  # the user's map is not changed


def test_untied_missing_key_is_still_refused(tmp_path) -> None:
    plain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    save_model(plain[:1], str(tmp_path / "model.safetensors"))  # only "0.*"
    disk_map = DiskMap(tmp_path / "model.safetensors", "cpu")
    with pytest.raises(DiskMapError, match=r"no tensor '1\.weight'"):
        enable_vram_management(plain, {nn.Linear: AutoWrappedLinear}, DISK, disk_map=disk_map)


def test_profile_vram_section_reads_a_tie_saved_once(tmp_path) -> None:
    """A profile's `vram` section listing every tensor on disk, the tied head among them, is
    installed on a model built on meta (it was refused: 'lm_head.weight' is not in the
    checkpoint)."""
    from dataclasses import replace

    from flextensor_runtime.vram.section_install import install
    from flextensor_runtime.vram.vram_section import parse_vram_spec

    plain = _llama(meta=False)
    plain.save_pretrained(tmp_path)
    spec = "map=Linear:linear,Embedding:module,LlamaRMSNorm:module;computation_device=cpu"
    names = tuple(n for n, _ in plain.named_parameters(remove_duplicate=False))
    assert "lm_head.weight" in names
    section = replace(parse_vram_spec(spec), disk_tensors=names)
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        model = install(_llama(meta=True), section, DiskMap(tmp_path, "cpu"))
        assert torch.equal(model(input_ids=ids).logits, expected)
