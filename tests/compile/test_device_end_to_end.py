"""`compile_profile` then `offload_from_profile` on one device, CPU and (on a GPU machine) CUDA:
the model comes back from profiling as it was, inner tensor fields included, and the deployed
model's outputs equal the plain model's on that device."""

from __future__ import annotations

import pytest
import torch

from flextensor_compile.compile_api import compile_profile
from flextensor_compile.config import OffloadConfig
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.model_tensors import iter_model_tensors
from flextensor_runtime.profile import load, save
from tests.runtime.models import on_cuda, tiny_lm


def _snapshot(model: torch.nn.Module) -> dict[str, tuple[torch.device, torch.Tensor]]:
    return {n: (t.device, t.detach().clone()) for n, t, _ in iter_model_tensors(model)}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_profile_then_deploy_on_one_device(tmp_path, device: str) -> None:
    model = tiny_lm()  # a tied head and FP8-style weight.scale fields
    ids = torch.randint(0, 64, (2, 8))
    before = _snapshot(model)
    plain = on_cuda(tiny_lm()) if device == "cuda" else tiny_lm()  # same seed, same weights
    with torch.no_grad():
        want = plain(ids.to(device))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = OffloadConfig(budget_bytes=weights * 3 // 4, device=device, profiling_iters=2)
    profile = compile_profile(model, (ids,), cfg)
    for name, t, _ in iter_model_tensors(model):  # back as it was, inner fields included
        where, value = before[name]
        assert t.device == where and torch.equal(t, value), name
    assert profile.device.kind == ("cuda" if device == "cuda" else "emulated")
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        assert (profile.device.name, profile.device.memory_bytes) == (
            props.name,
            props.total_memory,
        )
        assert 1e9 < profile.device.h2d_bytes_per_s < 1e12
    assert all(t.compute_ms > 0 for t in profile.traps if t.kind == "module")
    assert profile.predicted.streamed_bytes > 0
    save(profile, tmp_path / "p.msgpack")
    offload_from_profile(model, load(tmp_path / "p.msgpack"), device=device)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(ids.to(device)), want)
    handle(model).remove()


@pytest.mark.cuda
def test_a_model_on_the_gpu_stays_there_when_timed_trap_by_trap() -> None:
    from flextensor_compile.discover import discover
    from flextensor_compile.measure import measure_compute
    from flextensor_compile.model_file import normalize_inputs

    model = on_cuda(tiny_lm())
    inputs = normalize_inputs((torch.randint(0, 64, (2, 8), device="cuda"),))
    disc = discover(model, inputs)
    before = _snapshot(model)
    for fit_bytes in (None, -1):  # already there, nothing to move; trap by trap all the same
        timing = measure_compute(model, inputs, None, disc, iters=2, warmup=1,
                                 device=torch.device("cuda"), fit_bytes=fit_bytes)  # fmt: skip
        assert all(timing.compute_ms[t] > 0 for t in disc.plan.traps)
        for name, t, _ in iter_model_tensors(model):
            assert t.device == before[name][0] and torch.equal(t, before[name][1]), name


def test_a_model_placed_for_discovery_goes_back_after_profiling(monkeypatch) -> None:
    # what a GPU run does (place the whole model before discovery, put it back after timing),
    # with clones on the CPU standing in for device copies
    from flextensor_compile import compile_api
    from flextensor_compile.measure.residence import Residence

    class Clones(Residence):
        def placed(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.clone()

    used: list[Residence] = []

    def place_whole(residence: Residence, model: torch.nn.Module) -> bool:
        used.append(residence)
        residence.move(model)
        return True

    monkeypatch.setattr(compile_api, "Residence", Clones)
    monkeypatch.setattr(compile_api, "place_whole", place_whole)
    model = tiny_lm()
    storage = {n: t.data_ptr() for n, t, _ in iter_model_tensors(model)}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # module traps: one measurement, so one placement, whatever the timings
    cfg = OffloadConfig(budget_bytes=weights * 3 // 4, device="cpu", profiling_iters=1,
                        granularity="modules")  # fmt: skip
    profile = compile_profile(model, (torch.randint(0, 64, (2, 8)),), cfg)
    assert len(used) == 1 and isinstance(used[0], Clones) and profile.predicted.streamed_bytes > 0
    assert {n: t.data_ptr() for n, t, _ in iter_model_tensors(model)} == storage


def test_a_placement_failing_part_way_puts_back_what_it_moved(monkeypatch) -> None:
    # e.g. out of device memory half way through placing the model: nothing stays moved
    from flextensor_compile import compile_api
    from flextensor_compile.measure.residence import Residence

    class Clones(Residence):
        def placed(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.clone()

    def place_whole(residence: Residence, model: torch.nn.Module) -> bool:
        residence.move(model.blocks[0])
        raise torch.cuda.OutOfMemoryError("out of memory (stand-in)")

    monkeypatch.setattr(compile_api, "Residence", Clones)
    monkeypatch.setattr(compile_api, "place_whole", place_whole)
    model = tiny_lm()
    storage = {n: t.data_ptr() for n, t, _ in iter_model_tensors(model)}
    with pytest.raises(torch.cuda.OutOfMemoryError):
        compile_profile(model, (torch.randint(0, 64, (2, 8)),), OffloadConfig(device="cpu"))
    assert {n: t.data_ptr() for n, t, _ in iter_model_tensors(model)} == storage


def test_the_stats_record_the_model_as_built_not_its_placed_copies(monkeypatch) -> None:
    # a placed copy is dense and shares no storage: the layout and ties the profile records
    # (and the deployment binds against) must be the built model's
    from flextensor_compile import compile_api
    from flextensor_compile.measure.residence import Residence

    class Clones(Residence):
        def placed(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.clone()

    class Strided(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.a.weight = torch.nn.Parameter(torch.randn(8, 16)[:, :8])  # a column slice
            self.b.weight = torch.nn.Parameter(self.a.weight.data)  # one storage, two Parameters

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    def layout() -> dict[str, tuple]:
        cfg = OffloadConfig(device="cpu", profiling_iters=1, warmup_iters=0)
        c = compile_api.collect_stats(Strided(), (torch.randn(2, 8),), cfg)
        return {t.name: (t.stride, t.tie) for trap in c.stats.traps for t in trap.tensors}

    built = layout()
    assert built["a.weight"][0] == (16, 1) and built["b.weight"][1] == "a.weight"
    monkeypatch.setattr(compile_api, "Residence", Clones)
    monkeypatch.setattr(compile_api, "place_whole", lambda r, model: r.move(model) or True)
    assert layout() == built
