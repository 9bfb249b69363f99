"""`ftc profile --cache/--vram/--host-memory/--checkpoint`: the sections written next to the plan,
deployed on CPU with the plan's streaming; the plan itself is unchanged by them."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.config import OffloadConfig
from flextensor_compile.profile_sections import add_sections, plan_host_disk_tier, section_options
from flextensor_compile.stats import load_stats
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import handle, offload_from_profile
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import dumps, load
from flextensor_runtime.vram.section_deploy import section_targets, streamed_tensor_names
from flextensor_runtime.vram.vram_section import parse_vram_spec, vram_section_from_extensions
from profiles import tiny_transformer
from tests.runtime.conftest import assert_same, snapshot

ROOT = Path(__file__).resolve().parents[2]
VRAM = "map=Linear:linear,LayerNorm:module;offload_device=cpu;computation_device=cpu"
CACHE = "fixed-step:module=blocks.5;skip=1"
HOST = 3_500_000  # the plan's 2.81 MiB of streamed bytes plus part of the wrapped modules


def _ftc(*args: str) -> int:
    return run_guarded(lambda: app(list(args), prog_name="ftc"), False)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sections")
    ckpt = folder / "tiny.safetensors"
    state = tiny_transformer.build_model().state_dict()
    save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, str(ckpt))
    paths = {"ckpt": ckpt, "profile": folder / "p.msgpack", "stats": folder / "stats.json"}
    code = _ftc("profile", str(ROOT / "profiles/tiny_transformer.py"), "--target", "rtx4090",
                "--budget", "3MiB", "--quiet",
                "--save-stats", str(paths["stats"]), "-o", str(paths["profile"]),
                "--cache", CACHE, "--vram", VRAM, "--host-memory", str(HOST),
                "--checkpoint", str(ckpt))  # fmt: skip
    assert code == 0
    return paths


@torch.no_grad()
def test_profile_with_sections_deploys_and_drives_steps(compiled) -> None:
    model = tiny_transformer.build_model()
    (ids,) = tiny_transformer.example_inputs()
    expected = model(ids)
    before = snapshot(model)
    offload_from_profile(model, compiled["profile"], backend=CpuBackend())
    h = handle(model)
    assert h.vram is not None and h.vram.disk_modules and h.vram.skipped
    outputs = []
    for step in range(3):
        h.cache.set_step(step, 3)
        outputs.append(model(ids))
    # dense steps are bit-exact through streaming, host-tier and disk-tier wrappers
    assert torch.equal(outputs[0], expected) and torch.equal(outputs[2], expected)
    assert [e.hit for e in h.cache.caches[0].events] == [False, True, False]
    assert h.cache.report().hits == 1
    h.remove()
    assert_same(model, before)


def test_disk_tier_rule_fits_host_memory(compiled) -> None:
    profile, stats = load(compiled["profile"]), load_stats(compiled["stats"])
    section = vram_section_from_extensions(profile.extensions)
    assert section is not None and section.checkpoint == str(compiled["ckpt"])
    model = tiny_transformer.build_model()
    targets = section_targets(model, section, streamed_tensor_names(profile.all_tensors()))
    disk = set(section.disk_tensors)
    sizes = {t.name: t.bytes for trap in stats.traps for t in trap.tensors}
    sizes.update((t.name, t.bytes) for t in stats.untrapped)
    host_wrapped = sum(sizes[k] for keys in targets.wrapped.values() for k in keys - disk)
    assert disk and host_wrapped + profile.predicted.streamed_bytes <= HOST
    for keys in targets.wrapped.values():  # a module is on disk whole or not at all
        assert keys <= disk or not keys & disk
    assert disk <= set().union(*targets.wrapped.values())  # never a streamed tensor
    more = plan_host_disk_tier(profile, stats, targets, HOST * 2)
    assert set(more) < disk  # more host memory, fewer disk tensors


def test_sections_leave_the_plan_byte_identical(compiled, tmp_path, monkeypatch) -> None:
    out = tmp_path / "plain.msgpack"
    argv = ["plan", str(compiled["stats"]), "--budget", "3MiB", "-o", str(out)]
    monkeypatch.setattr(sys, "argv", ["ftc", *argv])
    assert _ftc(*argv) == 0
    with_sections = load(compiled["profile"])
    ext = dict(with_sections.extensions)
    assert ext.pop("caches") and ext.pop("vram")  # other extensions (the solver's) stay
    assert dumps(replace(with_sections, extensions=ext)) == out.read_bytes()
    assert dumps(with_sections) != out.read_bytes()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"host_memory_bytes": 10}, "without vram_spec"),
        ({"vram_checkpoint": "x.safetensors"}, "without vram_spec"),
        ({"vram_spec": "   "}, "non-empty string"),
        ({"vram_spec": "map=Linear"}, "write Class:wrapper"),
        ({"vram_spec": "map=Linear:linear;offload_dtype=int3"}, "offload_dtype 'int3'"),
        ({"cache_spec": "sometimes:module=x"}, "sometimes"),
        ({"vram_spec": "map=Linear:linear;checkpoint=a", "vram_checkpoint": "b"}, "once"),
    ],
)
def test_bad_section_options(options, message) -> None:
    with pytest.raises(ConfigError, match=message):
        section_options(OffloadConfig(**options))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vram_spec": VRAM, "host_memory_bytes": 1000}, "below the plan's .* streamed bytes"),
        (
            {"vram_spec": VRAM, "host_memory_bytes": HOST},
            r"[02-9]\d* tensors on disk but no checkpoint serves them: pass --checkpoint",
        ),
        (
            {"vram_spec": VRAM, "host_memory_bytes": HOST, "vram_checkpoint": "no.safetensors"},
            "does not exist",
        ),
        ({"vram_spec": "map=TinyTransformer:module"}, "matches the root"),
        ({"cache_spec": "fixed-step:module=blocks.9;skip=1"}, "'blocks.9' is not a module"),
    ],
)
def test_sections_checked_against_model_and_plan(compiled, options, message) -> None:
    profile, stats = load(compiled["profile"]), load_stats(compiled["stats"])
    plain = replace(profile, extensions={"solver": profile.extensions["solver"]})
    with pytest.raises(ConfigError, match=message):
        add_sections(plain, stats, tiny_transformer.build_model(),
                     section_options(OffloadConfig(**options)))  # fmt: skip


def test_one_disk_tensor_reads_as_one(compiled) -> None:
    profile, stats = load(compiled["profile"]), load_stats(compiled["stats"])
    plain = replace(profile, extensions={"solver": profile.extensions["solver"]})
    section = parse_vram_spec(VRAM)
    targets = section_targets(tiny_transformer.build_model(), section,
                              streamed_tensor_names(profile.all_tensors()))  # fmt: skip
    one = next(h for h in range(HOST, 2 * HOST, 20_000)
               if len(plan_host_disk_tier(profile, stats, targets, h)) == 1)  # fmt: skip
    options = section_options(OffloadConfig(vram_spec=VRAM, host_memory_bytes=one))
    with pytest.raises(ConfigError, match="puts 1 tensor on disk but no checkpoint serves it:"):
        add_sections(plain, stats, tiny_transformer.build_model(), options)


def test_cli_bad_spec_is_one_line(tmp_path, capsys) -> None:
    code = _ftc("profile", str(ROOT / "profiles/tiny_transformer.py"), "--vram", "map=Linear",
                "-o", str(tmp_path / "x.msgpack"))  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err and "invalid option" in err and "Class:wrapper" in err
    assert not (tmp_path / "x.msgpack").exists()


def test_no_section_options_return_the_same_profile(compiled) -> None:
    profile, stats = load(compiled["profile"]), load_stats(compiled["stats"])
    assert add_sections(profile, stats, tiny_transformer.build_model(),
                        section_options(OffloadConfig())) is profile  # fmt: skip
    assert parse_vram_spec(VRAM).disk_tensors == ()


def test_compile_profile_api_writes_sections() -> None:
    from flextensor_compile.compile_api import compile_profile

    cfg = OffloadConfig(target="rtx4090", budget_bytes=3 << 20, cache_spec=CACHE, vram_spec=VRAM)
    profile = compile_profile(tiny_transformer.build_model(), tiny_transformer.example_inputs, cfg)
    assert profile.extensions["caches"]["module"] == "blocks.5"
    assert profile.extensions["vram"]["module_map"][0] == ["Linear", "AutoWrappedLinear"]
    assert "disk_tensors" not in profile.extensions["vram"]  # no --host-memory: no disk tier
