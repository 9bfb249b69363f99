"""The stable JSON document `ftc inspect --json` prints, built from a loaded profile.

Owns: the names and meaning of the inspect document's fields (docs/profile-format.md lists them).
Must not know: rendering (rich), torch, how the profile was compiled.
"""

from __future__ import annotations

from typing import Any

from flextensor_runtime.profile import Profile, Trap

__all__ = ["inspect_document", "trap_bytes"]


def trap_bytes(trap: Trap) -> tuple[int, int, int]:
    """(resident, streamed, disk) bytes a trap owns; tied aliases are counted once (not here)."""
    resident = streamed = disk = 0
    for t in trap.tensors:
        if t.tie is not None:
            continue
        if t.placement == "resident":
            resident += t.bytes
        elif t.placement == "streamed":
            streamed += t.bytes
        else:
            disk += t.bytes
    return resident, streamed, disk


def _traps(profile: Profile) -> list[dict[str, Any]]:
    stalls = profile.predicted.trap_stall_ms
    rows = []
    for order, trap in enumerate(profile.traps):
        resident, streamed, disk = trap_bytes(trap)
        transfers = profile.transfers_for(order)  # in issue order; the first one is summarised
        transfer = transfers[0] if transfers else None
        rows.append({
            "name": trap.name, "order": order, "kind": trap.kind, "compute_ms": trap.compute_ms,
            "calls": trap.calls, "resident_bytes": resident, "streamed_bytes": streamed + disk,
            "disk_bytes": disk, "tensor_count": len(trap.tensors),
            "block": transfer.block if transfer else None,
            "prefetch_at": transfer.issue_at if transfer else None,
            "release_after": transfer.release_after if transfer else None,
            "stall_ms": stalls[order] if stalls else None,
            "transfers": [{"block": t.block, "offset": t.offset, "bytes": t.bytes,
                           "issue_at": t.issue_at, "release_after": t.release_after}
                          for t in transfers],
        })  # fmt: skip
    return rows


def inspect_document(profile: Profile) -> dict[str, Any]:
    """The inspect document: the fields listed in docs/profile-format.md, stable across versions."""
    p = profile
    untrapped = sum(t.bytes for t in p.untrapped if t.tie is None)
    disk = sum(t.bytes for t in p.all_tensors() if t.placement == "disk" and t.tie is None)
    blocks_bytes = sum(b.bytes for b in p.blocks)
    pred = p.predicted
    return {
        "format": "flextensor-profile",
        "version": p.version,
        "meta": vars(p.meta),
        "model": vars(p.model),
        "device": {
            "name": p.device.name,
            "kind": p.device.kind,
            "memory_bytes": p.device.memory_bytes,
            "h2d_bytes_per_s": p.device.h2d_bytes_per_s,
            "h2d_latency_ms": p.device.h2d_latency_ms,
        },
        "budget_bytes": p.config.budget_bytes,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(p.config).items()},
        "totals": {
            "resident_bytes": pred.resident_bytes,
            "streamed_bytes": pred.streamed_bytes,
            "disk_bytes": disk,
            "untrapped_bytes": untrapped,
            "blocks_bytes": blocks_bytes,
            "trap_count": len(p.traps),
            "transfer_count": len(p.schedule),
        },
        "blocks": [{"id": b.id, "bytes": b.bytes} for b in sorted(p.blocks, key=lambda b: b.id)],
        "traps": _traps(p),
        "predicted": {
            "compute_ms": pred.compute_ms,
            "makespan_ms": pred.makespan_ms,
            "stall_ms": pred.stall_ms,
            "peak_bytes": pred.peak_bytes,
            "overhead": (pred.makespan_ms / pred.compute_ms - 1.0) if pred.compute_ms else 0.0,
        },
        "extensions": sorted(p.extensions),
    }
