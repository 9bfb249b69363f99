"""Recorded measurements ("stats"): what discovery and profiling found, in a JSON interchange file.

Owns: the `Stats` dataclasses (traps in execution order with compute time and tensors, the
device and its bandwidth model), reading and writing `stats.json` with one-line errors, so
`ftc plan stats.json` can re-solve without the model (each field checked as it is read; the
checks across fields are `stats_checks`).
Must not know: torch (stats come from measuring, but this module only holds numbers), the solver.

JSON shape (extra optional fields marked ?):
    {"name": str, "timing_source"?: one of TIMING_SOURCES (default "stats"),
     "device": {"name": str, "memory_bytes": int, "h2d_bytes_per_s": float,
                "h2d_latency_ms"?: float, "bandwidth_curve"?: [[bytes, bytes_per_s], ...],
                "kind"?: str},
     "traps": [{"name": str, "compute_ms": float, "kind"?: "module"|"gap"|"manual", "calls"?: int,
                "tensors": [{"name": str, "bytes": int, "dtype": str, "shape": [int, ...],
                             "stride"?: [int, ...], "kind"?: str, "tie"?: str,
                             "offloadable"?: bool, "pin_reason"?: str}]}],
     "untrapped"?: [tensor, ...]}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from flextensor_compile.stats_checks import check_stats
from flextensor_compile.stats_checks import stats_error as _err
from flextensor_runtime.atomic_file import write_atomic
from flextensor_runtime.errors import StatsFormatError
from flextensor_runtime.profile import (
    DTYPE_ITEMSIZE,
    TENSOR_KINDS,
    TIMING_SOURCES,
    TRAP_KINDS,
    BandwidthPoint,
    DeviceSpec,
)
from flextensor_runtime.profile.fields import MAX_BYTES, MAX_COUNT, MAX_NUMBER, MIN_RATE

__all__ = ["Stats", "TensorStat", "TrapStat", "canonical_stats", "load_stats", "save_stats",
           "stats_from_json", "stats_to_json"]  # fmt: skip


@dataclass(frozen=True)
class TensorStat:
    """One tensor a trap owns. `offloadable=False` pins it resident (e.g. read by other traps);
    `pin_reason` says which rule did, when discovery recorded it."""

    name: str
    bytes: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] = ()
    kind: str = "parameter"
    tie: str | None = None
    offloadable: bool = True
    pin_reason: str | None = None  # why `offloadable` is False (e.g. "the exclude pattern ...")


@dataclass(frozen=True)
class TrapStat:
    """One trap in execution order with its measured (or estimated) compute time."""

    name: str
    compute_ms: float
    tensors: tuple[TensorStat, ...] = ()
    kind: str = "module"
    calls: int = 1


@dataclass(frozen=True)
class Stats:
    """Everything the solver needs about one model on one device."""

    name: str
    device: DeviceSpec
    traps: tuple[TrapStat, ...]
    untrapped: tuple[TensorStat, ...] = ()
    timing_source: str = "stats"


def _num(doc: dict, key: str, where: str, kind: type = float, required: bool = True,
         lo: float = 0, hi: float | None = None) -> Any:  # fmt: skip
    """`doc[key]` as `kind` in [lo, hi] (default hi: MAX_BYTES for ints, MAX_NUMBER for floats,
    the ranges the profile reader checks)."""
    if key not in doc:
        if required:
            raise _err(where, f"missing field {key!r}")
        return None
    v = doc[key]
    if not _in_range(v, kind, lo, hi):
        top = _top(kind, hi)
        span = f"[{lo}, {top}]" if kind is int else f"[{lo:g}, {top:g}]"
        raise _err(f"{where}.{key}", f"expected {kind.__name__} in {span}, got {_shown(v)}")
    return kind(v)


def _shown(v: Any) -> str:
    """A bad value as the message quotes it: at most 40 characters, a long int by its size."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
        return f"a {len(str(abs(v)))}-digit number"
    return f"{v!r:.40}"


def _in_range(v: Any, kind: type, lo: float, hi: float | None = None) -> bool:
    ok = isinstance(v, (int, float)) if kind is float else isinstance(v, int)
    if not ok or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
        return False
    return lo <= v <= _top(kind, hi)  # exact for ints of any size (10**400 is out, not an error)


def _top(kind: type, hi: float | None) -> float:
    return (MAX_BYTES if kind is int else MAX_NUMBER) if hi is None else hi


_MAX_TEXT = 4096  # the longest name or label a profile records


