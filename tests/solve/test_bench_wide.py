"""The wide random instances of `python -m bench.plan_quality.wide` and the command on a small
shape (what it prints, not how fast: speed targets live in the bench)."""

from __future__ import annotations

import sys

import pytest

from bench.plan_quality import wide
from flextensor_compile.solve import SubsetTable


def test_wide_stats_give_every_tensor_its_own_size_and_thinned_tables() -> None:
    stats = wide.wide_stats(80, 24)
    sizes = [t.bytes for tr in stats.traps for t in tr.tensors]
    assert len(stats.traps) == 80 and len(sizes) == 80 * 24
    assert len(set(sizes)) > 0.6 * len(sizes) and all(b % 4096 == 0 for b in sizes)
    assert wide.wide_stats(80, 24) == stats  # seeded
    first = tuple(t.bytes for t in stats.traps[0].tensors)
    assert not SubsetTable.build(first).exact


def test_wide_command_on_a_small_shape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["wide", "--shapes", "4x6", "80x24", "--fractions", "0.9", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    wide.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("4x6 0.9") and lines[1].startswith("80x24 0.9")
    assert " ms  " in lines[0] and "makespan" in lines[0]
    assert lines[2].startswith("CPU reference loop:")
    assert lines[3].startswith("target: 80x24 solves <= 100 ms: at most")
