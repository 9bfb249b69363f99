"""The GPU benchmark's CPU smoke mode runs end to end (slow: a fresh process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_gpu_smoke() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "bench.gpu", "--smoke"], check=True, cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600).stdout  # fmt: skip
    assert "flextensor 50% budget" in out and "diffusers group offload" in out


def test_gpu_bench_curve_rows_put_the_suite_model_next_to_the_measured_rates() -> None:
    from bench.gpu.__main__ import SMOKE, curve_rows

    rows = curve_rows(SMOKE)  # host copies here; pinned host-to-device copies on a GPU
    sizes = [r[0] for r in rows]
    assert len(rows) >= 3 and sizes == sorted(sizes)
    assert rows[-1][2] == pytest.approx(1.0)  # rates as a fraction of the largest copy's
    assumed = [r[3] for r in rows]
    assert all(0 < a <= 1 for a in assumed) and assumed == sorted(assumed)
    # the model's small copies are the slow ones: about half the rate at 256 KiB
    assert assumed[0] < 0.6 < assumed[-1]


@pytest.mark.slow
def test_bench_gpu_parts(tmp_path: Path) -> None:
    """`--curve-only` (what bench/gpu/check.sh runs first) saves both curves and nothing else;
    `--no-curve` runs the rest; together they need no --curve-out twice."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bench.gpu", "--smoke", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip

    curve = bench("--curve-only", "--curve-out", str(tmp_path / "h2d_curve.json"))
    assert curve.returncode == 0, curve.stderr
    assert "flextensor 50% budget" not in curve.stdout and "8 copies queued" in curve.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h2d_curve.json", "h2d_curve_queued.json"]
    rest = bench("--no-curve")
    assert rest.returncode == 0 and "flextensor 50% budget" in rest.stdout
    assert "copy curve" not in rest.stdout
    both = bench("--no-curve", "--curve-out", str(tmp_path / "x.json"))
    assert both.returncode != 0 and "drop --no-curve" in both.stderr


def test_lock_bench_prints_the_pair_and_its_cost(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.runtime.lock import main

    cost = main(number=1000, repeats=3)
    out = capsys.readouterr().out
    assert "acquire(blocking=False) + release()" in out and "per trap call" in out
    assert cost > 0


def test_slot_check_bench_prints_both_variants_and_the_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.runtime.slots import main

    main(depth=4, dim=8, repeats=2, iters=5, calls=100)
    out = capsys.readouterr().out
    assert "trap call incl. forward (us)" in out and "entry check alone (ns)" in out


def test_profile_io_bench_times_each_step_of_a_large_profile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.runtime.profile_io import main

    monkeypatch.setattr("sys.argv", ["profile_io", "--layers", "5", "--repeats", "1", "--fraction", "0.9"])
    main()
    out = capsys.readouterr().out
    # the embedding, 5 attention traps of 7, 3 dense MLPs of 3, 2 MoE traps of 772, the head (2)
    assert "12 traps, 1591 tensor entries" in out
    for step in ("loads", "decode", "parse", "checks", "dumps", "document"):
        assert f"{step} " in out


def test_many_tensors_bench_compiles_installs_and_matches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.runtime.many_tensors import main

    result = main(["--layers", "2", "--experts", "8", "--repeats", "1"])
    assert result["tensors"] == 2 * 8 * 3 and result["same"] == 1.0
    assert "first forward matches the plain model: True" in capsys.readouterr().out