def _str(doc: dict, key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v or len(v) > _MAX_TEXT:
        raise _err(f"{where}.{key}", f"expected a non-empty string of at most {_MAX_TEXT} "
                   f"characters, got {v!r:.40}")  # fmt: skip
    return v


def _tensor(doc: Any, where: str) -> TensorStat:
    if not isinstance(doc, dict):
        raise _err(where, "expected an object")
    dtype = _str(doc, "dtype", where)
    if dtype.removeprefix("torch.") not in DTYPE_ITEMSIZE:
        raise _err(f"{where}.dtype", f"unknown dtype {dtype!r}")
    shape = doc.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _err(f"{where}.shape", f"expected a list of non-negative ints, got {shape!r:.40}")
    if len(shape) > 64 or any(d > MAX_BYTES for d in shape):
        raise _err(f"{where}.shape", f"absurd shape {shape[:8]!r:.60}")
    nbytes = _num(doc, "bytes", where, int)
    if nbytes != prod(shape) * DTYPE_ITEMSIZE[dtype.removeprefix("torch.")]:
        raise _err(
            f"{where}.bytes",
            f"{nbytes} bytes, but shape {shape} of {dtype} holds "
            f"{prod(shape) * DTYPE_ITEMSIZE[dtype.removeprefix('torch.')]}",
        )
    kind = doc.get("kind", "parameter")
    if kind not in TENSOR_KINDS:
        raise _err(f"{where}.kind", f"expected one of {', '.join(TENSOR_KINDS)}, got {kind!r}")
    return TensorStat(
        name=_str(doc, "name", where),
        bytes=nbytes,
        dtype=dtype.removeprefix("torch."),
        shape=tuple(shape),
        stride=_stride(doc, shape, where),
        kind=kind,
        tie=_tie(doc, where),
        offloadable=_flag(doc, "offloadable", where),
        pin_reason=_str(doc, "pin_reason", where) if "pin_reason" in doc else None,
    )


def _stride(doc: dict, shape: list[int], where: str) -> tuple[int, ...]:
    """Absent or empty: contiguous; else one non-negative int per dimension."""
    stride = doc.get("stride") or []
    ok = isinstance(stride, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_BYTES for d in stride
    )
    if not ok or (stride and len(stride) != len(shape)):
        raise _err(f"{where}.stride", f"expected one non-negative int per dimension of "
                   f"{shape[:8]!r:.40}, got {stride!r:.40}")  # fmt: skip
    return tuple(stride)


def _tie(doc: dict, where: str) -> str | None:
    tie = doc.get("tie")
    if tie is not None and (not isinstance(tie, str) or not tie):
        raise _err(f"{where}.tie", f"expected the name of the tensor it shares, got {tie!r:.40}")
    return tie


def _flag(doc: dict, key: str, where: str) -> bool:
    value = doc.get(key, True)
    if not isinstance(value, bool):
        raise _err(f"{where}.{key}", f"expected true or false, got {value!r:.40}")
    return value


def _trap(doc: Any, where: str) -> TrapStat:
    if not isinstance(doc, dict):
        raise _err(where, "expected an object")
    kind = doc.get("kind", "module")
    if kind not in TRAP_KINDS:
        raise _err(f"{where}.kind", f"expected one of {', '.join(TRAP_KINDS)}, got {kind!r}")
    tensors = doc.get("tensors", [])
    if not isinstance(tensors, list):
        raise _err(f"{where}.tensors", "expected a list")
    return TrapStat(
        name=_str(doc, "name", where),
        compute_ms=_num(doc, "compute_ms", where),
        tensors=tuple(_tensor(t, f"{where}.tensors[{i}]") for i, t in enumerate(tensors)),
        kind=kind,
        calls=_calls(doc, where),
    )


def _calls(doc: dict, where: str) -> int:
    calls = _num(doc, "calls", where, int, required=False, lo=1, hi=MAX_COUNT)
    return 1 if calls is None else int(calls)


def _device(doc: Any) -> DeviceSpec:
    if not isinstance(doc, dict):
        raise _err("device", "expected an object")
    curve_doc = doc.get("bandwidth_curve", [])
    if not isinstance(curve_doc, list) or not all(
        isinstance(p, list) and len(p) == 2 and _in_range(p[0], float, 1, MAX_BYTES)
        and _in_range(p[1], float, MIN_RATE) for p in curve_doc
    ):  # fmt: skip
        raise _err("device.bandwidth_curve", "expected a list of [bytes, bytes_per_s] pairs, "
                   f"bytes in [1, {MAX_BYTES}], bytes_per_s in [{MIN_RATE:g}, {MAX_NUMBER:g}]")  # fmt: skip
    return DeviceSpec(
        name=_str(doc, "name", "device"),
        memory_bytes=_num(doc, "memory_bytes", "device", int, lo=1),
        h2d_bytes_per_s=_num(doc, "h2d_bytes_per_s", "device", lo=MIN_RATE),
        h2d_latency_ms=_num(doc, "h2d_latency_ms", "device", required=False) or 0.0,
        bandwidth_curve=tuple(BandwidthPoint(int(b), float(r)) for b, r in curve_doc),
        kind=_device_kind(doc),
    )


_DEVICE_KINDS = ("cuda", "cpu", "target", "emulated")


def _device_kind(doc: dict) -> str:
    kind = doc.get("kind", "target")
    if kind not in _DEVICE_KINDS:
        raise _err("device.kind", f"expected one of {', '.join(_DEVICE_KINDS)}, got {kind!r:.40}")
    return str(kind)


def stats_from_json(doc: Any) -> Stats:
    """Validate a decoded stats document."""
    if not isinstance(doc, dict):
        raise _err("file", "the top level must be a JSON object")
    traps = doc.get("traps")
    if not isinstance(traps, list) or not traps:
        raise _err("traps", "expected a non-empty list of traps")
    untrapped = doc.get("untrapped", [])
    if not isinstance(untrapped, list):
        raise _err("untrapped", "expected a list")
    stats = Stats(
        name=_str(doc, "name", "file"),
        device=_device(doc.get("device")),
        traps=tuple(_trap(t, f"traps[{i}]") for i, t in enumerate(traps)),
        untrapped=tuple(_tensor(t, f"untrapped[{i}]") for i, t in enumerate(untrapped)),
        timing_source=_timing_source(doc),
    )
    check_stats(stats)
    return stats


def _timing_source(doc: dict) -> str:
    source = _str({"timing_source": "stats", **doc}, "timing_source", "file")
    if source not in TIMING_SOURCES:
        raise _err("file.timing_source", f"expected one of {', '.join(TIMING_SOURCES)}, got "
                   f"{source!r:.40}")  # fmt: skip
    return source


def _tensor_json(t: TensorStat) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": t.name, "bytes": t.bytes, "dtype": t.dtype,
                           "shape": list(t.shape), "stride": list(t.stride), "kind": t.kind,
                           "offloadable": t.offloadable}  # fmt: skip
    if t.tie is not None:
        doc["tie"] = t.tie
    if t.pin_reason is not None and not t.offloadable:
        doc["pin_reason"] = t.pin_reason
    return doc


