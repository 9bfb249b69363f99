"""Reading and writing the offload-profile wire format (msgpack): the keys, canonical order, limits.

Owns: encoding a `Profile` to canonical msgpack bytes (sorted keys, sorted tensors, so equal
profiles give identical bytes whatever order their parts were given in), bounded decoding of
untrusted bytes, atomic `save`, and `load` (which also runs every check in `check`).
Must not know: torch, how profiles are compiled or installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgpack

from flextensor_runtime.atomic_file import write_atomic
from flextensor_runtime.errors import (
    BudgetError,
    ProfileError,
    ProfileFormatError,
    ProfileVersionError,
)
from flextensor_runtime.profile.check import check_profile
from flextensor_runtime.profile.fields import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_STR,
    MIN_RATE,
    READ_FIX,
    Reader,
    read_section,
)
from flextensor_runtime.profile.schema import (
    FORMAT,
    PLACEMENTS,
    TENSOR_KINDS,
    TRAP_KINDS,
    VERSION,
    BandwidthPoint,
    Block,
    DeviceSpec,
    Meta,
    ModelFingerprint,
    PlanConfig,
    Predicted,
    Profile,
    TensorEntry,
    Transfer,
    Trap,
)

__all__ = ["MAX_FILE_BYTES", "dumps", "load", "loads", "save", "to_document"]

MAX_FILE_BYTES = 256 << 20  # no real profile comes close; larger files are rejected unread
_CORE_KEYS = frozenset(
    {"format", "version", "meta", "model", "device", "config", "traps", "untrapped", "blocks",
     "schedule", "predicted"}
)  # fmt: skip


def _tensor_doc(t: TensorEntry) -> dict[str, Any]:
    """A tensor entry as `_canonical` would give it (keys sorted, lists): built so, since a
    large model's profile holds tens of thousands."""
    return {
        "block": t.block, "bytes": t.bytes, "dtype": t.dtype, "kind": t.kind, "name": t.name,
        "offset": t.offset, "placement": t.placement, "shape": list(t.shape),
        "stride": list(t.stride), "tie": t.tie,
    }  # fmt: skip


def _tensor_docs(tensors: tuple[TensorEntry, ...]) -> list[dict[str, Any]]:
    return [_tensor_doc(x) for x in sorted(tensors, key=lambda x: x.name)]


