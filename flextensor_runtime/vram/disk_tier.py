"""Planning the disk tier: which tensors are DiskMap-backed so host memory fits its budget.

Owns: the rule of `plan_disk_tier`. Pure and torch-free (the compiler calls it).
Must not know: torch, files, wrappers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flextensor_runtime.errors import ConfigError

__all__ = ["plan_disk_tier"]


def _check(tensor_sizes: Mapping[str, int], host_budget_bytes: int, order: Sequence[str]) -> None:
    if isinstance(host_budget_bytes, bool) or not isinstance(host_budget_bytes, int):
        raise ConfigError(f"host_budget_bytes={host_budget_bytes!r} is not an int: pass bytes")
    if host_budget_bytes < 0:
        raise ConfigError(f"host_budget_bytes={host_budget_bytes} is negative: pass 0 or more")
    for name, size in tensor_sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"tensor {name!r} has size {size!r}: sizes are byte counts >= 0")
    seen: set[str] = set()
    for name in order:
        if name not in tensor_sizes:
            raise ConfigError(f"order names {name!r}, which has no size: list only sized tensors")
        if name in seen:
            raise ConfigError(f"order lists {name!r} twice: give each tensor once")
        seen.add(name)


def plan_disk_tier(
    tensor_sizes: Mapping[str, int], host_budget_bytes: int, order: Sequence[str]
) -> set[str]:
    """Return the tensors to keep on disk so the rest fits in `host_budget_bytes`.

    Rule (first fit in execution order): walk `order` (tensors it omits follow, sorted by
    name); a tensor stays in host memory when it fits in what is left of the budget, otherwise
    it goes to disk. Early tensors are host-resident, so the first modules of a forward start
    without disk reads while later disk reads overlap earlier compute. Deterministic.
    """
    _check(tensor_sizes, host_budget_bytes, order)
    listed = set(order)
    walk = list(order) + sorted(name for name in tensor_sizes if name not in listed)
    left = host_budget_bytes
    disk: set[str] = set()
    for name in walk:
        size = tensor_sizes[name]
        if size <= left:
            left -= size
        else:
            disk.add(name)
    return disk
