"""Lazy deployment: a meta-built model filled from a safetensors checkpoint (single or sharded)
straight into pinned host buffers and device memory."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import init_empty_weights
from safetensors.torch import save_file, save_model

from flextensor_runtime.errors import ConfigError, ModelFileError
from flextensor_runtime.lazy_load import Checkpoint
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import TinyLM, block_names, tiny_lm
from tests.runtime.plans import build_profile


def _meta_tiny() -> TinyLM:
    with init_empty_weights(include_buffers=True):
        model = TinyLM().eval()
    return model


def _inner_scales(model: TinyLM) -> dict[str, torch.Tensor]:
    return {f"blocks.{i}.up.weight.scale": b.up.weight.scale for i, b in enumerate(model.blocks)
            if hasattr(b.up.weight, "scale")}  # fmt: skip


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy"])
def test_single_file(tmp_path, mode: str) -> None:
    real = tiny_lm()
    path = tmp_path / "model.safetensors"
    save_model(real, str(path), metadata=None)
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        plain = real(ids)
    profile = build_profile(real, block_names(real), num_blocks=2, prefetch=2, mode=mode)
    meta = _meta_tiny()
    # inner tensor fields are not parameters: a meta model has none, give it the real ones
    for name, t in _inner_scales(real).items():
        block = int(name.split(".")[1])
        meta.blocks[block].up.weight.scale = t.clone()
    assert meta.blocks[1].down.weight.is_meta
    h = deploy(meta, profile, checkpoint=path)
    assert not any(p.is_meta for p in meta.parameters())
    assert meta.head.weight is meta.embed.weight
    with torch.no_grad():
        assert torch.equal(meta(ids), plain)
    h.remove()
    assert not any(p.is_meta for p in meta.parameters())
    with torch.no_grad():
        assert torch.equal(meta(ids), plain)


def test_sharded_index(tmp_path) -> None:
    real = tiny_lm()
    state = {k: v.contiguous() for k, v in real.state_dict().items() if k != "head.weight"}
    names = sorted(state)
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / file))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        plain = real(ids)
    profile = build_profile(real, block_names(real), num_blocks=3, prefetch=2)
    meta = _meta_tiny()
    for name, t in _inner_scales(real).items():
        meta.blocks[int(name.split(".")[1])].up.weight.scale = t.clone()
    deploy(meta, profile, checkpoint=tmp_path / "model.safetensors.index.json")
    with torch.no_grad():
        assert torch.equal(meta(ids), plain)


def test_meta_tensor_missing_from_checkpoint(tmp_path) -> None:
    real = tiny_lm()
    state = {k: v for k, v in real.state_dict().items() if k not in ("head.weight", "norm.bias")}
    save_file(state, str(tmp_path / "part.safetensors"))
    meta = _meta_tiny()
    for name, t in _inner_scales(real).items():
        meta.blocks[int(name.split(".")[1])].up.weight.scale = t.clone()
    profile = build_profile(real, block_names(real))
    with pytest.raises(
        ModelFileError,
        match=r"1 tensor is on the meta device and not in the checkpoint: norm\.bias",
    ):
        deploy(meta, profile, checkpoint=tmp_path / "part.safetensors")
    assert meta.norm.bias.is_meta and "_ft_handle" not in meta.__dict__


def test_checkpoint_reader_converts_and_checks(tmp_path) -> None:
    t = torch.randn(3, 5)
    save_file({"w": t, "s": torch.tensor(2.5)}, str(tmp_path / "c.safetensors"))
    ckpt = Checkpoint(tmp_path / "c.safetensors")
    out = torch.empty(3, 5, dtype=torch.float64)
    ckpt.read_into("w", out)
    assert torch.equal(out, t.double())
    scalar = torch.empty(())
    ckpt.read_into("s", scalar)
    assert scalar.item() == 2.5
    with pytest.raises(ModelFileError, match=r"shape \[3, 5\] but the model expects \[5, 3\]"):
        ckpt.read_into("w", torch.empty(5, 3))
    with pytest.raises(ModelFileError, match="does not exist"):
        Checkpoint(tmp_path / "none.safetensors")
    with pytest.raises(ModelFileError, match="is a folder, not a file"):
        Checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="checkpoint=3 is invalid"):
        Checkpoint(3)  # type: ignore[arg-type]


def test_bad_checkpoint_tensor_midway_leaves_the_model_unchanged(tmp_path) -> None:
    real = tiny_lm()
    state = {k: v + 1 for k, v in real.state_dict().items() if k != "head.weight"}
    state["blocks.2.down.weight"] = torch.zeros(3, 3)  # wrong shape, read after other tensors
    save_file(state, str(tmp_path / "bad.safetensors"))
    before = snapshot(real)
    profile = build_profile(real, block_names(real), num_blocks=2, prefetch=2)
    with pytest.raises(ModelFileError, match=r"blocks\.2\.down\.weight"):
        deploy(real, profile, checkpoint=tmp_path / "bad.safetensors")
    assert_same(real, before)
