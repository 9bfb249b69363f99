"""The large real-shaped instances of `python -m bench.plan_quality.large`, built with few layers:
their structure, that every case solves within its budget, and what the command prints (not how
fast: speed is the bench's to report)."""

from __future__ import annotations

import sys

import pytest

from bench.plan_quality import digest, large
from bench.plan_quality.__main__ import lower_bound_ms
from flextensor_compile.solve import solve
from flextensor_compile.stats import TrapStat

BF16 = 2


def _sizes(trap: TrapStat) -> list[int]:
    return [t.bytes for t in trap.tensors]


def test_deepseek_layers_are_dense_first_then_256_experts_and_a_shared_one() -> None:
    stats = large.deepseek_v3(layers=5)
    names = [t.name for t in stats.traps]
    assert names[0] == "embed_tokens" and names[-1] == "lm_head" and len(names) == 2 + 2 * 5
    assert names[1:3] == ["model.layers.0.self_attn", "model.layers.0.mlp"]
    attn, dense, moe = stats.traps[1], stats.traps[2], stats.traps[8]
    assert len(attn.tensors) == 7 and sorted(_sizes(attn))[:2] == [7168 * BF16] * 2
    assert len(dense.tensors) == 3 and _sizes(dense) == [18432 * 7168 * BF16] * 3
    assert [len(t.tensors) for t in stats.traps[2:-1:2]] == [3, 3, 3, 1 + 256 * 3 + 3, 772]
    expert = 2048 * 7168 * BF16
    assert moe.tensors[0].name == "model.layers.3.mlp.gate.weight"
    assert moe.tensors[0].shape == (256, 7168)
    assert _sizes(moe)[1:] == [expert] * (257 * 3)
    assert moe.tensors[-1].name == "model.layers.3.mlp.shared_experts.down_proj.weight"
    assert stats.device.memory_bytes == large.MEMORY_BYTES


def test_qwen_moe_traps_hold_128_experts() -> None:
    stats = large.qwen3_235b(layers=2)
    assert len(stats.traps) == 2 + 2 * 2
    attn, moe = stats.traps[1], stats.traps[2]
    assert len(attn.tensors) == 8 and attn.tensors[1].shape == (8192, 4096)
    assert len(moe.tensors) == 1 + 128 * 3 and moe.tensors[0].shape == (128, 4096)
    assert _sizes(moe)[1:] == [1536 * 4096 * BF16] * (128 * 3)


def test_llama_405b_has_one_trap_per_linear_and_norm_and_gaps_between() -> None:
    layers = 3
    stats = large.llama_405b_leaves(layers=layers)
    linears = [t for t in stats.traps if t.kind != "gap" and t.name.endswith("_proj")]
    norms = [t for t in stats.traps if t.kind != "gap" and t.name.endswith("layernorm")]
    gaps = [t for t in stats.traps if t.kind == "gap"]
    assert len(linears) == layers * 7 and len(norms) == layers * 2 and len(gaps) == layers * 5
    assert len(stats.traps) == layers * 14 + 2 and not stats.untrapped
    assert [t.name for t in stats.traps if t.tensors and t not in linears + norms] == [
        "embed_tokens",
        "lm_head",
    ]
    q = next(t for t in linears if t.name == "model.layers.0.self_attn.q_proj")
    assert _sizes(q) == [16384 * 16384 * BF16]
    assert stats.device.memory_bytes == large.MEMORY_BYTES


def test_the_largest_full_size_budget_fits_the_device() -> None:
    stats = large.deepseek_v3()
    weights = sum(t.bytes for tr in stats.traps for t in tr.tensors)
    assert len(stats.traps) == 2 + 2 * 61 and 1.3e12 < weights < 1.4e12
    assert max(large.FRACTIONS) * weights < large.MEMORY_BYTES


def test_every_case_solves_within_its_budget() -> None:
    cases = large.large_problems(list(large.LARGE_INSTANCES), list(large.FRACTIONS), layers=6)
    assert len(cases) == 3 * 3 and cases[0][0] == "deepseek-v3-moe 0.3"
    for label, problem in cases:
        plan = solve(problem, "adaptive")
        assert problem.budget_bytes is not None
        assert plan.peak_bytes <= problem.budget_bytes, label
        assert plan.makespan_ms >= lower_bound_ms(problem, problem.total_bytes) * (1 - 1e-9)


def test_large_command_on_two_layers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["large", "--instances", "qwen3-235b-moe", "llama-405b-leaves", "--fractions", "0.9",
            "--repeats", "1", "--layers", "2"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    large.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("qwen3-235b-moe: 6 traps, ")
    assert lines[1].startswith("llama-405b-leaves: 30 traps, ")
    assert lines[2].startswith("qwen3-235b-moe 0.9")
    assert lines[3].startswith("llama-405b-leaves 0.9")
    assert " ms  " in lines[2] and "makespan" in lines[2] and " x LB (" in lines[2]
    assert lines[4].startswith("CPU reference loop:") and len(lines) == 5


def test_digests_cover_the_large_instances() -> None:
    keys = [key for key, _ in digest._large_problems(layers=2)]
    assert len(keys) == 9 and len(set(keys)) == 9  # 3 instances x 3 budgets
    assert "large deepseek-v3-moe 0.3" in keys and "large llama-405b-leaves 0.9" in keys
