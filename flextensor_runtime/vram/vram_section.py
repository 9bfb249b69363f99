"""The optional `vram` section of an offload profile: which wrappers a deployment installs.

Owns: the `VramSection` dataclass, its plain-data form (what the profile stores under the
top-level key "vram"), validation with one-line `ConfigError`s, and `install_vram_section`.
Importing this module does not import torch (the compiler writes sections); only
`install_vram_section` does.
Must not know: the rest of the profile wire format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.vram.disk_tier import plan_disk_tier

__all__ = [
    "SECTION_KEY",
    "WRAPPER_NAMES",
    "VramSection",
    "install_vram_section",
    "parse_vram_section",
    "parse_vram_spec",
    "plan_disk_tier",
    "vram_section_from_extensions",
    "vram_section_to_data",
]

SECTION_KEY = "vram"
WRAPPER_NAMES = ("AutoWrappedLinear", "AutoWrappedModule", "AutoWrappedNonRecurseModule")
STAGE_KEYS = tuple(
    f"{stage}_{part}"
    for stage in ("offload", "onload", "preparing", "computation")
    for part in ("dtype", "device")
)
DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)  # fmt: skip
_DEVICE = re.compile(r"^(cpu|disk|meta|(cuda|xpu|npu|mps)(:\d+)?)$")
_KEYS = ("module_map", "vram_config", "vram_limit_gib", "disk_tensors", "checkpoint")


@dataclass(frozen=True)
class VramSection:
    """What to wrap and where its weights live.

    module_map: (module class name, wrapper name) pairs; the first matching pair wins.
    vram_config: (placement key, dtype name or device) pairs, e.g. ("offload_device", "cpu").
    vram_limit_gib: the wrappers' `vram_limit`; None never promotes.
    disk_tensors: checkpoint keys served from disk; checkpoint: the file a DiskMap reads them
    from (a path, relative to the working directory).
    """

    module_map: tuple[tuple[str, str], ...]
    vram_config: tuple[tuple[str, str], ...]
    vram_limit_gib: float | None = None
    disk_tensors: tuple[str, ...] = ()
    checkpoint: str | None = None


def _bad(what: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"vram section: {what} {value!r} is invalid: {fix}")


def _parse_module_map(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, (list, tuple)) or not raw:
        raise _bad("module_map", raw, "give a non-empty list of [class name, wrapper name]")
    pairs = []
    for item in raw:
        ok = isinstance(item, (list, tuple)) and len(item) == 2
        if not ok or not all(isinstance(s, str) and s for s in item):
            raise _bad("module_map entry", item, "use [class name, wrapper name]")
        if item[1] not in WRAPPER_NAMES:
            raise _bad("wrapper", item[1], f"use one of {list(WRAPPER_NAMES)}")
        pairs.append((item[0], item[1]))
    return tuple(pairs)


def _parse_config(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise _bad("vram_config", raw, "give a map of placement keys to dtype or device names")
    pairs = []
    for key in STAGE_KEYS:  # canonical order
        if key not in raw:
            continue
        value = raw[key]
        if key.endswith("_dtype") and value not in DTYPE_NAMES:
            raise _bad(key, value, f"use one of {list(DTYPE_NAMES)}")
        if key.endswith("_device") and not (isinstance(value, str) and _DEVICE.match(value)):
            raise _bad(key, value, "use 'cpu', 'cuda', 'cuda:N' or 'disk'")
        pairs.append((key, value))
    unknown = sorted(set(raw) - set(STAGE_KEYS), key=str)
    if unknown:
        raise _bad("vram_config key", unknown[0], f"use keys from {list(STAGE_KEYS)}")
    return tuple(pairs)


def _parse_limit(raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw > 0:
        raise _bad("vram_limit_gib", raw, "give a positive number of GiB or omit it")
    return float(raw)


def _parse_disk(raw: Any, checkpoint: Any) -> tuple[tuple[str, ...], str | None]:
    if not isinstance(raw, (list, tuple)) or not all(isinstance(s, str) for s in raw):
        raise _bad("disk_tensors", raw, "give a list of checkpoint tensor names")
    if len(set(raw)) != len(raw):
        raise _bad("disk_tensors", raw, "list each tensor once")
    if checkpoint is not None and not (isinstance(checkpoint, str) and checkpoint):
        raise _bad("checkpoint", checkpoint, "give the checkpoint path as a string")
    return tuple(raw), checkpoint


def parse_vram_section(data: Any) -> VramSection:
    """Validate the plain data stored under "vram" and return the section."""
    if not isinstance(data, Mapping):
        raise _bad("section", type(data).__name__, "store a map under the 'vram' key")
    unknown = sorted(set(data) - set(_KEYS), key=str)
    if unknown:
        raise _bad("key", unknown[0], f"use keys from {list(_KEYS)}")
    for key in ("module_map", "vram_config"):
        if key not in data:
            raise _bad("missing key", key, f"add {key}")
    disk, checkpoint = _parse_disk(data.get("disk_tensors", []), data.get("checkpoint"))
    return VramSection(
        module_map=_parse_module_map(data["module_map"]),
        vram_config=_parse_config(data["vram_config"]),
        vram_limit_gib=_parse_limit(data.get("vram_limit_gib")),
        disk_tensors=disk,
        checkpoint=checkpoint,
    )


def vram_section_to_data(section: VramSection) -> dict[str, Any]:
    """The plain (msgpack-ready) data of a section; `parse_vram_section` reads it back."""
    data: dict[str, Any] = {
        "module_map": [list(pair) for pair in section.module_map],
        "vram_config": dict(section.vram_config),
    }
    if section.vram_limit_gib is not None:
        data["vram_limit_gib"] = section.vram_limit_gib
    if section.disk_tensors:
        data["disk_tensors"] = list(section.disk_tensors)
    if section.checkpoint is not None:
        data["checkpoint"] = section.checkpoint
    parse_vram_section(data)  # what is written must read back
    return data


def vram_section_from_extensions(extensions: Mapping[str, Any]) -> VramSection | None:
    """The parsed `vram` section of a profile's `extensions`, or None when it has none."""
    if SECTION_KEY not in extensions:
        return None
    return parse_vram_section(extensions[SECTION_KEY])


