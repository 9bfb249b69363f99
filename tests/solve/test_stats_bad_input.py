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
    doc["traps"][1]["tensors"][0]["bytes"] = 2**62


def _bad_curve(doc: dict[str, Any]) -> None:
    doc["device"]["bandwidth_curve"] = [["x", 1]]


def _dup_trap(doc: dict[str, Any]) -> None:
    doc["traps"][2]["name"] = doc["traps"][1]["name"]


def _dup_tensor(doc: dict[str, Any]) -> None:
    doc["traps"][2]["tensors"].append(doc["traps"][1]["tensors"][0])


def _bad_tie(doc: dict[str, Any]) -> None:
    doc["traps"][1]["tensors"][0]["tie"] = "nope"


def _zero_calls(doc: dict[str, Any]) -> None:
    doc["traps"][1]["calls"] = 0


def _zero_memory(doc: dict[str, Any]) -> None:
    doc["device"]["memory_bytes"] = 0


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
    (_edited(_device_kind), "device.kind: expected one of cuda, cpu, target, emulated"),
    (_edited(_dup_trap), "trap name 'blocks.0' appears twice"),
    (_edited(_dup_tensor), "tensor 'blocks.0.attn_norm.weight' is listed twice"),
    (_edited(_bad_tie), "is tied to 'nope', not a listed tensor"),
    (_edited(_zero_calls), "traps[1].calls: expected a positive int, got 0"),
    (_edited(_zero_memory), "device.memory_bytes: expected a positive number, got 0"),
    (lambda tmp: tmp / "missing.json", "no such file; pass the file written by"),
    (lambda tmp: tmp, "is a folder, not a stats file"),
    (_binary, "binary data, not a JSON stats file (a profile?)"),
    (_edited(_huge_memory), "device.memory_bytes: expected a non-negative int below 2**63"),
    (_edited(_bytes_not_shape), "bytes, but shape [128] of float32 holds 512"),
    (_edited(_bad_curve), "device.bandwidth_curve: expected a list of [bytes, bytes_per_s]"),
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
