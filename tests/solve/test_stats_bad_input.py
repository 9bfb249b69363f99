"""Bad stats files for `ftc plan` and `ftc sweep`: one line naming the file, the cause and the fix,
exit code 1, no profile written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded

GOLDEN_STATS = Path(__file__).parents[2] / "profiles" / "tiny_transformer.stats.json"


def _edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        doc = json.loads(GOLDEN_STATS.read_text())
        edit(doc)
        path = tmp / "stats.json"
        path.write_text(json.dumps(doc))
        return path

    return make


def _huge_memory(doc: dict[str, Any]) -> None:
    doc["device"]["memory_bytes"] = 10**30


def _bytes_not_shape(doc: dict[str, Any]) -> None:
    doc["traps"][1]["tensors"][0]["bytes"] = 2**40


def _bad_curve(doc: dict[str, Any]) -> None:
    doc["device"]["bandwidth_curve"] = [["x", 1]]


def _dup_trap(doc: dict[str, Any]) -> None:
    doc["traps"][2]["name"] = doc["traps"][1]["name"]


def _dup_tensor(doc: dict[str, Any]) -> None:
    doc["traps"][2]["tensors"].append(doc["traps"][1]["tensors"][0])


def _bad_tie(doc: dict[str, Any]) -> None:
    doc["traps"][1]["tensors"][0]["tie"] = "nope"


def _self_tie(doc: dict[str, Any]) -> None:
    t = doc["traps"][1]["tensors"][0]
    t["tie"] = t["name"]


def _tie_chain(doc: dict[str, Any]) -> None:
    """blocks.1's first tensor tied to blocks.0's, which is itself tied to blocks.2's."""
    a, b, c = (doc["traps"][k]["tensors"][0] for k in (1, 2, 3))
    a["tie"], b["tie"] = b["name"], c["name"]


def _untrapped_tie_to_a_streamable(doc: dict[str, Any]) -> None:
    """The untrapped LM head tied to a block's weight that may stream (not to the untrapped
    embedding): `ftc plan` wrote no profile and said 'invalid profile ... recompile it with ftc
    plan', while `ftc sweep` listed plans for it."""
    head = next(t for t in doc["untrapped"] if t["name"] == "head.weight")
    head["tie"] = "blocks.0.up.weight"


def _zero_calls(doc: dict[str, Any]) -> None:
    doc["traps"][1]["calls"] = 0


def _zero_memory(doc: dict[str, Any]) -> None:
    doc["device"]["memory_bytes"] = 0


def _set(*path: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: Any) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return edit


def _over_a_pib(doc: dict[str, Any]) -> None:
    """Two tensors of 1 PiB each: each is a size a profile holds, together they are not."""
    big = {"dtype": "float32", "shape": [2**48], "bytes": 2**50}
    doc["untrapped"] = [{**big, "name": "big.0"}, {**big, "name": "big.1"}]


