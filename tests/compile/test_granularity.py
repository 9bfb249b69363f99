"""Trap granularity: `leaves` splits selected modules into the modules that own their weights,
`auto` measures both and keeps the better plan; leaf profiles deploy bit-identical."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.compile_api import (
    collect_stats,
    compile_profile,
    instrumentation,
    summary_document,
)
from flextensor_compile.config import OffloadConfig
from flextensor_compile.discover.patterns import leaf_traps, select_traps
from flextensor_compile.emit import emit_profile
from flextensor_compile.solve import problem_from_stats
from flextensor_compile.solve.grouping import (
    group_traps,
    issued_early,
    lift_plan,
    merged_problem,
)
from flextensor_compile.solve.plan import PlanCache
from flextensor_compile.solve.strategies import _solve
from flextensor_compile.sweep import weight_bytes
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.errors import BudgetError, ConfigError
from flextensor_runtime.profile import Meta, PlanConfig, check_profile, occupied_slots
from profiles import tiny_transformer
from tests.compile import models
from tests.runtime.conftest import assert_same, snapshot
from tests.runtime.deferred_backend import DeferredBackend

ROOT = Path(__file__).resolve().parents[2]


class _Scaled(nn.Module):
    """A block with a direct parameter: `gain` tiny (split) or `table` large (kept whole)."""

    def __init__(self, big: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.out = nn.Linear(64, 64)
        self.gain = nn.Parameter(torch.ones(64 * 64 if big else 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x))) * self.gain[:1]


def test_leaf_rule() -> None:
    block = models.Block()
    assert [p for p, _ in leaf_traps("b", block)] == ["b.fc1", "b.fc2", "b.norm"]
    assert [p for p, _ in leaf_traps("s", _Scaled(big=False))] == ["s.fc", "s.out"]
    assert [p for p, _ in leaf_traps("s", _Scaled(big=True))] == ["s"]
    assert leaf_traps("r", nn.ReLU()) == []


def test_select_traps_at_leaf_granularity() -> None:
    model = models.Stack()
    sel = select_traps(model, ("layers.*",), (), leaves=True)
    assert sel.traps == tuple(f"layers.{i}.{n}" for i in range(3) for n in ("fc1", "fc2", "norm"))
    assert all(sel.only[t] is None for t in sel.traps)
    sel = select_traps(model, ("layers.*",), ("layers.1.fc2",), leaves=True)
    assert "layers.1.fc2" not in sel.traps and "layers.1.fc1" in sel.traps
    sel = select_traps(model, ("layers.*.fc?.weight",), (), leaves=True)  # parameter level: as is
    assert sel.only["layers.1.fc2"] == frozenset({"layers.1.fc2.weight"})


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_leaf_profile_deploys_bit_identical(mode: str) -> None:
    model = tiny_transformer.build_model()
    x = tiny_transformer.example_inputs()
    with torch.no_grad():
        plain = model(*x)
    before = snapshot(model)
    cfg = OffloadConfig(max_gpu_mem_fraction=0.5, granularity="leaves", transfer_mode=mode,
                        profiling_iters=1, warmup_iters=0)  # fmt: skip
    profile = compile_profile(model, x, cfg)
    names = {t.name for t in profile.traps if t.kind == "module"}
    assert "blocks.0.qkv" in names and "blocks.0" not in names
    assert profile.schedule  # something streams at half the weights
    offload_from_profile(model, profile, backend=CpuBackend())
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(*x), plain)
    handle(model).remove()
    assert_same(model, before)


def test_transformers_llama_at_leaves_deploys_bit_identical() -> None:
    from profiles import llama_small

    model = llama_small.build_model()
    ids = llama_small.example_inputs()
    with torch.no_grad():
        plain = model(**ids).logits
    cfg = OffloadConfig(max_gpu_mem_fraction=0.8, granularity="leaves", profiling_iters=1,
                        warmup_iters=0)  # fmt: skip
    profile = compile_profile(model, ids, cfg)
    assert "model.layers.0.self_attn.q_proj" in {t.name for t in profile.traps}
    assert profile.schedule
    offload_from_profile(model, profile, backend=CpuBackend())
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, plain)
        assert torch.equal(model(**ids).logits, plain)
    handle(model).remove()


def _llama_meta(hidden: int = 512, layers: int = 4) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2)  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _ids() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(1, 512, dtype=torch.long)}


class _Phases:
    """A progress sink that records the phases started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, phase: str, total: int) -> None:
        self.started.append(phase)

    def advance(self, phase: str) -> None:
        assert phase in self.started