def _canonical(obj: Any) -> Any:
    """Sort map keys recursively and turn tuples into lists, so encoding is order-independent."""
    if isinstance(obj, Mapping):
        return {str(k): _canonical(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return obj


def to_document(profile: Profile) -> dict[str, Any]:
    """The profile as plain msgpack-able data, in canonical order (the traps and tensors are
    built in it; `_canonical` orders the rest)."""
    p = profile
    doc: dict[str, Any] = dict(p.extensions)
    doc.update({
        "format": FORMAT,
        "version": VERSION,
        "meta": vars(p.meta),
        "model": vars(p.model),
        "device": {**vars(p.device), "bandwidth_curve": [vars(b) for b in p.device.bandwidth_curve]},
        "config": vars(p.config),
        "blocks": [vars(b) for b in sorted(p.blocks, key=lambda b: b.id)],
        "schedule": [vars(s) for s in sorted(p.schedule, key=lambda s: (s.trap, s.block))],
        "predicted": vars(p.predicted),
    })  # fmt: skip
    for key in ("traps", "untrapped"):
        doc.pop(key, None)
    canonical = _canonical(doc)
    canonical["traps"] = [
        {"calls": t.calls, "compute_ms": float(t.compute_ms), "kind": t.kind, "name": t.name,
         "tensors": _tensor_docs(t.tensors)}
        for t in p.traps
    ]  # fmt: skip
    canonical["untrapped"] = _tensor_docs(p.untrapped)
    return {k: canonical[k] for k in sorted(canonical)}


def dumps(profile: Profile) -> bytes:
    """Encode a profile to canonical msgpack bytes (validated first)."""
    check_profile(profile)
    data = msgpack.packb(to_document(profile), use_bin_type=True)
    _check_readable(data)
    return data


def _check_readable(data: bytes) -> None:
    """Every field is in the range `loads` accepts (sums of in-range measurements need not be),
    so nothing is written that cannot be read back."""
    try:
        _parse_sections(Reader(msgpack.unpackb(data, raw=False), ""))
    except ProfileFormatError as exc:
        cause = str(exc).removesuffix(f"; {READ_FIX}")
        raise ProfileFormatError(
            f"cannot write this profile, {cause}; the measurements or options it was planned "
            "from are out of range (e.g. huge compute_ms, calls or h2d_latency_ms in the "
            "stats): fix them and plan again"
        ) from None


def _tensor(r: Reader) -> TensorEntry:
    spec = {
        "name": lambda x: x.as_str(),
        "bytes": lambda x: x.as_int(),
        "dtype": lambda x: x.as_str(),
        "shape": lambda x: x.as_ints(),
        "stride": lambda x: x.as_ints(),
        "placement": lambda x: x.as_str(PLACEMENTS),
        "block": lambda x: x.optional(lambda y: y.as_int(0, MAX_COUNT)),
        "offset": lambda x: x.optional(lambda y: y.as_int()),
        "tie": lambda x: x.optional(lambda y: y.as_str()),
        "kind": lambda x: x.as_str(TENSOR_KINDS),
    }
    return TensorEntry(**read_section(r, spec))


_TENSOR_KEYS = frozenset(
    ("name", "bytes", "dtype", "shape", "stride", "placement", "block", "offset", "tie", "kind")
)


def _tensors(r: Reader) -> tuple[TensorEntry, ...]:
    """A list of tensor entries: each read by `_plain_tensor` while all are well formed (a large
    model's profile holds tens of thousands), else by `_tensor`, whose error names the field."""
    docs = r.value
    if isinstance(docs, list):
        out = []
        for doc in docs:
            entry = _plain_tensor(doc)
            if entry is None:
                break
            out.append(entry)
        else:
            return tuple(out)
    return tuple(_tensor(x) for x in r.as_list())


def _plain_tensor(d: Any) -> TensorEntry | None:
    """`_tensor` of a well-formed entry with the same checks done inline (plain ints, strs and
    lists, as msgpack decodes them); None for anything else, which `_tensor` then reads."""
    if type(d) is not dict or d.keys() != _TENSOR_KEYS:
        return None
    name, nbytes, dtype, shape, stride = d["name"], d["bytes"], d["dtype"], d["shape"], d["stride"]
    block, offset, tie = d["block"], d["offset"], d["tie"]
    if not (
        type(name) is str and len(name) <= MAX_STR and type(dtype) is str
        and len(dtype) <= MAX_STR and type(nbytes) is int and 0 <= nbytes <= MAX_BYTES
        and d["placement"] in PLACEMENTS and d["kind"] in TENSOR_KINDS
        and type(d["placement"]) is str and type(d["kind"]) is str
        and (block is None or (type(block) is int and 0 <= block <= MAX_COUNT))
        and (offset is None or (type(offset) is int and 0 <= offset <= MAX_BYTES))
        and (tie is None or (type(tie) is str and len(tie) <= MAX_STR))
        and type(shape) is list and type(stride) is list
        and all(type(v) is int and 0 <= v <= MAX_BYTES for v in shape)
        and all(type(v) is int and 0 <= v <= MAX_BYTES for v in stride)
    ):  # fmt: skip
        return None
    return TensorEntry(name, nbytes, dtype, tuple(shape), tuple(stride), d["placement"], block,
                       offset, tie, d["kind"])  # fmt: skip


def _trap(r: Reader) -> Trap:
    spec = {
        "name": lambda x: x.as_str(),
        "kind": lambda x: x.as_str(TRAP_KINDS),
        "compute_ms": lambda x: x.as_float(),
        "calls": lambda x: x.as_int(1, MAX_COUNT),
        "tensors": _tensors,
    }
    return Trap(**read_section(r, spec))


def _curve_point(r: Reader) -> BandwidthPoint:
    spec = {"bytes": lambda x: x.as_int(), "bytes_per_s": lambda x: x.as_float(MIN_RATE)}
    return BandwidthPoint(**read_section(r, spec))


_SECTIONS: Mapping[str, Callable[[Reader], Any]] = {
    "meta": lambda r: Meta(**read_section(r, {
        "tool_version": lambda x: x.as_str(), "torch_version": lambda x: x.as_str(),
        "command": lambda x: x.as_str(max_len=65536), "timing_source": lambda x: x.as_str(),
    })),
    "model": lambda r: ModelFingerprint(**read_section(r, {
        "digest": lambda x: x.as_str(), "tensor_count": lambda x: x.as_int(0, MAX_COUNT),
        "total_bytes": lambda x: x.as_int(),
    })),
    "device": lambda r: DeviceSpec(**read_section(r, {
        "name": lambda x: x.as_str(), "memory_bytes": lambda x: x.as_int(),
        "h2d_bytes_per_s": lambda x: x.as_float(MIN_RATE), "h2d_latency_ms": lambda x: x.as_float(),
        "bandwidth_curve": lambda x: tuple(_curve_point(p) for p in x.as_list()),
        "kind": lambda x: x.as_str(),
    })),
    "config": lambda r: PlanConfig(**read_section(r, {
        "include_patterns": lambda x: x.as_strs(), "exclude_patterns": lambda x: x.as_strs(),
        "budget_bytes": lambda x: x.optional(lambda y: y.as_int()),
        "mem_fraction": lambda x: x.optional(lambda y: y.as_float(0.0, 1.0)),
        "transfer_budget_scale": lambda x: x.as_float(), "strategy": lambda x: x.as_str(),
        "assignment": lambda x: x.as_str(), "release": lambda x: x.as_str(),
        "transfer_mode": lambda x: x.as_str(),
        "num_blocks": lambda x: x.optional(lambda y: y.as_int(0, MAX_COUNT)),
        "min_blocks": lambda x: x.as_int(0, MAX_COUNT), "pinned_memory": lambda x: x.as_bool(),
        "activation_reserve_bytes": lambda x: x.as_int(), "seed": lambda x: x.as_int(0, 2**63),
    })),
    "traps": lambda r: tuple(_trap(x) for x in r.as_list()),
    "untrapped": _tensors,
    "blocks": lambda r: tuple(
        Block(**read_section(x, {"id": lambda y: y.as_int(0, MAX_COUNT), "bytes": lambda y: y.as_int()}))
        for x in r.as_list()
    ),
    "schedule": lambda r: tuple(
        Transfer(**read_section(x, {
            k: (lambda y: y.as_int()) for k in ("offset", "bytes")
        } | {k: (lambda y: y.as_int(0, MAX_COUNT)) for k in
             ("trap", "block", "issue_at", "release_after")}))
        for x in r.as_list()
    ),
    "predicted": lambda r: Predicted(**read_section(r, {
        "compute_ms": lambda x: x.as_float(), "makespan_ms": lambda x: x.as_float(),
        "stall_ms": lambda x: x.as_float(), "peak_bytes": lambda x: x.as_int(),
        "resident_bytes": lambda x: x.as_int(), "streamed_bytes": lambda x: x.as_int(),
        "trap_stall_ms": lambda x: tuple(p.as_float() for p in x.as_list()),
    })),
}  # fmt: skip


def unpack_bounded(data: bytes) -> Any:
    """Decode msgpack bytes with limits, so hostile input cannot exhaust memory or time."""
    if not data:
        raise ProfileFormatError("the file is empty; compile a profile with `ftc profile`")
    if len(data) > MAX_FILE_BYTES:
        raise ProfileFormatError(
            f"{len(data)} bytes is larger than any offload profile ({MAX_FILE_BYTES} at most)"
        )
    n = len(data)
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=n, max_bin_len=n, max_array_len=n, max_map_len=n // 2, max_ext_len=0,
        )  # fmt: skip
    except msgpack.ExtraData as extra:
        if not isinstance(extra.unpacked, dict):  # random bytes decode as a small value first
            raise ProfileFormatError(
                "not an offload profile: the bytes are not one msgpack map (random or other "
                "data); pass a file written by `ftc profile`"
            ) from None
        raise ProfileFormatError(
            "the file has trailing bytes after the profile; it is damaged, recompile it"
        ) from None
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        cause = str(exc).split("\n")[0][:80] or type(exc).__name__
        raise ProfileFormatError(
            f"not a readable offload profile (msgpack: {cause}); the file is truncated or "
            "damaged, recompile it with `ftc profile`"
        ) from None


def _check_header(raw: Any) -> None:
    if not isinstance(raw, dict):
        raise ProfileFormatError(
            f"not an offload profile: the top level is a msgpack {type(raw).__name__}, not a map; "
            "pass a file written by `ftc profile`"
        )
    fmt = raw.get("format")
    if fmt != FORMAT:
        shown = repr(fmt)[:40]
        raise ProfileFormatError(
            f"not an offload profile: format is {shown}, expected {FORMAT!r}; "
            "pass a file written by `ftc profile`"
        )
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProfileFormatError(f"profile field 'version' must be an integer, got {version!r:.40}")
    if version != VERSION:
        hint = (
            "recompile it with this ftc (`ftc profile` or `ftc plan`)"
            if version < VERSION
            else "upgrade flextensor-compiler to read it, or recompile it with this ftc"
        )
        raise ProfileVersionError(
            f"profile format version {version} is not supported (this reader reads version "
            f"{VERSION}); {hint}"
        )


def loads(data: bytes) -> Profile:
    """Decode and validate profile bytes; any problem raises a one-line `ProfileError`."""
    raw = unpack_bounded(data)
    _check_header(raw)
    profile = _parse_sections(Reader(raw, ""))
    check_profile(profile)
    return profile


def _parse_sections(root: Reader) -> Profile:
    raw = root.as_map()
    parts = {key: parse(root.child(key)) if key in raw else _missing(key)
             for key, parse in _SECTIONS.items()}  # fmt: skip
    extensions = {k: v for k, v in raw.items() if k not in _CORE_KEYS}
    return Profile(**parts, extensions=extensions)


def _missing(key: str) -> Any:
    raise ProfileFormatError(
        f"profile lacks section {key!r}; the file is damaged or was not written by ftc, "
        "recompile it with `ftc profile`"
    )


def save(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Write the profile atomically: a temp file in the same folder, fsync, then rename."""
    return write_atomic(path, dumps(profile))


def load(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file; errors name the file and the problem in one line."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ProfileFormatError(
                f"{p}: {size} bytes is larger than any offload profile ({MAX_FILE_BYTES} bytes "
                "at most); pass the .msgpack file written by `ftc profile`"
            )
        data = p.read_bytes()
    except FileNotFoundError:
        raise ProfileFormatError(f"{p}: no such file; compile one with `ftc profile`") from None
    except IsADirectoryError:
        raise ProfileFormatError(
            f"{p}: is a folder, not a profile file; pass the .msgpack file `ftc profile` wrote"
        ) from None
    except PermissionError:
        raise ProfileFormatError(f"{p}: permission denied; check the file's mode") from None
    try:
        return loads(data)
    except (ProfileError, BudgetError) as exc:
        raise type(exc)(f"{p}: {exc}") from None