def _field(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["traps"][1]["tensors"][0][key] = value

    return edit


def _device_kind(doc: dict[str, Any]) -> None:
    doc["device"]["kind"] = "gpu"


def _binary(tmp: Path) -> Path:
    """Binary data that is not a profile (a profile starts with a msgpack map; both commands
    take one)."""
    path = tmp / "blob.bin"
    path.write_bytes(b"\xc1\xff\xfe not a stats file")
    return path


CASES = [
    (_edited(_field("stride", ["a"])), "tensors[0].stride: expected one non-negative int per"),
    (_edited(_field("stride", [1, 1])), "tensors[0].stride: expected one non-negative int per"),
    (_edited(_field("tie", {})), "tensors[0].tie: expected the name of the tensor it shares"),
    (_edited(_field("offloadable", "no")), "tensors[0].offloadable: expected true or false"),
    (_edited(_field("pin_reason", 7)), "tensors[0].pin_reason: expected a non-empty string"),
    (_edited(_device_kind), "device.kind: expected one of cuda, cpu, target, emulated"),
    (_edited(_dup_trap), "trap name 'blocks.0' appears twice"),
    (_edited(_dup_tensor), "tensor 'blocks.0.attn_norm.weight' is listed twice"),
    (_edited(_bad_tie), "is tied to 'nope', not a listed tensor; list it or drop the tie"),
    (_edited(_self_tie), "tensor 'blocks.0.attn_norm.weight' is tied to itself; drop its tie"),
    (_edited(_tie_chain), "tensor 'blocks.0.attn_norm.weight' is tied to "
                          "'blocks.1.attn_norm.weight', which is itself tied to "
                          "'blocks.2.attn_norm.weight'; a tie names an untied tensor: tie "
                          "'blocks.0.attn_norm.weight' to 'blocks.2.attn_norm.weight'"),
    (_edited(_untrapped_tie_to_a_streamable), "untrapped[4].tie: untrapped 'head.weight' is "
     "tied to 'blocks.0.up.weight' of trap 'blocks.0', which may stream; list 'head.weight' in "
     "that trap's tensors, or give 'blocks.0.up.weight' \"offloadable\": false"),
    (_edited(_zero_calls), "traps[1].calls: expected int in [1, 2147483648], got 0"),
    (_edited(_zero_memory), "device.memory_bytes: expected int in [1, 1125899906842624], got 0"),
    (lambda tmp: tmp / "missing.json", "no such file; pass a stats file (`ftc profile --save-stats`)"),
    (lambda tmp: tmp, "is a folder, not a stats file"),
    (_binary, "binary data, not a JSON stats file (a profile?)"),
    (_edited(_huge_memory), "device.memory_bytes: expected int in [1, 1125899906842624]"),
    (_edited(_bytes_not_shape), "bytes, but shape [128] of float32 holds 512"),
    (_edited(_bad_curve), "device.bandwidth_curve: expected a list of [bytes, bytes_per_s]"),
    # the ranges the profile reader checks: a plan of these stats would be an unreadable file
    (_edited(_set("device", "h2d_bytes_per_s", value=1e-10)), "device.h2d_bytes_per_s: expected"),
    (_edited(_set("device", "h2d_bytes_per_s", value=1e19)), "in [1e-09, 1e+18], got 1e+19"),
    (_edited(_set("device", "memory_bytes", value=2**50 + 1)), "device.memory_bytes: expected"),
    (_edited(_set("device", "h2d_latency_ms", value=1e19)), "device.h2d_latency_ms: expected"),
    (_edited(_set("device", "bandwidth_curve", value=[[4096, 1e-300]])), "bytes_per_s in [1e-09"),
    (_edited(_set("traps", 1, "calls", value=2**31 + 1)), "traps[1].calls: expected int in"),
    (_edited(_set("traps", 1, "compute_ms", value=1e19)), "traps[1].compute_ms: expected float"),
    (_edited(_set("timing_source", value="x" * 5000)), "file.timing_source: expected a non-empty"),
    (_edited(_set("timing_source", value=7)), "file.timing_source: expected a non-empty string"),
    (_edited(_set("timing_source", value="made-up")), "file.timing_source: expected one of "
                                                      "measured-cuda, measured-cpu, roofline"),
    (_edited(_set("traps", 1, "tensors", 0, "bytes", value=10**400)),
     "traps[1].tensors[0].bytes: expected int in [0, 1125899906842624], got a 401-digit number"),
    (_edited(_set("traps", 1, "compute_ms", value=10**400)), "traps[1].compute_ms: expected float"),
    (_edited(_set("device", "bandwidth_curve", value=[[10**400, 1e9]])),
     "device.bandwidth_curve: expected a list of [bytes, bytes_per_s] pairs"),
    (_edited(_over_a_pib), "bytes, over the 1125899906842624 (1 PiB) a profile can describe"),
]


@pytest.mark.parametrize(("make", "cause"), CASES)
def test_bad_stats_is_one_line_exit_1(tmp_path: Path, capsys, make, cause) -> None:
    source, out = make(tmp_path), tmp_path / "p.msgpack"
    commands = [["plan", str(source), "--mem-fraction", "0.5", "-o", str(out)],
                ["sweep", str(source), "--fractions", "0.5"]]  # fmt: skip
    for argv in commands:
        code = run_guarded(lambda argv=argv: app(argv, prog_name="ftc"), False)
        err = capsys.readouterr().err.strip()
        assert code == 1 and len(err.splitlines()) == 1, (argv, err)
        assert err.startswith("ftc: invalid stats: ") and cause in err, (argv, err)
        assert not out.exists()


def test_a_budget_larger_than_a_real_device_is_refused() -> None:
    from dataclasses import replace

    from flextensor_compile.planning import plan_profile
    from flextensor_compile.stats import load_stats
    from flextensor_runtime.errors import ConfigError
    from flextensor_runtime.profile import PlanConfig

    stats = load_stats(GOLDEN_STATS)
    real = replace(stats, device=replace(stats.device, kind="target", name="l4"))
    too_big = real.device.memory_bytes + 1
    with pytest.raises(ConfigError, match=f"pass --budget {real.device.memory_bytes} or less"):
        plan_profile(real, PlanConfig(budget_bytes=too_big))
    # an emulated device (no GPU, no --target) only stands in for one: any budget is accepted
    assert plan_profile(stats, PlanConfig(budget_bytes=too_big)).config.budget_bytes == too_big


def test_in_range_times_whose_sum_is_not_are_one_line(tmp_path: Path, capsys) -> None:
    def every_trap_slow(doc: dict[str, Any]) -> None:
        for trap in doc["traps"]:
            trap["compute_ms"] = 1e18

    source, out = _edited(every_trap_slow)(tmp_path), tmp_path / "p.msgpack"
    argv = ["plan", str(source), "--mem-fraction", "0.5", "-o", str(out)]
    code = run_guarded(lambda: app(argv, prog_name="ftc"), False)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and not out.exists()
    assert err.startswith("ftc: invalid stats: ") and "more than a profile records" in err, err
    assert "compute_ms" in err


def test_a_profile_with_a_timing_source_stats_cannot_record_still_re_plans(tmp_path) -> None:
    from dataclasses import replace

    from flextensor_compile.planning import plan_profile
    from flextensor_compile.stats import canonical_stats, load_stats
    from flextensor_compile.sweep import stats_from_profile
    from flextensor_runtime.profile import PlanConfig

    profile = plan_profile(load_stats(GOLDEN_STATS), PlanConfig(mem_fraction=0.6))
    for source, kept in (("measured-cpu", "measured-cpu"), ("made by hand", "stats")):
        odd = replace(profile, meta=replace(profile.meta, timing_source=source))
        assert canonical_stats(stats_from_profile(odd)).timing_source == kept


def test_a_pin_reason_survives_the_stats_file(tmp_path: Path) -> None:
    from flextensor_compile.stats import load_stats, save_stats

    doc = json.loads(GOLDEN_STATS.read_text())
    t = doc["traps"][1]["tensors"][0]
    t["offloadable"], t["pin_reason"] = False, "the exclude pattern 'x' matches it"
    source = tmp_path / "s.json"
    source.write_text(json.dumps(doc))
    again = load_stats(save_stats(load_stats(source), tmp_path / "again.json"))
    assert again.traps[1].tensors[0].pin_reason == "the exclude pattern 'x' matches it"
    plain = save_stats(load_stats(GOLDEN_STATS), tmp_path / "plain.json")
    assert "pin_reason" not in plain.read_text()  # written only when recorded


@pytest.mark.parametrize("head", [b"", b"\xef\xbb\xbf"])
def test_a_hand_written_utf8_stats_file_reads_in_any_locale(tmp_path: Path, head: bytes) -> None:
    """The file was read in the locale's encoding: in a locale that is not UTF-8 (here ASCII:
    LC_ALL=C without Python's UTF-8 mode; Latin-1 or Windows' cp1252 alike) a UTF-8 name was
    'binary data, not a JSON stats file (a profile?)', and a BOM (as some editors write) was
    'not JSON'. Stats files are UTF-8, with or without a BOM."""
    import subprocess
    import sys

    doc = json.loads(GOLDEN_STATS.read_text())
    doc["name"] = "modèle"
    source = tmp_path / "stats.json"
    source.write_bytes(head + json.dumps(doc, ensure_ascii=False).encode())
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONPATH": str(GOLDEN_STATS.parents[1])}  # fmt: skip
    argv = [sys.executable, "-m", "flextensor_compile", "plan", str(source), "-o",
            str(tmp_path / "p.msgpack")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
