"""How the plan-quality suite's devices time a host-to-device copy, and the measured-curve file.

Owns: the named copy models (`curve`, the default, and `latency`), a model read from a curve
that `python -m bench.gpu --curve-out FILE` measured on a real GPU, and that file's format:
    {"device": str, "bytes_per_s": float, "latency_ms": float,
     "points": [[bytes, bytes_per_s], ...]}   # each point a whole copy's rate
A model is a shape: whole-copy rates as fractions of the link rate at some copy sizes, plus a
per-copy latency, so one measured curve times copies on both of the suite's links.
Must not know: torch, instances, solving.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from flextensor_runtime.atomic_file import write_atomic

__all__ = ["COPY_MODELS", "CURVE", "LATENCY", "CopyModel", "measured_model", "write_curve"]


@dataclass(frozen=True)
class CopyModel:
    """Whole-copy rates as fractions of the link rate at some sizes, and a per-copy latency."""

    name: str
    fractions: tuple[tuple[int, float], ...]  # (copy bytes, whole-copy rate / link rate)
    latency_ms: float


CURVE = CopyModel("curve", ((64 << 10, 0.25), (1 << 20, 0.7), (16 << 20, 0.95),
                            (256 << 20, 1.0)), 0.008)  # fmt: skip
LATENCY = CopyModel("latency", (), 0.008)  # as `ftc profile --target` plans: 8 us + the rate
COPY_MODELS = {m.name: m for m in (CURVE, LATENCY)}


def write_curve(path: str | Path, device: str, bytes_per_s: float, latency_ms: float,
                points: list[tuple[int, float]]) -> Path:  # fmt: skip
    """Save a measured curve (atomically, creating its folder) for `measured_model`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": device, "bytes_per_s": bytes_per_s, "latency_ms": latency_ms,
           "points": [[int(b), float(r)] for b, r in points]}  # fmt: skip
    return write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())


def _bad(path: str | Path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}; write the file with `python -m bench.gpu --curve-out "
                      f"{path}` on the GPU whose copies the suite should use")  # fmt: skip


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def measured_model(path: str | Path) -> CopyModel:
    """The copy model of a curve file: each point's rate over the file's `bytes_per_s`."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"cannot read a curve ({exc})") from None
    if not isinstance(doc, dict):
        raise _bad(path, "not a JSON object")
    rate, latency, points = doc.get("bytes_per_s"), doc.get("latency_ms"), doc.get("points")
    if not _positive(rate):
        raise _bad(path, f"bytes_per_s must be a positive number, got {rate!r}")
    if not (_positive(latency) or latency == 0):
        raise _bad(path, f"latency_ms must be a number >= 0, got {latency!r}")
    if not isinstance(points, list) or not points:
        raise _bad(path, "points must be a non-empty list of [bytes, bytes_per_s]")
    fractions = []
    for p in points:
        if not (isinstance(p, list) and len(p) == 2 and _positive(p[0]) and _positive(p[1])):
            raise _bad(path, f"a point must be [bytes, bytes_per_s], both positive, got {p!r}")
        fractions.append((int(p[0]), float(p[1]) / float(rate)))  # type: ignore[arg-type]
    name = f"measured ({doc.get('device', 'unnamed device')})"
    return CopyModel(name, tuple(sorted(fractions)), float(latency))  # type: ignore[arg-type]
