"""Compiled profiles deploy: `offload_from_profile` binds them and outputs stay bit-identical.
(Runs where the runtime's deployment module is present.)"""

from __future__ import annotations

import pytest
import torch

from flextensor_compile.compile_api import compile_profile
from flextensor_compile.config import OffloadConfig
from flextensor_runtime.profile import save

deploy = pytest.importorskip(
    "flextensor_runtime.deploy", reason="the runtime is not installed here"
)


def _first(out):
    out = out[0] if isinstance(out, tuple) else out
    return getattr(out, "last_hidden_state", out)


@pytest.mark.parametrize(
    "name", ["tiny_transformer", pytest.param("minilm", marks=pytest.mark.slow)]
)
def test_compiled_profile_deploys_with_identical_outputs(tmp_path, name):
    import importlib

    module = importlib.import_module(f"profiles.{name}")
    run = getattr(module, "run", None) or (lambda model, inputs: model(**inputs))
    reference = module.build_model()
    cfg = OffloadConfig(max_gpu_mem_fraction=0.8, profiling_iters=1, warmup_iters=0)
    profile = compile_profile(
        reference, module.example_inputs, cfg, run=getattr(module, "run", None)
    )
    path = save(profile, tmp_path / "p.msgpack")
    inputs = module.example_inputs()
    with torch.no_grad():
        expected = _first(run(reference, inputs))
        model = deploy.offload_from_profile(module.build_model(), path, device="cpu")
        got = _first(run(model, inputs))
    assert torch.equal(expected, got)
    assert profile.predicted.streamed_bytes > 0


@pytest.mark.parametrize("fraction", [0.5, 0.8])
def test_ring_profile_deploys_with_identical_outputs(tmp_path, fraction):
    """A measured model compiled with the ring assignment deploys (its timings, and so its plan,
    vary by machine; the fixed-timing test below pins split traps and on-entry copies)."""
    from profiles import tiny_transformer as module

    reference = module.build_model()
    cfg = OffloadConfig(max_gpu_mem_fraction=fraction, profiling_iters=1, warmup_iters=0,
                        assignment_strategy="ring", load_strategy="greedy")  # fmt: skip
    profile = compile_profile(reference, module.example_inputs, cfg, run=module.run)
    assert len(profile.blocks) == 1 and profile.predicted.streamed_bytes > 0
    path = save(profile, tmp_path / "ring.msgpack")
    inputs = module.example_inputs()
    with torch.no_grad():
        expected = _first(module.run(reference, inputs))
        model = deploy.offload_from_profile(module.build_model(), path, device="cpu")
        for _ in range(3):  # steady state: cyclic prefetch and block reuse across iterations
            assert torch.equal(expected, _first(module.run(model, inputs)))


def _fixed_timing(mode: str):
    """The tiny transformer's measured stats with fixed timings (so plans are the same on every
    machine), and a ring config at half its weight bytes in transfer mode `mode`."""
    from dataclasses import replace

    from flextensor_compile.sweep import stats_from_profile
    from flextensor_runtime.profile import DeviceSpec, PlanConfig
    from profiles import tiny_transformer as module

    cfg = OffloadConfig(max_gpu_mem_fraction=0.8, profiling_iters=1, warmup_iters=0,
                        granularity="modules")  # fmt: skip
    measured = compile_profile(module.build_model(), module.example_inputs, cfg, run=module.run)
    stats = stats_from_profile(measured)
    stats = replace(stats, device=DeviceSpec("fixed", 1 << 30, 1e9, 0.0, (), "emulated"),
                    traps=tuple(replace(t, compute_ms=0.2) for t in stats.traps))  # fmt: skip
    config = PlanConfig(budget_bytes=measured.model.total_bytes // 2, assignment="ring",
                        strategy="greedy", transfer_mode=mode)  # fmt: skip
    return stats, config


