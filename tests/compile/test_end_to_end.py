"""End to end on CPU: model file -> `ftc profile` -> a profile `ftc inspect` reads, for the
bundled transformer, a transformers Llama, a diffusers Flux transformer and the real MiniLM
checkpoint; re-planning the saved stats gives the same bytes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.compile_api import compile_profile, plan_stats
from flextensor_compile.config import OffloadConfig
from flextensor_compile.stats import load_stats
from flextensor_runtime.errors import ModelFileError
from flextensor_runtime.model_tensors import model_tensor_entries
from flextensor_runtime.profile import dumps, fingerprint, load, loads, to_document
from profiles import tiny_transformer

ROOT = Path(__file__).resolve().parents[2]


def _ftc(capsys, *args: str) -> str:
    code = run_guarded(lambda: app(list(args), prog_name="ftc"), False)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_compile_profile_api_binds_to_the_model():
    model = tiny_transformer.build_model()
    # module traps: the traps asserted below, whatever the timings
    cfg = OffloadConfig(
        max_gpu_mem_fraction=0.7, profiling_iters=1, warmup_iters=0, granularity="modules"
    )
    profile = compile_profile(model, tiny_transformer.example_inputs, cfg)  # one plain forward
    assert loads(dumps(profile)) == profile  # passes every format check
    assert profile.model == fingerprint(model_tensor_entries(model))
    assert [t.name for t in profile.traps if t.kind == "module"] == [
        f"blocks.{i}" for i in range(6)
    ]
    assert profile.meta.timing_source == "measured-cpu"
    assert profile.predicted.streamed_bytes > 0
    assert profile.config.mem_fraction == 0.7


def test_cli_profile_then_plan_stats_is_byte_identical(tiny_stats):
    out, stats = tiny_stats
    replanned = plan_stats(load_stats(stats), OffloadConfig(max_gpu_mem_fraction=0.7))
    assert dumps(replanned) == out.read_bytes()
    instr = out.parent / "instr"
    assert {p.name for p in instr.iterdir()} == {"config.json", "discovery.json",
                                                 "measurement.json", "plan.json"}  # fmt: skip
    measurement = json.loads((instr / "measurement.json").read_text())
    assert measurement["timing_source"] == "measured-cpu" and measurement["profiling_iters"] == 1


def _plan_cli(capsys, monkeypatch, stats: Path, out: Path, *options: str) -> bytes:
    argv = ["plan", str(stats), *options, "-o", str(out)]
    monkeypatch.setattr(sys, "argv", ["ftc", *argv])
    _ftc(capsys, *argv)
    return out.read_bytes()


def _without_command(data: bytes) -> dict:
    doc = to_document(loads(data))
    doc["meta"].pop("command")
    return doc


@pytest.fixture(scope="module")
def tiny_stats(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    out, stats = folder / "tiny.msgpack", folder / "stats.json"
    code = run_guarded(lambda: app(["profile", str(ROOT / "profiles/tiny_transformer.py"),
                                    "--mem-fraction", "0.7", "--profiling-iters", "1",
                                    "--warmup-iters", "0", "--save-stats", str(stats),
                                    "--instrument", str(folder / "instr"),
                                    "-o", str(out), "--quiet"], prog_name="ftc"), False)  # fmt: skip
    assert code == 0
    return out, stats


def test_ftc_plan_on_saved_stats_matches_ftc_profile(tiny_stats, tmp_path, capsys, monkeypatch):
    out, stats = tiny_stats
    replanned = _plan_cli(
        capsys, monkeypatch, stats, tmp_path / "b.msgpack", "--mem-fraction", "0.7"
    )
    assert _without_command(replanned) == _without_command(out.read_bytes())


def test_ftc_plan_on_saved_stats_is_byte_identical(tiny_stats, tmp_path, capsys, monkeypatch):
    out, stats = tiny_stats
    replanned = _plan_cli(
        capsys, monkeypatch, stats, tmp_path / "b.msgpack", "--mem-fraction", "0.7"
    )
    assert replanned == out.read_bytes()


def test_the_recorded_command_remakes_the_profile_with_its_seed(tmp_path, capsys):
    """`meta.command` runs as written on the saved stats and gives the same bytes, seed too."""
    import shlex

    out, stats = tmp_path / "a.msgpack", tmp_path / "s.json"
    _ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"), "--target", "rtx4090",
         "--budget", "3MiB", "--seed", "5", "-o", str(out), "--save-stats", str(stats))  # fmt: skip
    command = shlex.split(load(out).meta.command)
    assert command[:2] == ["ftc", "plan"] and "--seed" in command
    again = tmp_path / "b.msgpack"
    _ftc(capsys, "plan", str(stats), *command[2:], "-o", str(again))
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("fraction", ["0.99999999", "0.6666666666666666", "0.6"])
def test_the_recorded_mem_fraction_is_exact(tmp_path, capsys, fraction):
    """Rounded to 6 digits, 0.99999999 was recorded as 1 and the remade budget was a byte more."""
    import shlex

    stats = ROOT / "profiles" / "tiny_transformer.stats.json"
    out, again = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    _ftc(capsys, "plan", str(stats), "--mem-fraction", fraction, "-o", str(out))
    command = shlex.split(load(out).meta.command)
    _ftc(capsys, "plan", str(stats), *command[2:], "-o", str(again))
    assert again.read_bytes() == out.read_bytes()


def test_cli_target_planning_uses_the_roofline(tmp_path, capsys):
    out = tmp_path / "t.msgpack"
    summary = json.loads(_ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"),
                              "--target", "rtx4090", "--budget", "3MiB", "-o", str(out), "--json"))  # fmt: skip
    cost = summary["profiling_cost"]
    # the module plan stalls at 3 MiB, so the default granularity (auto) measures the leaf traps
    # too: one discovery forward each, and no timed forwards (roofline)
    assert (cost["forwards"], cost["warmup_forwards"], cost["profiling_forwards"]) == (2, 0, 0)
    assert summary["traps"] == 6 and summary["timing_source"] == "roofline"
    assert summary["granularity"] == "modules"
    profile = load(out)
    assert profile.meta.timing_source == "roofline" and profile.device.name == "rtx4090"
    assert profile.config.budget_bytes == 3 * 2**20
    assert json.loads(_ftc(capsys, "inspect", str(out), "--json"))["budget_bytes"] == 3 * 2**20


@pytest.mark.parametrize(
    ("model_file", "fraction", "first_trap", "granularity"),
    [
        ("profiles/llama_small.py", "0.9", "model.layers.0", "modules"),
        ("profiles/flux_small.py", "0.9", "transformer_blocks.0", "modules"),
        ("profiles/minilm.py", "0.9", "encoder.layer.0", "modules"),
        ("profiles/llama_small.py", "0.9", "model.layers.0.self_attn.q_proj", "leaves"),
        ("profiles/flux_small.py", "0.9", "transformer_blocks.0.attn.to_q", "leaves"),
        ("profiles/minilm.py", "0.9", "encoder.layer.0.attention.self.query", "leaves"),
    ],
)
def test_real_model_families(tmp_path, capsys, model_file, fraction, first_trap, granularity):
    out = tmp_path / "p.msgpack"
    _ftc(capsys, "profile", str(ROOT / model_file), "--mem-fraction", fraction,
         "--profiling-iters", "1", "--warmup-iters", "0", "--granularity", granularity,
         "-o", str(out), "--quiet")  # fmt: skip
    doc = json.loads(_ftc(capsys, "inspect", str(out), "--json"))
    names = [t["name"] for t in doc["traps"]]
    assert first_trap in names
    assert doc["predicted"]["peak_bytes"] <= doc["budget_bytes"]


def test_meta_device_llama_plans_for_a_target():
    from profiles import llama_small

    model = llama_small.build_model().to("meta")
    cfg = OffloadConfig(target="h100-sxm", budget_bytes=700 * 2**10)
    with pytest.raises(ModelFileError, match=r"meta device.*must not read tensor values"):
        compile_profile(model, llama_small.example_inputs, cfg, run=llama_small.run)  # generate
    profile = compile_profile(model, llama_small.example_inputs, cfg)  # one plain forward
    assert profile.meta.timing_source == "roofline" and profile.device.name == "h100-sxm"
    assert profile.model == fingerprint(model_tensor_entries(model))
    layers = [t for t in profile.traps if t.kind == "module"]
    assert len(layers) == 4 and all(t.compute_ms > 0 for t in layers)
    assert profile.predicted.peak_bytes <= 700 * 2**10


def test_cli_patterns_and_determinism(tmp_path, capsys):
    args = ["profile", str(ROOT / "profiles/tiny_transformer.py"), "--target", "a100-80g",
            "--budget", "4MiB", "--include", "blocks.*.up.weight", "--include", "blocks.*.qkv",
            "--exclude", "blocks.0.*", "--quiet"]  # fmt: skip
    _ftc(capsys, *args, "-o", str(tmp_path / "a.msgpack"))
    _ftc(capsys, *args, "-o", str(tmp_path / "b.msgpack"))
    data = (tmp_path / "a.msgpack").read_bytes()
    assert data == (tmp_path / "b.msgpack").read_bytes()  # a compiled artifact is deterministic
    traps = {t.name: t for t in loads(data).traps if t.kind == "module"}
    assert sorted(traps) == sorted(f"blocks.{i}.{m}" for i in range(1, 6) for m in ("qkv", "up"))
    up = {e.name: e for e in traps["blocks.3.up"].tensors}
    assert set(up) == {"blocks.3.up.weight", "blocks.3.up.bias"}
    assert up["blocks.3.up.bias"].placement == "resident"  # parameter-level: only the weight


def test_cli_class_exclude_keeps_its_modules_resident_and_explain_names_it(tmp_path, capsys):
    """`--exclude class:LayerNorm` inside the block traps: the norms' weights stay resident, and
    `inspect --explain` names the class pattern and the module it matched."""
    out = tmp_path / "ln.msgpack"
    _ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"), "--target", "a100-80g",
         "--exclude", "class:LayerNorm", "--granularity", "modules", "--quiet", "-o", str(out))  # fmt: skip
    assert [t.name for t in load(out).traps if t.kind == "module"] == [
        f"blocks.{i}" for i in range(6)]  # fmt: skip
    doc = json.loads(_ftc(capsys, "inspect", str(out), "--explain", "--json"))
    why = {t["name"]: t for t in doc["explain"]["tensors"]}
    for name in ("blocks.2.attn_norm.weight", "blocks.2.mlp_norm.bias"):
        module = name.rpartition(".")[0]
        assert why[name]["placement"] == "resident"
        assert why[name]["reason"] == ("kept resident: not offloadable: the exclude pattern "
                                       f"'class:LayerNorm' matches the module {module!r} it is in")  # fmt: skip
    assert "not offloadable" not in why["blocks.2.up.weight"]["reason"]


def test_cli_pattern_that_matches_nothing_is_one_line(tmp_path, capsys):
    path = str(ROOT / "profiles/tiny_transformer.py")
    code = run_guarded(lambda: app(["profile", path, "--include", "layers.*", "--target", "l4",
                                    "-o", str(tmp_path / "x.msgpack")], prog_name="ftc"), False)  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("ftc: invalid option: pattern 'layers.*' matches no module or tensor")


@pytest.mark.slow
def test_meta_device_8b_model_file_plans_for_a_target(tmp_path, capsys):
    out = tmp_path / "l8.msgpack"
    summary = json.loads(_ftc(capsys, "profile", str(ROOT / "profiles/llama8b_meta.py"),
                              "--target", "h100-pcie", "--mem-fraction", "0.15", "-o", str(out),
                              "--json"))  # fmt: skip
    assert summary["timing_source"] == "roofline"
    # the 32 layer traps stall at 15%, so the default granularity (auto) measures the 288
    # Linear and norm traps too and keeps them: they plan faster
    assert (summary["granularity"], summary["traps"]) == ("leaves", 288)
    assert summary["profiling_cost"]["forwards"] == 2
    profile = load(out)
    assert profile.model.total_bytes > 15 * 10**9  # bf16 weights of an 8B model, never allocated
    assert profile.predicted.streamed_bytes > 0
    assert profile.predicted.peak_bytes <= int(0.15 * profile.device.memory_bytes)


def test_timing_options_with_target_are_named_unused(tmp_path, capsys):
    out = tmp_path / "t.msgpack"
    summary = json.loads(_ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"),
                              "--target", "rtx4090", "--budget", "6MiB", "--profiling-iters", "50",
                              "-o", str(out), "--json"))  # fmt: skip
    assert summary["profiling_cost"]["profiling_forwards"] == 0
    assert ("--profiling-iters unused: with --target compute times come from the roofline and "
            "no forward is timed") in summary["notes"]  # fmt: skip
    plain = json.loads(_ftc(capsys, "profile", str(ROOT / "profiles/tiny_transformer.py"),
                            "--target", "rtx4090", "--budget", "6MiB", "-o", str(out), "--json"))  # fmt: skip
    assert not any("unused" in n for n in plain["notes"])