_WRAPPER_ALIASES = {
    "linear": "AutoWrappedLinear",
    "module": "AutoWrappedModule",
    "nonrecurse": "AutoWrappedNonRecurseModule",
}


def _spec_items(text: str) -> dict[str, str]:
    items: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise _bad("--vram item", part, "write key=value items separated by ';'")
        if key.strip() in items:
            raise _bad("--vram key", key.strip(), "give each key once")
        items[key.strip()] = value.strip()
    return items


def _spec_map(text: str) -> list[list[str]]:
    pairs = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        cls, sep, wrapper = entry.partition(":")
        if not sep:
            raise _bad("--vram map entry", entry, "write Class:wrapper, e.g. Linear:linear")
        pairs.append([cls.strip(), _WRAPPER_ALIASES.get(wrapper.strip(), wrapper.strip())])
    return pairs


def parse_vram_spec(text: str) -> VramSection:
    """A section from the CLI form used by `ftc profile --vram`, e.g.

    "map=Linear:linear,LayerNorm:module;offload_device=cpu;computation_dtype=bfloat16;
    computation_device=cuda;vram_limit_gib=20"

    Wrappers are full names or the aliases linear, module, nonrecurse; every other key is a
    placement key of `vram_config`, `vram_limit_gib` or `checkpoint`.
    """
    items = _spec_items(text)
    data: dict[str, Any] = {"module_map": _spec_map(items.pop("map", ""))}
    if "vram_limit_gib" in items:
        raw = items.pop("vram_limit_gib")
        try:
            data["vram_limit_gib"] = float(raw)
        except ValueError:
            raise _bad("vram_limit_gib", raw, "give a number of GiB") from None
    if "checkpoint" in items:
        data["checkpoint"] = items.pop("checkpoint")
    data["vram_config"] = items
    return parse_vram_section(data)


def install_vram_section(model: Any, section: VramSection, disk_map: Any = None) -> Any:
    """Install the section's wrappers on `model` and return it (see `enable_vram_management`).

    A wrapper moves to the disk tier (offload and onload on disk) when every tensor it manages
    is in `disk_tensors`; `disk_map` defaults to a DiskMap over `checkpoint`.
    """
    from flextensor_runtime.vram.section_install import install

    return install(model, section, disk_map)
