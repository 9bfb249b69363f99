"""The plan-quality suite's copy models, and the curve file a GPU run saves for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.plan_quality.copy_models import (
    COPY_MODELS,
    CURVE,
    LATENCY,
    measured_model,
    write_curve,
)
from bench.plan_quality.instances import device
from flextensor_compile.solve.bandwidth import BandwidthModel

ROOT = Path(__file__).resolve().parents[2]


def _model(rate: float, model) -> BandwidthModel:
    spec = device(rate, model)
    points = tuple((p.bytes, p.bytes_per_s) for p in spec.bandwidth_curve)
    return BandwidthModel.from_curve(points, spec.h2d_bytes_per_s, spec.h2d_latency_ms)


def test_named_models_time_copies_as_documented() -> None:
    assert set(COPY_MODELS) == {"curve", "latency"}
    curve = _model(50e9, CURVE)
    for nbytes, fraction in CURVE.fractions:  # whole-copy rates at the listed sizes
        if nbytes / (50e9 * fraction) > CURVE.latency_ms / 1e3:
            assert curve.copy_ms(nbytes) == pytest.approx(nbytes / (50e9 * fraction) * 1e3)
    # 64 KiB at a quarter of 50 GB/s would take 5.2 us, under the latency: small copies take 8 us
    assert curve.copy_ms(4096) == pytest.approx(0.008)
    flat = _model(25e9, LATENCY)
    assert flat.copy_ms(1 << 24) == pytest.approx(0.008 + (1 << 24) / 25e9 * 1e3)


def test_a_saved_curve_is_read_back_as_fractions_of_its_rate(tmp_path: Path) -> None:
    points = [(1 << 20, 30e9), (1 << 24, 52e9), (1 << 28, 55e9)]
    path = write_curve(tmp_path / "sub" / "curve.json", "GPU X", 55e9, 0.009, points)
    model = measured_model(path)
    assert model.name == "measured (GPU X)" and model.latency_ms == 0.009
    assert model.fractions == tuple((b, r / 55e9) for b, r in points)
    # on the suite's PCIe4 link the measured shape is kept: 1 MiB at 30/55 of 25 GB/s
    bw = _model(25e9, model)
    assert bw.copy_ms(1 << 20) == pytest.approx((1 << 20) / (25e9 * 30 / 55) * 1e3)


def test_a_host_copy_curve_round_trips(tmp_path: Path) -> None:
    from bench.gpu.__main__ import SMOKE, measure_curve

    measured = measure_curve(SMOKE)  # host copies here; pinned host-to-device copies on a GPU
    points = [(p.bytes, p.bytes_per_s) for p in measured.points]
    path = write_curve(tmp_path / "c.json", "host", measured.bytes_per_s, measured.latency_ms,
                       points)  # fmt: skip
    model = measured_model(path)
    assert [b for b, _ in model.fractions] == sorted(b for b, _ in points)
    assert model.fractions[-1][1] == pytest.approx(1.0)  # the rate is the largest copy's


def test_the_queued_curve_times_copies_issued_back_to_back() -> None:
    from flextensor_compile.measure.bandwidth import measure_host_copies

    threads = torch.get_num_threads()
    single, queued = measure_host_copies(), measure_host_copies(queued=4)
    assert torch.get_num_threads() == threads  # timed on one thread, then put back
    assert [p.bytes for p in queued.points] == [p.bytes for p in single.points]
    assert all(p.bytes_per_s > 0 for p in queued.points) and queued.latency_ms >= 0
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="number of copies a sample times"):
            measure_host_copies(queued=bad)  # type: ignore[arg-type]


def test_both_measured_curves_are_saved_for_the_suite(tmp_path: Path) -> None:
    from bench.gpu.__main__ import QUEUED, SMOKE, measure_curve, queued_path, save_curves

    single, queued = measure_curve(SMOKE), measure_curve(SMOKE, QUEUED)
    first, second = save_curves(tmp_path / "out" / "h2d_curve.json", "host", single, queued)
    assert first == tmp_path / "out" / "h2d_curve.json"
    assert second == queued_path(first) == tmp_path / "out" / "h2d_curve_queued.json"
    assert measured_model(first).name == "measured (host)"
    assert measured_model(second).name == f"measured (host, {QUEUED} copies queued)"
    doc = json.loads(second.read_text())
    assert doc["bytes_per_s"] == queued.bytes_per_s
    assert [b for b, _ in doc["points"]] == [p.bytes for p in queued.points]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "cannot read a curve"),
        ("[1, 2]", "not a JSON object"),
        ('{"bytes_per_s": -1, "latency_ms": 0, "points": [[1, 1]]}', "bytes_per_s must be"),
        ('{"bytes_per_s": 1e9, "latency_ms": "x", "points": [[1, 1]]}', "latency_ms must be"),
        ('{"bytes_per_s": 1e9, "latency_ms": 0, "points": []}', "points must be"),
        ('{"bytes_per_s": 1e9, "latency_ms": 0, "points": [[1, 0]]}', "a point must be"),
    ],
)
def test_a_bad_curve_file_names_what_is_wrong_and_how_to_make_one(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        measured_model(path)
    assert "python -m bench.gpu --curve-out" in str(err.value)


def test_the_bench_refuses_a_bad_curve_file_before_solving(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"bytes_per_s": 0}))
    proc = subprocess.run([sys.executable, "-m", "bench.plan_quality", "--copy-curve", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "bytes_per_s must be a positive number" in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "bench.plan_quality", "--copy-curve",
                              str(tmp_path / "none.json")], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 2 and "cannot read a curve" in missing.stderr
