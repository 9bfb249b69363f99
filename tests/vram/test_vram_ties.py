"""Tied weights stay tied under VRAM wrappers that move them: an embedding and its output head
wrapped separately share one stored tensor at every placement they share (a cast, the disk
tier's placeholder, a load from disk), so nothing is copied twice and in-place edits reach both.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flextensor_runtime import (
    AutoWrappedLinear,
    AutoWrappedModule,
    DiskMap,
    enable_vram_management,
)

MODULE_MAP = {nn.Linear: AutoWrappedLinear, nn.Embedding: AutoWrappedModule}
BF16 = dict(
    offload_device="cpu",
    offload_dtype=torch.bfloat16,
    computation_device="cpu",
    computation_dtype=torch.float32,
)


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.embed(ids))))


def _model() -> TiedLM:
    torch.manual_seed(0)
    return TiedLM().eval()


def _rounded(dtype: torch.dtype) -> TiedLM:
    """The plain model with its weights rounded to `dtype` (still tied)."""
    model = _model()
    for param in model.parameters():
        param.data = param.data.to(dtype).float()
    return model


IDS = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))


def _run(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)


def _tied(model: nn.Module) -> bool:
    head, embed = model.head.weight, model.embed.module.weight
    return head is embed and head.data_ptr() == embed.data_ptr()


def test_a_cast_offload_placement_keeps_the_tie() -> None:
    model = enable_vram_management(_model(), MODULE_MAP, BF16)
    assert _tied(model) and model.head.weight.dtype == torch.bfloat16
    assert torch.equal(_run(model), _run(_rounded(torch.bfloat16)))
    with torch.no_grad():
        model.embed.module.weight.mul_(0)  # an in-place edit reaches both users
    assert bool((model.head.weight == 0).all())


def test_transitions_keep_the_tie_where_both_share_a_placement() -> None:
    model = enable_vram_management(_model(), MODULE_MAP, BF16)
    model.embed.keep()
    assert model.embed.module.weight.dtype == torch.float32 and not _tied(model)  # apart
    model.head.keep()
    assert _tied(model) and model.head.weight.dtype == torch.float32  # one computation copy
    model.embed.offload()
    model.head.offload()
    assert _tied(model) and model.head.weight.dtype == torch.bfloat16
    assert torch.equal(_run(model), _run(_rounded(torch.bfloat16)))


def test_different_placements_make_separate_correct_copies() -> None:
    half = dict(BF16, offload_dtype=torch.float16)
    model = enable_vram_management(
        _model(), MODULE_MAP, BF16, vram_config_for=lambda name, _: half if name == "head" else None
    )  # the embedding rests in bfloat16, its head in float16: two tensors, each rounded its way
    assert model.embed.module.weight.dtype == torch.bfloat16
    assert model.head.weight.dtype == torch.float16
    plain = _model()
    assert torch.equal(model.head.weight, plain.head.weight.detach().half())
    assert torch.equal(model.embed.module.weight, plain.embed.weight.detach().bfloat16())


def test_disk_tier_shares_the_placeholder_and_reads_once(tmp_path: Path) -> None:
    path = tmp_path / "tied.safetensors"
    state = {k: v.contiguous().clone() for k, v in _model().state_dict().items()}
    save_file(state, str(path))  # both names, as a checkpoint that did not drop the alias
    disk_map = DiskMap(str(path), "cpu")
    config = dict(offload_device="disk", onload_device="disk", computation_device="cpu")
    model = enable_vram_management(_model(), MODULE_MAP, config, disk_map=disk_map)
    assert model.head.weight is model.embed.module.weight  # one meta placeholder
    before = disk_map.materialized_elements
    model.embed.keep()
    model.head.keep()
    assert _tied(model)
    read = disk_map.materialized_elements - before
    assert read == model.embed.module.weight.numel()  # the head took the embedding's copy
    assert torch.equal(_run(model), _run(_model()))


def test_an_edit_between_two_moves_is_not_served_stale() -> None:
    torch.manual_seed(2)
    shared = nn.Parameter(torch.randn(4, 4))
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    first.weight = second.weight = shared
    a = AutoWrappedLinear(first, offload_dtype=torch.bfloat16)
    with torch.no_grad():
        second.weight.add_(1)  # the tied holder edits the original after `a` copied it
    b = AutoWrappedLinear(second, offload_dtype=torch.bfloat16)
    assert b.weight is not a.weight
    assert torch.equal(b.weight, (shared.detach()).bfloat16())


@pytest.mark.parametrize("how", ["deepcopy", "save"])
def test_moved_parameters_still_copy_and_save(how: str) -> None:
    plain = _model()
    original = plain.embed.weight  # keeps the record of what it became
    model = enable_vram_management(plain, MODULE_MAP, BF16)
    assert original is not model.embed.module.weight and original.__dict__
    if how == "deepcopy":
        clone = copy.deepcopy(model)
        assert _tied(clone) and torch.equal(_run(clone), _run(model))
        assert torch.equal(copy.deepcopy(original), original)
    else:
        buffer = io.BytesIO()
        torch.save(original, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)  # weights_only: the record pickles as an empty OrderedDict
        assert torch.equal(loaded, original) and isinstance(loaded, nn.Parameter)


@pytest.mark.cuda
def test_pinned_host_copies_keep_the_tie() -> None:
    config = dict(offload_device="cpu", computation_device="cuda")
    model = enable_vram_management(_model(), MODULE_MAP, config)
    assert _tied(model) and model.head.weight.is_pinned()
    with torch.no_grad():
        out = model(IDS.cuda())
        expected = _model().cuda()(IDS.cuda())
    assert torch.equal(out, expected)
