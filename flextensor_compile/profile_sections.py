"""The optional sections `ftc profile` writes next to the plan: `caches` and `vram`.

Owns: reading the section options of an `OffloadConfig` (`cache_spec`, `vram_spec`,
`host_memory_bytes`, `vram_checkpoint`) into parsed sections, checking them against the model
and the plan, the disk-tier rule for `--host-memory`, and adding the sections' data to a
profile's `extensions`. A profile without these options is returned unchanged (same bytes).
Must not know: the CLI, how sections are installed at deployment (only which modules a vram
section wraps, through the runtime's `section_targets`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from torch import nn

from flextensor_compile.config import OffloadConfig
from flextensor_compile.stats import Stats
from flextensor_runtime.cache_section import (
    CacheSection,
    cache_section_to_data,
    parse_cache_section,
    parse_cache_spec,
)
from flextensor_runtime.counts import count_of
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import Profile
from flextensor_runtime.vram.section_deploy import (
    SectionTargets,
    section_targets,
    streamed_tensor_names,
)
from flextensor_runtime.vram.vram_section import (
    VramSection,
    parse_vram_spec,
    plan_disk_tier,
    vram_section_to_data,
)

__all__ = ["SectionOptions", "add_sections", "plan_host_disk_tier", "section_options"]


@dataclass(frozen=True)
class SectionOptions:
    """The parsed section options of one compilation (None: no such section)."""

    cache: CacheSection | None = None
    vram: VramSection | None = None
    host_memory_bytes: int | None = None

    @property
    def empty(self) -> bool:
        return self.cache is None and self.vram is None


def section_options(config: OffloadConfig) -> SectionOptions:
    """Parse the specs (fails fast, before any model is built or run)."""
    cache = None
    if config.cache_spec is not None:
        cache = parse_cache_section(parse_cache_spec(config.cache_spec))
    vram = parse_vram_spec(config.vram_spec) if config.vram_spec is not None else None
    if vram is not None and config.vram_checkpoint is not None:
        if vram.checkpoint is not None and vram.checkpoint != config.vram_checkpoint:
            raise ConfigError(
                f"--checkpoint {config.vram_checkpoint!r} differs from the --vram spec's "
                f"checkpoint={vram.checkpoint!r}: give the checkpoint once"
            )
        vram = replace(vram, checkpoint=config.vram_checkpoint)
    return SectionOptions(cache, vram, config.host_memory_bytes)


def _group_order(stats: Stats, targets: SectionTargets) -> list[str]:
    """Wrapped modules in execution order: by the first of their tensors in the stats (traps
    in execution order, then untrapped tensors); ties by name."""
    position: dict[str, int] = {}
    for trap in stats.traps:
        for t in trap.tensors:
            position.setdefault(t.name, len(position))
    for t in stats.untrapped:
        position.setdefault(t.name, len(position))
    first = {
        name: min((position.get(k, len(position)) for k in keys), default=len(position))
        for name, keys in targets.wrapped.items()
    }
    return sorted(first, key=lambda name: (first[name], name))


def plan_host_disk_tier(
    profile: Profile, stats: Stats, targets: SectionTargets, host_memory_bytes: int
) -> tuple[str, ...]:
    """The checkpoint keys to serve from disk so host memory fits `host_memory_bytes`.

    Rule: host memory first holds the plan's streamed bytes (pinned, read every iteration);
    what is left is filled by the wrapped modules, whole, first fit in execution order; a module
    that does not fit in what is left goes to disk.
    """
    streamed = profile.predicted.streamed_bytes
    left = host_memory_bytes - streamed
    if left < 0:
        raise ConfigError(
            f"--host-memory {host_memory_bytes} is below the plan's {streamed} streamed bytes, "
            f"which stay in pinned host memory: raise --host-memory to at least {streamed} or "
            "the device budget"
        )
    size = {t.name: t.bytes for trap in stats.traps for t in trap.tensors}
    size.update((t.name, t.bytes) for t in stats.untrapped)
    groups = {name: sum(size.get(k, 0) for k in keys) for name, keys in targets.wrapped.items()}
    disk = plan_disk_tier(groups, left, _group_order(stats, targets))
    return tuple(sorted(k for name in disk for k in targets.wrapped[name]))


def _vram_section(
    profile: Profile, stats: Stats, model: nn.Module, options: SectionOptions
) -> VramSection:
    section = options.vram
    assert section is not None
    targets = section_targets(model, section, streamed_tensor_names(profile.all_tensors()))
    if not targets.wrapped:
        skipped = (
            f" ({count_of(len(targets.skipped), 'matching module')} streamed)"
            if targets.skipped
            else ""
        )
        raise ConfigError(
            f"--vram wraps no module of {type(model).__name__}{skipped}: map classes of modules "
            "the plan keeps resident, or give the device a larger budget"
        )
    if options.host_memory_bytes is None:
        return section
    disk = plan_host_disk_tier(profile, stats, targets, options.host_memory_bytes)
    if disk and section.checkpoint is None:
        raise ConfigError(
            f"--host-memory {options.host_memory_bytes} puts {count_of(len(disk), 'tensor')} on disk but "
            f"no checkpoint serves {'it' if len(disk) == 1 else 'them'}: pass --checkpoint "
            "model.safetensors"
        )
    if disk and not os.path.exists(str(section.checkpoint)):
        raise ConfigError(
            f"--checkpoint {section.checkpoint!r} does not exist: pass the model's safetensors "
            "file (or its index.json)"
        )
    return replace(section, disk_tensors=disk)


def _check_cache_module(model: nn.Module, section: CacheSection) -> None:
    try:
        model.get_submodule(section.module)
    except AttributeError:
        raise ConfigError(
            f"--cache module {section.module!r} is not a module of {type(model).__name__}: "
            "give a dotted module path such as 'transformer' ('' for the model itself)"
        ) from None


def add_sections(
    profile: Profile, stats: Stats, model: nn.Module, options: SectionOptions
) -> Profile:
    """The profile with the requested sections in its `extensions` (unchanged when none)."""
    if options.empty:
        return profile
    extensions: dict[str, object] = dict(profile.extensions)
    if options.cache is not None:
        _check_cache_module(model, options.cache)
        extensions["caches"] = cache_section_to_data(options.cache)
    if options.vram is not None:
        extensions["vram"] = vram_section_to_data(_vram_section(profile, stats, model, options))
    return replace(profile, extensions=extensions)
