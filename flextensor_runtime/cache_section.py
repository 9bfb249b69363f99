"""The optional `caches` section of an offload profile, and installing what it describes.

Owns nothing itself: it is the public home of the section's data types and functions
(defined in `cache_config`) and of the installer (defined in `cache_install`).

A section is plain msgpack data, e.g.
    {"module": "transformer", "policy": "fixed-step", "skip_steps": [3, 5, 7], "dense_last": 2}
    {"module": "transformer", "policy": "adaptive-residual", "threshold": 0.1,
     "signal": "hidden_states"}
Build one from a CLI string with `parse_cache_spec("fixed-step:module=transformer;skip=2-18/2")`
or from keywords with `parse_cache_section({...})`; write it with `cache_section_to_data`.
Deployment: `installation = install_cache(model, section)`, then per denoising step
`installation.set_step(i, n)` (or `with installation.step(i, n): ...`) before calling the model;
`installation.report()` shows hits, misses and reasons; `installation.remove()` undoes it.
Must not know: the rest of the profile format or how offloading is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextensor_runtime.cache_config import (
    POLICIES,
    AdaptiveResidualPolicy,
    CacheSection,
    FixedStepPolicy,
    cache_section_to_data,
    parse_cache_section,
    parse_cache_spec,
)
from flextensor_runtime.cache_install import CacheInstallation, CacheReport, install_cache

__all__ = [
    "POLICIES",
    "SECTION_KEY",
    "AdaptiveResidualPolicy",
    "CacheInstallation",
    "CacheReport",
    "CacheSection",
    "FixedStepPolicy",
    "cache_section_from_extensions",
    "cache_section_to_data",
    "install_cache",
    "parse_cache_section",
    "parse_cache_spec",
]

SECTION_KEY = "caches"  # the profile's top-level extension key


def cache_section_from_extensions(extensions: Mapping[str, Any]) -> CacheSection | None:
    """The parsed `caches` section of a profile's `extensions`, or None when it has none."""
    if SECTION_KEY not in extensions:
        return None
    return parse_cache_section(extensions[SECTION_KEY])