def _deploys_identically(path) -> None:
    """The tiny transformer offloaded from `path` gives the reference outputs, three times."""
    from profiles import tiny_transformer as module

    inputs = module.example_inputs()
    with torch.no_grad():
        expected = _first(module.run(module.build_model(), inputs))
        model = deploy.offload_from_profile(module.build_model(), path, device="cpu")
        for _ in range(3):  # steady state: cyclic prefetch and block reuse across iterations
            assert torch.equal(expected, _first(module.run(model, inputs)))


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_solver_ring_with_on_entry_copies_deploys_with_identical_outputs(tmp_path, mode):
    """A ring plan the solver made, with traps split over several copies and copies issued on
    their own trap's entry."""
    from flextensor_compile.planning import plan_profile

    stats, config = _fixed_timing(mode)
    profile = plan_profile(stats, config)
    assert any(t.issue_at == t.trap for t in profile.schedule)
    assert len(profile.schedule) > len({t.trap for t in profile.schedule})
    _deploys_identically(save(profile, tmp_path / "ring.msgpack"))


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_mirrored_ring_deploys_with_identical_outputs(tmp_path, mode):
    """The mirrored ring placement (traps alternating between the block's ends, outer tensors
    copied while the trap before computes, the rest on entry), emitted and deployed."""
    from dataclasses import replace

    from flextensor_compile.emit import emit_profile
    from flextensor_compile.solve import problem_from_stats, solve
    from flextensor_compile.solve.plan import _ring_plan
    from flextensor_compile.solve.ring import ring_layout, ring_need
    from flextensor_runtime.profile import Meta, check_profile

    stats, config = _fixed_timing(mode)
    problem = problem_from_stats(stats, config)
    sel = solve(problem, "greedy").selection
    slots = tuple(sum(t.items[k].slot_bytes for k in ch)
                  for t, ch in zip(problem.traps, sel, strict=True))  # fmt: skip
    streamed = sum(t.items[k].bytes for t, ch in zip(problem.traps, sel, strict=True) for k in ch)
    pieces = ring_layout(problem, sel, ring_need(problem, slots, sel), mirrored=True)
    assert pieces is not None
    plan = _ring_plan(problem, sel, "greedy", pieces, problem.total_bytes - streamed, streamed)
    config = replace(config, budget_bytes=max(config.budget_bytes or 0, plan.peak_bytes))
    problem = replace(problem, budget_bytes=config.budget_bytes)
    assert any(x.issue_at == x.trap for x in plan.transfers)  # on-entry parts over the last trap
    assert len({x.offset for x in plan.transfers}) > 2  # both ends of the block in use
    profile = emit_profile(stats, config, problem, plan, Meta("test", "test", "", "fixed"))
    check_profile(profile)
    _deploys_identically(save(profile, tmp_path / "mirrored.msgpack"))


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_cover_plan_deploys_with_identical_outputs(tmp_path, mode):
    """Cover selections (the fewest, largest transfers covering the shortfall plus one block of
    m, for each m tried), placed in the ring, emitted and deployed."""
    from dataclasses import replace

    from flextensor_compile.emit import emit_profile
    from flextensor_compile.solve import problem_from_stats
    from flextensor_compile.solve.cover import cover_selections
    from flextensor_compile.solve.families import make_context
    from flextensor_compile.solve.plan import build_plan
    from flextensor_runtime.profile import Meta, check_profile

    stats, config = _fixed_timing(mode)
    stats = replace(stats, traps=tuple(replace(t, compute_ms=0.001) for t in stats.traps))
    problem = problem_from_stats(stats, config)  # copies dominate: the cover applies
    ctx = make_context(problem)
    built = 0
    for m in ctx.cover_sizes:
        for k, sel in enumerate(cover_selections(ctx, m, m)):
            plan = build_plan(problem, sel, 1, "global-tensor-selection", "ring")
            assert plan is not None and plan.peak_bytes <= (problem.budget_bytes or 0)
            assert max(sum(t.items[j].slot_bytes for j in ch)
                       for t, ch in zip(problem.traps, sel, strict=True)) <= m  # fmt: skip
            profile = emit_profile(stats, config, problem, plan, Meta("test", "test", "", "fixed"))
            check_profile(profile)
            _deploys_identically(save(profile, tmp_path / f"cover{m}-{k}.msgpack"))
            built += 1
    assert built >= 2  # two sizes of m on this model


def test_a_model_with_a_layer_repeated_in_a_list_deploys_identically(tmp_path):
    """One layer object at three places (ALBERT-style sharing): its trap runs three times and
    stays resident, the other layers stream, outputs are bit-identical."""
    from tests.compile.test_patterns import _Repeated

    torch.manual_seed(0)
    reference = _Repeated().eval()
    cfg = OffloadConfig(max_gpu_mem_fraction=0.8, profiling_iters=1, warmup_iters=0)
    profile = compile_profile(reference, lambda: (torch.randn(2, 32),), cfg)
    traps = [t.name for t in profile.traps if t.kind == "module"]
    assert traps == ["layers.0", "layers.3", "layers.4", "layers.5", "layers.6"]
    assert next(t for t in profile.traps if t.name == "layers.0").calls == 3
    assert profile.predicted.streamed_bytes > 0
    path = save(profile, tmp_path / "p.msgpack")
    x = torch.randn(2, 32)
    with torch.no_grad():
        expected = reference(x)
        model = _Repeated().eval()
        model.load_state_dict(reference.state_dict())
        got = deploy.offload_from_profile(model, path, device="cpu")(x)
    assert torch.equal(expected, got)


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_tight_ring_under_every_other_plan_deploys_with_identical_outputs(tmp_path, mode):
    """At a budget no plan that hides its copies fits, every trap streams through a ring of
    about one trap's transfer: copies wait for the trap before (stalls), outputs stay exact."""
    from dataclasses import replace

    from flextensor_compile.planning import plan_profile
    from flextensor_compile.solve import problem_from_stats, try_solve
    from flextensor_compile.solve.plan import PlanCache, ring_candidate

    stats, config = _fixed_timing(mode)
    problem = problem_from_stats(stats, replace(config, assignment="optimized-round-robin",
                                                strategy="adaptive"))  # fmt: skip
    every = tuple(tuple(range(len(t.items))) for t in problem.traps)
    tight = ring_candidate(replace(problem, budget_bytes=problem.total_bytes), every,
                           "nth-layer", PlanCache(), tight=True)  # fmt: skip
    assert tight is not None
    budget = problem.total_bytes - tight.streamed_bytes + max(
        sum(problem.traps[o].items[k].slot_bytes for k in ch) for o, ch in enumerate(every)
    )  # the pinned bytes plus the largest trap's transfer
    small = replace(config, budget_bytes=budget, assignment="optimized-round-robin",
                    strategy="adaptive")  # fmt: skip
    plan = try_solve(problem_from_stats(stats, small))
    assert plan is not None and plan.peak_bytes <= budget and plan.simulation.stall_ms > 0
    assert try_solve(problem_from_stats(stats, replace(small, budget_bytes=budget - 4096))) is None
    _deploys_identically(save(plan_profile(stats, small), tmp_path / "tight.msgpack"))
