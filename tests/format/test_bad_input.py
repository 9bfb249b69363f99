"""Bad profile files: each gives one line naming the problem, exit code 1, no traceback, no hang."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from flextensor_runtime.errors import (
    BudgetError,
    ProfileError,
    ProfileFormatError,
    ProfileVersionError,
)
from flextensor_runtime.profile import Block, Transfer, dumps, loads, to_document
from profiles.golden import format_golden


def _doc() -> dict[str, Any]:
    return to_document(format_golden())


def _pack(doc: Any) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


def _with(path: list[Any], value: Any) -> bytes:
    doc = _doc()
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return _pack(doc)


def _nested(depth: int) -> bytes:
    """A map whose one value is `depth` nested one-element arrays (msgpack cannot pack it)."""
    return b"\x81" + msgpack.packb("x-deep") + b"\x91" * depth + b"\x00"


GOOD = dumps(format_golden())
CASES: dict[str, tuple[bytes, type[Exception], str]] = {
    "empty": (b"", ProfileFormatError, "empty"),
    "truncated": (GOOD[: len(GOOD) // 2], ProfileFormatError, "truncated"),
    "random bytes": (bytes(range(256)) * 4, ProfileFormatError, "not one msgpack map"),
    "trailing bytes": (GOOD + b"\x00", ProfileFormatError, "trailing"),
    "a list": (_pack([1, 2, 3]), ProfileFormatError, "not a map"),
    "an int": (_pack(7), ProfileFormatError, "not a map"),
    "other format": (_with(["format"], "safetensors"), ProfileFormatError, "format is 'safetensors'"),
    "older version": (_with(["version"], 0), ProfileVersionError, "recompile"),
    "newer version": (_with(["version"], 99), ProfileVersionError, "upgrade"),
    "version a string": (_with(["version"], "1"), ProfileFormatError, "version"),
    "missing section": (_pack({k: v for k, v in _doc().items() if k != "blocks"}),
                        ProfileFormatError, "'blocks'"),
    "wrong type": (_with(["traps", 1, "compute_ms"], "fast"), ProfileFormatError,
                   "traps[1].compute_ms"),
    "unknown placement": (_with(["traps", 1, "tensors", 0, "placement"], "cloud"),
                          ProfileFormatError, "placement"),
    "absurd bytes": (_with(["blocks", 0, "bytes"], 2**60), ProfileFormatError, "blocks[0].bytes"),
    "absurd shape": (_with(["traps", 0, "tensors", 0, "shape"], [2**40, 2**40]),
                     ProfileFormatError, "shape"),
    "bytes disagree with shape": (_with(["traps", 0, "tensors", 0, "bytes"], 4),
                                  ProfileFormatError, "declares 4 bytes"),
    "negative compute": (_with(["traps", 0, "compute_ms"], -1.0), ProfileFormatError, "compute_ms"),
    "nan compute": (_with(["traps", 0, "compute_ms"], float("nan")), ProfileFormatError,
                    "compute_ms"),
    "unknown field": (_with(["meta", "colour"], "red"), ProfileFormatError, "colour"),
    # refused by the decoder (its stack, its length limits, the missing bytes), not later
    "deep nesting": (_nested(100_000), ProfileFormatError,
                     "not a readable offload profile (msgpack: StackError)"),
    "huge declared array": (b"\xdd\x7f\xff\xff\xff" + b"\x00" * 16, ProfileFormatError,
                            "exceeds max_array_len"),
    "huge declared map": (b"\xdf\x7f\xff\xff\xff" + b"\x00" * 16, ProfileFormatError,
                          "exceeds max_map_len"),
    "huge declared string": (b"\xdb\x7f\xff\xff\xff" + b"a" * 16, ProfileFormatError,
                             "not a readable offload profile (msgpack: "),
    "missing block": (_with(["schedule", 0, "block"], 7), ProfileFormatError, "block 7"),
    "fingerprint tampered": (_with(["model", "digest"], "0" * 64), ProfileFormatError,
                             "fingerprint"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_bytes_raise_one_line_errors(name: str) -> None:
    data, kind, fragment = CASES[name]
    with pytest.raises(kind) as info:
        loads(data)
    message = str(info.value)
    assert "\n" not in message
    assert fragment in message


def _replace(**kw: Any) -> bytes:
    profile = dataclasses.replace(format_golden(), **kw)
    return _pack(to_document(profile))


def test_cross_reference_errors() -> None:
    golden = format_golden()
    s = list(golden.schedule)
    cases = {
        "past block 0's end": _replace(blocks=(Block(0, 16), golden.blocks[1])),
        "has no transfer": _replace(schedule=tuple(s[1:])),
        "transfer 2 of trap 1 carries no streamed tensor": _replace(
            schedule=(*s, dataclasses.replace(s[0], block=1))
        ),
        "transfer 1 of trap 1 and transfer 1 of trap 3 hold the same bytes": _replace(
            schedule=(dataclasses.replace(s[0], issue_at=6, release_after=2), *s[1:])
        ),
        "before its reader": _replace(
            schedule=(dataclasses.replace(s[1], release_after=1), s[0], *s[2:])
        ),
        "beyond the": _replace(schedule=(Transfer(9, 0, 0, 1, 0, 0), *s)),
    }
    for fragment, data in cases.items():
        with pytest.raises(ProfileFormatError, match=fragment):
            loads(data)


def test_peak_over_budget_is_a_budget_error() -> None:
    golden = format_golden()
    data = _replace(config=dataclasses.replace(golden.config, budget_bytes=1000))
    with pytest.raises(BudgetError, match="exceeds its budget of 1000 bytes"):
        loads(data)


@pytest.mark.parametrize("name", ["empty", "truncated", "newer version", "huge declared array"])
def test_ftc_inspect_prints_one_line_and_exits_1(name: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.msgpack"
    path.write_bytes(CASES[name][0])
    r = subprocess.run(
        [sys.executable, "-m", "flextensor_compile", "inspect", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftc: ") and str(path) in lines[0]
    assert "Traceback" not in r.stderr


def test_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.msgpack"
    path.write_bytes(b"")
    r = subprocess.run(
        [sys.executable, "-m", "flextensor_compile", "--debug", "inspect", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_every_error_is_a_profile_error_subclass() -> None:
    assert issubclass(ProfileFormatError, ProfileError)
    assert issubclass(ProfileVersionError, ProfileError)


def _retied(name: str, tie: str | None) -> bytes:
    golden = format_golden()
    traps = tuple(dataclasses.replace(trap, tensors=tuple(
        dataclasses.replace(e, tie=tie) if e.name == name else e for e in trap.tensors))
        for trap in golden.traps)  # fmt: skip
    return _replace(traps=traps)


def test_a_bad_tie_says_what_is_wrong_with_it() -> None:
    cases = {
        "tensor 'lm_head.weight' is tied to itself": _retied("lm_head.weight", "lm_head.weight"),
        "tied to 'nope', which the profile does not list": _retied("lm_head.weight", "nope"),
        "tensor 'embed.weight' is tied to 'lm_head.weight', which is itself tied to "
        "'embed.weight' (a tie names an untied tensor)": _retied("embed.weight", "lm_head.weight"),
    }
    for fragment, data in cases.items():
        with pytest.raises(ProfileFormatError, match=re.escape(fragment)):
            loads(data)