def test_auto_keeps_the_better_plan_and_says_why() -> None:
    model = _llama_meta()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kept = {}
    for fraction in (0.5, 1.0):
        cfg = OffloadConfig(target="rtx4090", budget_bytes=int(fraction * weights),
                            granularity="auto")  # fmt: skip
        sink = _Phases()
        c = collect_stats(model, _ids, cfg, progress=sink)
        phases = sink.started
        kept[fraction] = c.granularity
        assert phases[0] == "discovery"
        assert ("discovery (leaves)" in phases) == (c.cost.forwards == 2)
        assert c.notes[-1].startswith("granularity auto: kept ")
        if fraction == 1.0:  # everything fits: leaves are not even measured
            assert c.cost.forwards == 1 and "not measured" in c.notes[-1]
        else:
            assert c.cost.forwards == 2 and "leaves (" in c.notes[-1]
            forced = {}
            for g in ("modules", "leaves"):
                p = compile_profile(model, _ids, cfg.replace(granularity=g))
                forced[g] = p.predicted.makespan_ms
            auto = compile_profile(model, _ids, cfg).predicted.makespan_ms
            assert auto == forced[c.granularity]
    assert kept[1.0] == "modules"
    assert kept[0.5] == "leaves"  # finer traps need less staging at half the weights


def _ftc(capsys, *args: str) -> tuple[int, str, str]:
    code = run_guarded(lambda: app(list(args), prog_name="ftc"), False)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_granularity(tmp_path, capsys) -> None:
    out = tmp_path / "p.msgpack"
    code, stdout, err = _ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"),
                             "--target", "rtx4090", "--budget", "3MiB", "--granularity", "leaves",
                             "-o", str(out), "--json")  # fmt: skip
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["granularity"] == "leaves" and summary["traps"] > 6
    code, _, err = _ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"),
                        "--granularity", "leaf", "-o", str(out))  # fmt: skip
    assert code != 0 and "granularity 'leaf' is not known; did you mean 'leaves'?" in err
    with pytest.raises(ConfigError, match="--granularity"):
        OffloadConfig(granularity="layers")


def test_a_stalling_module_plan_names_granularity_auto(tmp_path, capsys) -> None:
    out, model = tmp_path / "p.msgpack", str(ROOT / "profiles/tiny_transformer.py")
    notes = {}
    for budget, granularity in (("3MiB", "modules"), ("6MiB", "modules"), ("3MiB", "leaves")):
        code, stdout, err = _ftc(capsys, "profile", model, "--target", "rtx4090", "--budget",
                                 budget, "--granularity", granularity, "-o", str(out), "--json")  # fmt: skip
        assert code == 0, err
        summary = json.loads(stdout)
        hinted = any("--granularity auto" in n for n in summary["notes"])
        notes[budget, granularity] = (hinted, summary["predicted"]["stall_ms"] > 0)
    assert notes["3MiB", "modules"] == (True, True)  # stalls: the hint
    assert notes["6MiB", "modules"] == (False, False)  # hides every copy: nothing to gain
    assert notes["3MiB", "leaves"][0] is False  # already finer traps


def test_auto_takes_leaves_where_only_they_fit() -> None:
    """Leaf traps stage less, so a budget between the two smallest feasible budgets fits only
    them; auto keeps them and says modules fit no plan."""
    model = tiny_transformer.build_model()
    x = tiny_transformer.example_inputs()
    cfg = OffloadConfig(target="rtx4090", budget_bytes=800_000, granularity="auto")
    with pytest.raises(BudgetError):
        compile_profile(model, x, cfg.replace(granularity="modules"))
    with pytest.raises(BudgetError, match="pass --granularity auto: traps at the modules inside") as hinted:
        compile_profile(model, x, cfg.replace(granularity="modules"))
    assert hinted.value.least_bytes is not None  # the re-plan command names the budget that fits
    c = collect_stats(model, x, cfg)
    assert c.granularity == "leaves" and "fit no plan" in c.notes[-1]
    profile = compile_profile(model, x, cfg)
    assert profile.predicted.peak_bytes <= 800_000
    with pytest.raises(BudgetError) as info:  # below what leaves need too: their error
        compile_profile(model, x, cfg.replace(budget_bytes=500_000))
    with pytest.raises(BudgetError) as coarse:
        compile_profile(model, x, cfg.replace(budget_bytes=500_000, granularity="modules"))
    asked = [int(re.search(r"at least (\d+) bytes", str(e.value)).group(1)) for e in (info, coarse)]
    assert asked[0] < asked[1]


