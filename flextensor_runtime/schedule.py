"""The profile's schedule as the lookup tables the traps use at run time.

Owns: per transfer, the streamed tensors it carries; per trap, which transfers it reads (all its
own, plus those carrying the canonical tensors its tied tensors alias), which transfers it
issues on entry and in what order, which it releases, which block regions conflict
(overlapping bytes of one block), the cyclic prologue issued at install, and which gap traps
have no module and so run right after the trap before them ("virtual" gaps).
Must not know: torch, backends, models (it works on the profile's plain data).
"""

from __future__ import annotations

from dataclasses import dataclass

from flextensor_runtime.errors import InstallError
from flextensor_runtime.profile import Profile, TensorEntry, Transfer, occupied_slots

__all__ = ["Tables", "TransferPlan", "build_tables", "entry_issue_order"]


@dataclass(frozen=True)
class TransferPlan:
    """One transfer with its index in `Tables.transfers` and the tensors it carries."""

    index: int
    transfer: Transfer
    entries: tuple[TensorEntry, ...]  # streamed canonical tensors, offsets relative to the block
    conflicts: tuple[int, ...]  # transfers whose bytes overlap this one's in the same block


@dataclass(frozen=True)
class Tables:
    """Everything `Runtime.enter` / `exit` look up, indexed by trap order."""

    transfers: tuple[TransferPlan, ...]
    reads: tuple[tuple[int, ...], ...]
    issues: tuple[tuple[int, ...], ...]  # in `entry_issue_order`
    releases: tuple[tuple[int, ...], ...]
    prologue: tuple[int, ...]  # cyclic transfers in flight when an iteration starts
    virtual_after: tuple[tuple[int, ...], ...]  # gap traps without a module run at this exit


def _overlaps(a: Transfer, b: Transfer) -> bool:
    return a.block == b.block and a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _inside(e: TensorEntry, t: Transfer) -> bool:
    assert e.offset is not None  # streamed entries have offsets (check_profile)
    return e.block == t.block and t.offset <= e.offset and e.offset + e.bytes <= t.offset + t.bytes


def _reads(profile: Profile, schedule: list[Transfer], carrier: dict[str, int]) -> list[list[int]]:
    reads: list[list[int]] = [[] for _ in profile.traps]
    for k, t in enumerate(schedule):
        reads[t.trap].append(k)
    for order, trap in enumerate(profile.traps):
        for e in trap.tensors:
            if e.tie is None or e.placement == "resident":
                continue
            other = carrier.get(e.tie)
            if other is None:
                raise InstallError(
                    f"tied tensor {e.name!r} is streamed but {e.tie!r} has no transfer; "
                    "recompile the profile"
                )
            if other not in reads[order]:
                reads[order].append(other)
    return reads


def _check_reads_held(profile: Profile, reads: list[list[int]], plans: list[TransferPlan]) -> None:
    n = len(profile.traps)
    for order, indices in enumerate(reads):
        for k in indices:
            t = plans[k].transfer
            if order not in occupied_slots(t, n):
                raise InstallError(
                    f"trap {profile.traps[order].name!r} reads a transfer of trap {t.trap} "
                    f"outside its holding window ({t.issue_at}..{t.release_after}); recompile "
                    "the profile so the transfer is held until its last reader"
                )


def _virtual_after(n: int, virtual: set[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [() for _ in range(n)]
    real = [i for i in range(n) if i not in virtual]
    if not real:
        return out
    for pos, i in enumerate(real):
        nxt = real[(pos + 1) % len(real)]
        gaps = []
        j = (i + 1) % n
        while j != nxt:
            gaps.append(j)
            j = (j + 1) % n
        out[i] = tuple(gaps)
    return out


def entry_issue_order(schedule: list[Transfer], n_traps: int) -> list[list[int]]:
    """Per trap order, the indices of the copies issued at its entry, in the order they are
    issued: those of the trap itself first (on-entry copies), then by trap order cyclically
    after it, then by block and offset."""
    out: list[list[int]] = [[] for _ in range(n_traps)]
    for k, t in enumerate(schedule):
        out[t.issue_at].append(k)
    for at, mine in enumerate(out):
        mine.sort(key=lambda k: ((schedule[k].trap - at) % n_traps, schedule[k].block,
                                 schedule[k].offset))  # fmt: skip
    return out


def build_tables(profile: Profile, virtual: set[int]) -> Tables:
    """Tables for `profile`; `virtual` = orders of gap traps with no module. Conflicts follow
    the block layout in every mode (per-use copies are freed where a block would be reused)."""
    n = len(profile.traps)
    schedule = sorted(profile.schedule, key=lambda t: (t.trap, t.block, t.offset))
    plans = []
    carrier: dict[str, int] = {}
    for k, t in enumerate(schedule):
        entries = tuple(
            e for e in profile.traps[t.trap].tensors
            if e.placement != "resident" and e.tie is None and _inside(e, t)
        )  # fmt: skip
        carrier.update((e.name, k) for e in entries)
        conflicts = tuple(j for j, u in enumerate(schedule) if j != k and _overlaps(t, u))
        plans.append(TransferPlan(k, t, entries, conflicts))
    reads = _reads(profile, schedule, carrier)
    _check_reads_held(profile, reads, plans)
    releases: list[list[int]] = [[] for _ in range(n)]
    for k, t in enumerate(schedule):
        releases[t.release_after].append(k)
    cyclic = sorted((k for k, t in enumerate(schedule) if t.issue_at > t.trap),
                    key=lambda k: (schedule[k].issue_at, schedule[k].trap, schedule[k].block,
                                   schedule[k].offset))  # fmt: skip
    return Tables(
        transfers=tuple(plans),
        reads=tuple(tuple(r) for r in reads),
        issues=tuple(tuple(i) for i in entry_issue_order(schedule, n)),
        releases=tuple(tuple(r) for r in releases),
        prologue=tuple(cyclic),
        virtual_after=tuple(_virtual_after(n, virtual)),
    )
