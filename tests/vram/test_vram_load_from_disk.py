"""`load_from_disk` in place is a transition: `stored` and `state` follow the placement the
weights were read to (2 at the computation placement, 0 at the offload placement, else 1), as
after `keep()`, `offload()` or `onload()`; the clone path leaves both as they were."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime import AutoWrappedLinear, AutoWrappedModule, DiskMap
from flextensor_runtime.vram.placement import Placement
from tests.vram.conftest import small_block

STAGES = dict(
    offload_device="disk",
    onload_device="cpu",
    onload_dtype=torch.bfloat16,
    computation_device="cpu",
    computation_dtype=torch.float32,
)


@pytest.fixture
def disk_map(block_disk_map: DiskMap) -> DiskMap:
    return block_disk_map


def _wrapped(
    kind: str, disk_map: DiskMap, **stages: object
) -> AutoWrappedModule | AutoWrappedLinear:
    if kind == "linear":
        return AutoWrappedLinear(small_block()[0], name="blk.0", disk_map=disk_map, **stages)
    return AutoWrappedModule(small_block(), name="blk", disk_map=disk_map, **stages)


@pytest.mark.parametrize("kind", ["module", "linear"])
@pytest.mark.parametrize(
    ("dtype", "state"), [(torch.float32, 2), (torch.bfloat16, 1)], ids=["computation", "onload"]
)
def test_loading_in_place_sets_stored_and_state(
    disk_map: DiskMap, kind: str, dtype: torch.dtype, state: int
) -> None:
    w = _wrapped(kind, disk_map, **STAGES)
    assert w.stored.on_disk and w.state == 0
    w.load_from_disk(dtype, "cpu")  # in place: copy_module=False / assign=True
    assert w.stored == Placement(dtype, "cpu") and w.state == state
    assert all(p.device.type == "cpu" and p.dtype == dtype for p in w.parameters())


@pytest.mark.parametrize("kind", ["module", "linear"])
def test_loading_to_the_offload_placement_is_state_0(disk_map: DiskMap, kind: str) -> None:
    w = _wrapped(kind, disk_map, offload_device="cpu", offload_dtype=torch.bfloat16,
                 computation_device="cpu", computation_dtype=torch.float32)  # fmt: skip
    w.keep()
    assert w.state == 2
    w.load_from_disk(torch.bfloat16, "cpu")
    assert w.stored == w.stages.offload and w.state == 0


@torch.no_grad()
def test_a_kept_module_after_the_load_runs_its_stored_weights(disk_map: DiskMap) -> None:
    x = torch.randn(2, 4)
    expected = small_block()(x)
    w = _wrapped("module", disk_map, **STAGES)
    w.load_from_disk(torch.float32, "cpu")
    assert w.state == 2 and w.holds(w.stages.computation)
    stored = w.module[0].weight
    assert torch.equal(w(x), expected) and w.module[0].weight is stored
    w.offload()
    assert w.stored.on_disk and w.state == 0


@pytest.mark.parametrize("kind", ["module", "linear"])
def test_the_clone_path_leaves_stored_and_state(disk_map: DiskMap, kind: str) -> None:
    w = _wrapped(kind, disk_map, **STAGES)
    if kind == "linear":
        weight, _ = w.load_from_disk(torch.float32, "cpu", assign=False)
        assert weight.device.type == "cpu"
    else:
        clone = w.load_from_disk(torch.float32, "cpu", copy_module=True)
        assert clone is not w.module
    assert w.stored.on_disk and w.state == 0
    assert all(p.device.type == "meta" for p in w.parameters())
