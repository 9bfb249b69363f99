"""End to end on CPU: model file -> `ftc profile` -> a profile `ftc inspect` reads, for the
bundled transformer, a transformers Llama, a diffusers Flux transformer and the real MiniLM
checkpoint; re-planning the saved stats gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.compile_api import compile_profile, plan_stats
from flextensor_compile.config import OffloadConfig
from flextensor_compile.stats import load_stats
from flextensor_runtime.model_tensors import model_tensor_entries
from flextensor_runtime.profile import dumps, fingerprint, load, loads
from profiles import tiny_transformer

ROOT = Path(__file__).resolve().parents[2]


def _ftc(capsys, *args: str) -> str:
    code = run_guarded(lambda: app(list(args), prog_name="ftc"), False)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_compile_profile_api_binds_to_the_model():
    model = tiny_transformer.build_model()
    cfg = OffloadConfig(max_gpu_mem_fraction=0.7, profiling_iters=1, warmup_iters=0)
    profile = compile_profile(model, tiny_transformer.example_inputs, cfg, run=tiny_transformer.run)
    assert loads(dumps(profile)) == profile  # passes every format check
    assert profile.model == fingerprint(model_tensor_entries(model))
    assert [t.name for t in profile.traps if t.kind == "module"] == [
        f"blocks.{i}" for i in range(6)
    ]
    assert profile.meta.timing_source == "measured-cpu"
    assert profile.predicted.streamed_bytes > 0
    assert profile.config.mem_fraction == 0.7


def test_cli_profile_then_plan_from_stats_is_byte_identical(tmp_path, capsys):
    out, stats, instr = tmp_path / "tiny.msgpack", tmp_path / "stats.json", tmp_path / "instr"
    summary = json.loads(_ftc(
        capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"), "--mem-fraction", "0.7",
        "--profiling-iters", "1", "--warmup-iters", "0", "--save-stats", str(stats), "-o", str(out),
        "--json",
        "--instrument", str(instr),
    ))  # fmt: skip
    cost = summary["profiling_cost"]
    assert (cost["discovery_forwards"], cost["warmup_forwards"], cost["profiling_forwards"]) == (
        1,
        0,
        1,
    )
    assert cost["seconds"] > 0 and summary["traps"] == 6
    assert json.loads(_ftc(capsys, "inspect", str(out), "--json"))["traps"]
    assert {p.name for p in instr.iterdir()} >= {"discovery.json", "measurement.json", "plan.json"}
    replanned = plan_stats(load_stats(stats), OffloadConfig(max_gpu_mem_fraction=0.7))
    assert dumps(replanned) == out.read_bytes()


def test_cli_target_planning_uses_the_roofline(tmp_path, capsys):
    out = tmp_path / "t.msgpack"
    text = _ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"), "--target", "rtx4090",
                "--budget", "3MiB", "-o", str(out))  # fmt: skip
    assert (
        "1 forwards (1 discovery, 0 warm-up, 0 profiling)" in " ".join(text.split()) or out.exists()
    )
    profile = load(out)
    assert profile.meta.timing_source == "roofline" and profile.device.name == "rtx4090"
    assert profile.config.budget_bytes == 3 * 2**20


@pytest.mark.parametrize(
    ("model_file", "fraction", "first_trap"),
    [
        ("profiles/llama_small.py", "0.9", "model.layers.0"),
        ("profiles/flux_small.py", "0.9", "transformer_blocks.0"),
        ("profiles/minilm.py", "0.9", "encoder.layer.0"),
    ],
)
def test_real_model_families(tmp_path, capsys, model_file, fraction, first_trap):
    out = tmp_path / "p.msgpack"
    _ftc(capsys, "profile", str(ROOT / model_file), "--mem-fraction", fraction,
         "--profiling-iters", "1", "--warmup-iters", "0", "-o", str(out), "--quiet")  # fmt: skip
    doc = json.loads(_ftc(capsys, "inspect", str(out), "--json"))
    names = [t["name"] for t in doc["traps"]]
    assert first_trap in names
    assert doc["predicted"]["peak_bytes"] <= doc["budget_bytes"]