@pytest.mark.parametrize("early", [False, True])
def test_a_lifted_layout_deploys_bit_identical_with_deferred_copies(early: bool) -> None:
    """A plan of the leaves merged by stack element, its layout lifted back (`lift_plan`), holds
    several leaf transfers in flight in one block of a two-block layout: each must land in its
    own bytes and be waited for by its own trap, with copies run as late as a copy stream may."""
    from profiles import llama_small

    model = llama_small.build_model()
    ids = llama_small.example_inputs()
    with torch.no_grad():
        plain = model(**ids).logits
    cfg = OffloadConfig(granularity="leaves", target="h100-pcie", budget_bytes=1 << 40)
    stats = collect_stats(model, ids, cfg).stats
    weights = weight_bytes(stats)
    config = PlanConfig(budget_bytes=weights * 3 // 4, num_blocks=2, min_blocks=2)
    problem = problem_from_stats(stats, config)
    groups = group_traps(problem, "element")
    assert groups is not None
    coarse = _solve(merged_problem(problem, groups), "adaptive", grouped=False)
    plan = lift_plan(problem, groups, coarse, PlanCache())
    if early:  # each copy issued as soon as the bytes it overwrites are free
        lifted, plan = plan, issued_early(problem, plan, PlanCache())
        assert [x.issue_at for x in plan.transfers] != [x.issue_at for x in lifted.transfers]
    profile = emit_profile(stats, config, problem, plan, Meta("t", "t", "", stats.timing_source))
    check_profile(profile)
    n = len(profile.traps)
    shared = [(a, b) for a, b in itertools.combinations(profile.schedule, 2)
              if a.block == b.block and set(occupied_slots(a, n)) & set(occupied_slots(b, n))]  # fmt: skip
    assert shared and len(profile.blocks) == 2  # transfers share a block while in flight
    before = snapshot(model)
    backend = DeferredBackend()
    offload_from_profile(model, profile, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(**ids).logits, plain)
    assert backend.ran > 0 and backend.most_queued > 1
    handle(model).remove()
    assert_same(model, before)


def test_instrumentation_counts_iterations_per_measurement() -> None:
    from flextensor_compile.compile_api import INSTRUMENT_PARTS
    from profiles import tiny_transformer

    weights = sum(p.numel() * p.element_size() for p in tiny_transformer.build_model().parameters())
    # a slow link: the module plan stalls, so auto measures the leaf traps too
    cfg = OffloadConfig(device="cpu", device_memory_bytes=weights, h2d_bytes_per_s=1e6,
                        budget_bytes=weights * 7 // 10, warmup_iters=1, profiling_iters=2)  # fmt: skip
    c = collect_stats(tiny_transformer.build_model(), tiny_transformer.example_inputs, cfg)
    doc = instrumentation(c)
    assert tuple(doc) == INSTRUMENT_PARTS  # `ftc profile` checks these files against its outputs
    measurement = doc["measurement"]
    assert measurement["measurements"] == 2 and c.cost.forwards == 2 * (1 + 1 + 2)
    assert (measurement["warmup_iters"], measurement["profiling_iters"]) == (1, 2)
    assert measurement["cost"]["forwards"] == 8


def test_auto_does_not_measure_leaves_that_are_the_module_traps() -> None:
    """Traps that are plain Linears (weight and bias of one module) have no finer traps: a
    stalling plan does not send auto to measure the same traps again, and no hint names it."""
    from flextensor_compile.trap_granularity import splittable

    model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(6)))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = OffloadConfig(target="rtx4090", budget_bytes=weights // 2, h2d_bytes_per_s=1e6,
                        granularity="auto", include_patterns=("?",))  # fmt: skip
    c = collect_stats(model, lambda: (torch.ones(1, 256),), cfg)
    assert not splittable(c.stats) and c.cost.forwards == 1
    assert c.notes[-1] == ("granularity auto: kept module traps; each holds one module's "
                           "weights, so leaf traps would be the same")  # fmt: skip
    modules = collect_stats(
        model, lambda: (torch.ones(1, 256),), cfg.replace(granularity="modules")
    )
    profile = compile_profile(
        model, lambda: (torch.ones(1, 256),), cfg.replace(granularity="modules")
    )
    assert profile.predicted.stall_ms > 0
    assert not any(
        "--granularity auto" in n for n in summary_document(modules, profile, "p")["notes"]
    )


class _Stack(nn.Module):
    """Linears in a ModuleList (iterated, never called) and a head called directly."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(128, 128) for _ in range(4))
        self.head = nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def test_auto_measures_leaves_inside_a_selected_module_that_never_ran() -> None:
    """`--include layers` on a ModuleList: as a module trap it never runs and its weights stay
    resident; each trap that ran held one module's weights, so auto said leaf traps 'would be
    the same', kept modules, and failed a budget the leaf traps (its Linears) fit."""
    torch.manual_seed(0)
    model = _Stack().eval()
    cfg = OffloadConfig(target="rtx4090", budget_bytes=200 * 1024, granularity="auto",
                        include_patterns=("layers", "head"))  # fmt: skip
    with pytest.raises(BudgetError):
        compile_profile(model, lambda: (torch.ones(1, 128),), cfg.replace(granularity="modules"))
    c = collect_stats(model, lambda: (torch.ones(1, 128),), cfg)
    assert c.granularity == "leaves" and "modules (1 trap) fit no plan" in c.notes[-1]
    profile = compile_profile(model, lambda: (torch.ones(1, 128),), cfg)
    assert profile.predicted.peak_bytes <= 200 * 1024 and profile.predicted.streamed_bytes > 0