def stats_to_json(stats: Stats) -> dict[str, Any]:
    """The stats as a JSON-ready document (the interchange format above)."""
    d = stats.device
    return {
        "name": stats.name,
        "timing_source": stats.timing_source,
        "device": {"name": d.name, "memory_bytes": d.memory_bytes,
                   "h2d_bytes_per_s": d.h2d_bytes_per_s, "h2d_latency_ms": d.h2d_latency_ms,
                   "bandwidth_curve": [[p.bytes, p.bytes_per_s] for p in d.bandwidth_curve],
                   "kind": d.kind},
        "traps": [{"name": t.name, "compute_ms": t.compute_ms, "kind": t.kind, "calls": t.calls,
                   "tensors": [_tensor_json(x) for x in t.tensors]} for t in stats.traps],
        "untrapped": [_tensor_json(x) for x in stats.untrapped],
    }  # fmt: skip


def canonical_stats(stats: Stats) -> Stats:
    """The stats as `ftc plan` reads them back from their JSON form (numbers as JSON keeps them),
    so a plan made in memory equals one made from the saved file."""
    return stats_from_json(json.loads(json.dumps(stats_to_json(stats))))


def load_stats(path: str | os.PathLike[str]) -> Stats:
    """Read and validate a stats file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_bytes().decode("utf-8-sig"))  # any locale; BOM allowed
    except FileNotFoundError:
        raise StatsFormatError(
            f"{p}: no such file; pass the file written by `ftc profile --save-stats`"
        ) from None
    except IsADirectoryError:
        raise StatsFormatError(
            f"{p}: is a folder, not a stats file; pass the file written by `ftc profile "
            "--save-stats`"
        ) from None
    except UnicodeDecodeError:
        raise StatsFormatError(
            f"{p}: binary data, not a JSON stats file (a profile?); pass the file written by "
            "`ftc profile --save-stats`"
        ) from None
    except json.JSONDecodeError as exc:
        raise StatsFormatError(f"{p}: not JSON ({str(exc)[:60]}); pass a stats file") from None
    try:
        return stats_from_json(doc)
    except StatsFormatError as exc:
        raise StatsFormatError(f"{p}: {exc}") from None


def save_stats(stats: Stats, path: str | os.PathLike[str]) -> Path:
    """Write a stats file atomically (temp file + rename)."""
    text = json.dumps(stats_to_json(stats), indent=1, sort_keys=True) + "\n"
    return write_atomic(path, text.encode())
